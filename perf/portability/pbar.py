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

Memory-bound rows are held to the best plain copy the file records: its copy_one limit, or the
rate of its largest fused_copy row (a pair of Kokkos::deep_copy calls on arrays past any cache),
whichever is higher. Files written before kdist_portability measured deep_copy itself held them to
a copy kernel only, which on an H200 ran at half of cudaMemcpy's rate. An efficiency above 1 (a
cache-resident row beats the DRAM limit; a gemm-bound one beats a limit measured minutes earlier)
counts as 1, as P-bar's definition needs; the rows are listed on stderr.
"""
import argparse
import json
import sys


def harmonic(values):
    if not values or any(v <= 0 for v in values):
        return 0.0
    return len(values) / sum(1.0 / v for v in values)


def best_copy(rows):
    """The largest fused_copy row's rate (GB/s): deep_copy on arrays past any cache; 0 if none."""
    fused = [r for r in rows if r["kernel"] == "fused_copy"]
    return float(max(fused, key=lambda r: int(r["size"]))["achieved"]) if fused else 0.0


def efficiency(r, copy_scale, gemm_float):
    """The row's efficiency with its memory limit scaled by copy_scale (>= 1)."""
    limit = float(r["limit_value"])
    if r["limit"] == "copy_one":
        limit *= copy_scale
    elif r["limit"] == "roofline_float" and limit < gemm_float:  # on the roofline's memory side
        limit = min(gemm_float, limit * copy_scale)
    return float(r["achieved"]) / limit if limit > 0 else 0.0


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
        name = doc["context"]["platform"]
        mine = [r for r in doc["rows"] if "@" not in r["kernel"]]
        copy_rows = [r for r in mine if r["limit"] == "copy_one"]
        copy_limit = float(copy_rows[0]["limit_value"]) if copy_rows else 0.0
        gemm_rows = [r for r in mine if r["limit"] == "gemm_float"]
        gemm_float = float(gemm_rows[0]["limit_value"]) if gemm_rows else float("inf")
        scale = max(1.0, best_copy(mine) / copy_limit) if copy_limit > 0 else 1.0
        rows = {(r["kernel"], str(r["size"])): efficiency(r, scale, gemm_float) for r in mine}
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"pbar.py: {path} is not a kdist_portability --json file: {e}")
    left_out = len(doc["rows"]) - len(mine)
    if left_out:
        print(f"pbar.py: {path}: {left_out} rows of another space (kernel@space) left out", file=sys.stderr)
    if scale > 1:
        print(f"pbar.py: {path}: memory-bound rows held to its deep_copy rate, {scale:.2f}x its copy_one limit",
              file=sys.stderr)
    above = sorted(k for k, v in rows.items() if v > 1)
    if above:
        print(f"pbar.py: {path}: counted as 1 (above their limit): " + ", ".join(f"{k} {n}" for k, n in above),
              file=sys.stderr)
    return name, {k: min(v, 1.0) for k, v in rows.items()}


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
