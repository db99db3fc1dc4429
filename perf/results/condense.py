#!/usr/bin/env python3
"""Merge repeated runs of a kdist benchmark into one JSON: every row's per-run values and median.

    perf/results/condense.py --out STUDY.json --series NAME RUN.json [RUN.json ...] [--series ...]
                             [--note NAME TEXT]
    perf/results/condense.py --extract STUDY.json NAME K      # run K (1-based) as the bench wrote it

Each RUN.json is a benchmark's --json file ({"benchmark", "columns", "rows", "context"}, see
perf/common/bench_table.hpp); the runs of one series must come from the same benchmark with the same
columns and the same rows in the same order. A series keeps:
- "files": the runs' original file names, in run order (run2 before run10);
- "key": the leading columns that are equal in every run and hold no floating-point value (the
  size, e.g. bytes and tensors);
- "context": the context entries every run shares, "context_per_run" the others, one value a run;
- "rows": the key columns as they are, and for every other column {"median", "runs"}, where
  "runs" lists the values in file order and "median" is their median (the mean of the two middle
  values for an even count, as the benchmarks' own medians). A ratio column's median is the
  median of the per-run ratios, not a ratio of medians.
Nothing is dropped: --extract gives back each run's rows and context (up to key order).
"""
import argparse
import json
import os
import re
import statistics
import sys


def run_order(path):
    m = re.search(r"(\d+)\.json$", path)
    return (re.sub(r"\d+\.json$", "", path), int(m.group(1)) if m else 0)


def load(path):
    with open(path) as f:
        doc = json.load(f)
    for k in ("benchmark", "columns", "rows", "context"):
        if k not in doc:
            sys.exit(f"condense.py: {path} has no '{k}': not a benchmark --json file")
    return doc


def numeric(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def condense(name, paths):
    paths = sorted(paths, key=run_order)
    docs = [load(p) for p in paths]
    first = docs[0]
    for p, d in zip(paths, docs):
        if d["benchmark"] != first["benchmark"] or d["columns"] != first["columns"]:
            sys.exit(f"condense.py: {p} is not the same benchmark or columns as {paths[0]}")
        if len(d["rows"]) != len(first["rows"]):
            sys.exit(f"condense.py: {p} has {len(d['rows'])} rows, {paths[0]} {len(first['rows'])}")
    cols = first["columns"]
    key = []
    for c in cols:
        same = all(d["rows"][i].get(c) == r.get(c) for d in docs for i, r in enumerate(first["rows"]))
        if same and not any(isinstance(r.get(c), float) for r in first["rows"]):
            key.append(c)
        else:
            break
    if not key:  # the size column: a row of one run must be the same row in every other
        for d, p in zip(docs, paths):
            for i, r in enumerate(first["rows"]):
                if d["rows"][i].get(cols[0]) != r.get(cols[0]):
                    sys.exit(f"condense.py: row {i + 1} of {p} has {cols[0]} {d['rows'][i].get(cols[0])}, "
                             f"{paths[0]} {r.get(cols[0])}: the runs' rows do not line up")
        sys.exit(f"condense.py: the first column, {cols[0]}, holds floating-point values: no rows to line up by")
    rows = []
    for i, r0 in enumerate(first["rows"]):
        row = {c: r0[c] for c in key}
        for c in cols[len(key):]:
            vals = [d["rows"][i].get(c) for d in docs]
            entry = {"runs": vals}
            if all(numeric(v) for v in vals):
                entry = {"median": statistics.median(vals), "runs": vals}
            row[c] = entry
        rows.append(row)
    ctx_keys = []
    for d in docs:
        ctx_keys += [k for k in d["context"] if k not in ctx_keys]
    common, per_run = {}, {}
    for k in ctx_keys:
        vals = [d["context"].get(k) for d in docs]
        if all(k in d["context"] for d in docs) and all(v == vals[0] for v in vals):
            common[k] = vals[0]
        else:
            per_run[k] = vals
    return {
        "name": name,
        "benchmark": first["benchmark"],
        "files": [os.path.basename(p) for p in paths],
        "columns": cols,
        "key": key,
        "context": common,
        "context_per_run": per_run,
        "rows": rows,
    }


def extract(doc, name, k):
    for s in doc["series"]:
        if s["name"] != name:
            continue
        if not 1 <= k <= len(s["files"]):
            sys.exit(f"condense.py: series '{name}' has {len(s['files'])} runs")
        rows = []
        for r in s["rows"]:
            rows.append({c: (r[c] if c in s["key"] else r[c]["runs"][k - 1]) for c in s["columns"]})
        ctx = dict(s["context"])
        for c, vals in s["context_per_run"].items():
            if vals[k - 1] is not None:
                ctx[c] = vals[k - 1]
        return {"benchmark": s["benchmark"], "columns": s["columns"], "rows": rows, "context": ctx}
    sys.exit(f"condense.py: no series '{name}'")


def dump(doc):
    """Indented, with each row on one line, so a diff shows the rows that moved."""
    out = ["{"]
    top = list(doc.items())
    for i, (k, v) in enumerate(top):
        end = "," if i + 1 < len(top) else ""
        if k != "series":
            out.append(f" {json.dumps(k)}: {json.dumps(v)}{end}")
            continue
        out.append(' "series": [')
        for j, s in enumerate(v):
            out.append("  {")
            items = list(s.items())
            for m, (sk, sv) in enumerate(items):
                send = "," if m + 1 < len(items) else ""
                if sk == "rows":
                    out.append('   "rows": [')
                    for n, r in enumerate(sv):
                        out.append("    " + json.dumps(r) + ("," if n + 1 < len(sv) else ""))
                    out.append("   ]" + send)
                else:
                    out.append(f"   {json.dumps(sk)}: {json.dumps(sv, ensure_ascii=False)}{send}")
            out.append("  }" + ("," if j + 1 < len(v) else ""))
        out.append(" ]" + end)
    out.append("}")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--series", nargs="+", action="append", metavar=("NAME", "RUN"), default=[])
    ap.add_argument("--note", nargs=2, action="append", metavar=("NAME", "TEXT"), default=[])
    ap.add_argument("--extract", nargs=3, metavar=("STUDY", "NAME", "K"))
    args = ap.parse_args()
    if args.extract:
        with open(args.extract[0]) as f:
            doc = json.load(f)
        json.dump(extract(doc, args.extract[1], int(args.extract[2])), sys.stdout, indent=1)
        print()
        return
    if not args.out or not args.series:
        ap.error("--out and at least one --series NAME RUN.json are needed")
    notes = dict(args.note)
    series = []
    for s in args.series:
        if len(s) < 2:
            ap.error(f"--series {s[0]} names no run file")
        c = condense(s[0], s[1:])
        if s[0] in notes:
            c = {"name": c["name"], "note": notes[s[0]], **{k: v for k, v in c.items() if k != "name"}}
        series.append(c)
    with open(args.out, "w") as f:
        f.write(dump({"condensed_by": "perf/results/condense.py", "series": series}))


if __name__ == "__main__":
    main()
