#!/usr/bin/env python3
"""Pennycook's performance portability P-bar over platforms, from kdist_portability --json files.

    perf/portability/pbar.py PLATFORM.json [PLATFORM.json ...] [--json OUT]

For each kernel and size, the efficiency on each platform (achieved / that platform's measured
limit, as kdist_portability reports it) and P-bar = the harmonic mean of the efficiencies over the
platform set, 0 when any platform lacks the row (Pennycook, Sewall and Lee, 2016: an application
that does not run somewhere is not portable over a set that includes it). Then the P-bar of each
kernel over its sizes (the harmonic mean again). A platform is named by its file's "platform"
context; two files with the same name are an error. Rows of a second space in one file
("kernel@host": a CUDA build's host space) are another platform and are left out, with a note.
"""
import argparse
import json
import sys


def harmonic(values):
    if not values or any(v <= 0 for v in values):
        return 0.0
    return len(values) / sum(1.0 / v for v in values)


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
        name = doc["context"]["platform"]
        rows = {(r["kernel"], str(r["size"])): float(r["efficiency"]) for r in doc["rows"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"pbar.py: {path} is not a kdist_portability --json file: {e}")
    other = [k for k in rows if "@" in k[0]]
    if other:
        print(f"pbar.py: {path}: {len(other)} rows of another space (kernel@space) left out", file=sys.stderr)
    return name, {k: v for k, v in rows.items() if "@" not in k[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    platforms = []
    for path in args.files:
        name, rows = load(path)
        if any(name == p[0] for p in platforms):
            sys.exit(f"pbar.py: platform '{name}' appears twice ({path})")
        platforms.append((name, rows))
    keys = []
    for _, rows in platforms:
        keys += [k for k in rows if k not in keys]
    names = [p[0] for p in platforms]
    out = []
    print("| kernel | size | " + " | ".join(names) + " | P-bar |")
    print("|---|---|" + "---|" * len(names) + "---|")
    per_kernel = {}
    for kernel, size in keys:
        eff = [rows.get((kernel, size), 0.0) for _, rows in platforms]
        p = harmonic(eff)
        per_kernel.setdefault(kernel, []).append(p)
        out.append({"kernel": kernel, "size": size, "efficiency": dict(zip(names, eff)), "pbar": p})
        print(f"| {kernel} | {size} | " + " | ".join(f"{e:.3f}" for e in eff) + f" | {p:.3f} |")
    print()
    print("| kernel | P-bar over its sizes |")
    print("|---|---|")
    summary = {k: harmonic(v) for k, v in per_kernel.items()}
    for k, v in summary.items():
        print(f"| {k} | {v:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"platforms": names, "rows": out, "per_kernel": summary}, f, indent=1)


if __name__ == "__main__":
    main()
