#!/usr/bin/env python3
"""side_by_side.sh's table: one row per (model, optimizer) from the runs' JSON lines.

    summarise.py RESULTS.jsonl [--ranks 2] [--batch 64] [--steps 300] [--json FILE]

Columns: the row, the peer, the medians of images/s (peer, kdist), kdist / peer in each round,
and last the ratio of the medians ("-" where no peer ran).
"""
import argparse
import json
import statistics
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--json")
    args = p.parse_args()
    runs = [json.loads(line) for line in open(args.results) if line.strip()]
    keys = []
    for r in runs:
        if (r["model"], r["optimizer"]) not in keys:
            keys.append((r["model"], r["optimizer"]))
    rows = []
    for model, opt in keys:
        mine = [r for r in runs if (r["model"], r["optimizer"]) == (model, opt)]
        kdist = {r["round"]: r["images_per_second"] for r in mine if r["side"] == "kdist"}
        if not kdist:  # a run given up on after its peer's: nothing to compare yet
            continue
        peer = {r["round"]: r["images_per_second"] for r in mine if r["side"] == "peer"}
        names = [r["peer"] for r in mine if r["side"] == "peer"]
        row = {"model": model, "optimizer": opt, "peer": names[0] if names else None,
               "kdist_images_per_second": sorted(kdist.values()),
               "peer_images_per_second": sorted(peer.values()),
               "kdist_median": statistics.median(kdist.values()),
               "peer_median": statistics.median(peer.values()) if peer else None,
               "round_ratios": [kdist[k] / peer[k] for k in sorted(peer) if k in kdist]}
        row["ratio"] = row["kdist_median"] / row["peer_median"] if peer else None
        rows.append(row)
    print(f"# {args.ranks} ranks x {args.batch} images per rank, {args.steps} steps per run, "
          f"{max(r['round'] for r in runs)} interleaved rounds; images/s over all ranks, medians")
    header = ["row", "peer", "peer images/s", "kdist images/s", "kdist/peer per round", "kdist/peer"]
    lines = [header]
    for r in rows:
        lines.append([f"{r['model']} {r['optimizer']}", r["peer"] or "- (not run)",
                      f"{r['peer_median']:.0f}" if r["peer_median"] else "-", f"{r['kdist_median']:.0f}",
                      " ".join(f"{x:.2f}" for x in r["round_ratios"]) or "-",
                      f"{r['ratio']:.2f}" if r["ratio"] else "-"])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": args.ranks, "batch": args.batch, "steps": args.steps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
