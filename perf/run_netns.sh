#!/usr/bin/env bash
# Runs any MPI program on an emulated cluster link: RANKS ranks in a private network namespace
# talk TCP over a loopback rate-limited to RATE (tbf), so a wire and not the cores limits the
# bytes. Needs root (ip netns, tc). The namespace is torn down on every exit path: normal end,
# a failing program, Ctrl-C or kill (TERM).
#   usage: perf/run_netns.sh [-r RATE] [-n RANKS] PROGRAM [ARGS...]     (RATE: tc syntax)
#   e.g.   perf/run_netns.sh -r 4gbit -n 2 build/perf/bench_comm --part overlap
set -euo pipefail
usage() { sed -n '6,7p' "$0" | sed 's/^# *//' >&2; }
RATE=4gbit
RANKS=2
while getopts "r:n:h" opt; do
  case "$opt" in
    r) RATE=$OPTARG ;;
    n) RANKS=$OPTARG ;;
    *) usage; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 1 ]; then usage; exit 2; fi
if [ "$(id -u)" != 0 ]; then echo "run_netns.sh: needs root (network namespaces and tc)" >&2; exit 2; fi
NS="kdist-net-$$"
cleanup() { ip netns del "$NS" 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
ip netns add "$NS"
ip netns exec "$NS" ip link set lo up
# netem is not in this kernel (latency stays ~6 us); a tbf burst below ~1 MB stalls TCP.
ip netns exec "$NS" tc qdisc add dev lo root tbf rate "$RATE" burst 1mb latency 10ms
echo "run_netns.sh: $RANKS rank(s) over TCP on a loopback limited to $RATE (namespace $NS)" >&2
ip netns exec "$NS" env UCX_TLS=tcp,self MPIR_CVAR_NOLOCAL=1 OPENBLAS_NUM_THREADS=1 \
  mpiexec -n "$RANKS" "$@"
