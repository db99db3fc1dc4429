#!/usr/bin/env python3
"""Where a run's time went, from the Chrome trace a kdist program writes with --trace.

    perf/tools/trace_summary.py TRACE.json [--steps-from forward] [--json FILE]

One row per phase name and rank: how many times it ran, its total and mean milliseconds, and its
mean per step (steps = the number of times the --steps-from phase ran on that rank). A phase
that runs several times in a step (a K-FAC hook per layer) also gets one row per position within
its step, counted from the step's start ("kdist::kfac::factor A #1" is the second layer's, also
when factors run only every few steps), so a layer that dominates shows.
Phases nest (a hook runs inside forward): the rows are not meant to add up.
"""
import argparse
import bisect
import collections
import json
import sys


def load(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"trace_summary.py: {path} is not a JSON trace: {e}")
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def positions(events, step_starts):
    """Each event's place among the events of its name in its step (the last step start at or
    before it; events before the first step form a step of their own)."""
    seen = collections.Counter()
    out = []
    for e in events:
        step = bisect.bisect_right(step_starts, e["ts"])
        out.append(seen[step])
        seen[step] += 1
    return out


def summarise(events, steps_from):
    by_rank = collections.defaultdict(lambda: collections.defaultdict(list))
    for e in sorted(events, key=lambda e: e["ts"]):
        by_rank[e.get("pid", 0)][e["name"]].append(e)
    rows = []
    for rank, phases in sorted(by_rank.items()):
        step_starts = [e["ts"] for e in phases.get(steps_from, [])]
        steps = len(step_starts) or 1
        for name, evs in sorted(phases.items(), key=lambda kv: -sum(e["dur"] for e in kv[1])):
            ms = [e["dur"] / 1000.0 for e in evs]
            rows.append(row(rank, name, ms, steps))
            if name == steps_from:
                continue
            at = positions(evs, step_starts)
            if max(at) > 0:
                for k in range(max(at) + 1):
                    rows.append(row(rank, f"{name} #{k}", [m for m, a in zip(ms, at) if a == k], steps))
    return rows


def row(rank, name, ms, steps):
    total = sum(ms)
    return {"rank": rank, "phase": name, "count": len(ms), "total_ms": total, "mean_ms": total / len(ms),
            "per_step_ms": total / steps}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--steps-from", default="forward", help="the phase that runs once a step")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    rows = summarise(load(args.trace), args.steps_from)
    if not rows:
        sys.exit(f"trace_summary.py: no timed phases in {args.trace}")
    print(f"{'rank':>4}  {'phase':<48} {'count':>6} {'total ms':>10} {'mean ms':>9} {'ms/step':>9}")
    for r in rows:
        print(f"{r['rank']:>4}  {r['phase']:<48} {r['count']:>6} {r['total_ms']:>10.2f} {r['mean_ms']:>9.3f} "
              f"{r['per_step_ms']:>9.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
