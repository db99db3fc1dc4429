#!/usr/bin/env bash
# The overlap figure on the emulated cluster link (perf/run_netns.sh, 2 ranks, RATE or 4gbit).
#   usage: perf/run_netns_overlap.sh [build dir] [bench_comm args...]
set -euo pipefail
BUILD="${1:-build}"
shift || true
exec "$(dirname "$0")/run_netns.sh" -r "${RATE:-4gbit}" -n 2 "$BUILD/perf/bench_comm" --part overlap "$@"
