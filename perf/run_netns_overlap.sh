#!/usr/bin/env bash
# Overlap on an emulated cluster network: two ranks in a private network namespace talk TCP over
# a loopback rate-limited to RATE (tbf), so a wire and not the cores limits the bytes. Needs root.
# The namespace is always torn down.   usage: perf/run_netns_overlap.sh [build dir] [bench args...]
set -euo pipefail
BUILD="${1:-build}"
shift || true
RATE="${RATE:-4gbit}"
NS="kdist-net-$$"
cleanup() { ip netns del "$NS" 2>/dev/null || true; }
trap cleanup EXIT INT TERM
ip netns add "$NS"
ip netns exec "$NS" ip link set lo up
# netem is not in this kernel (latency stays ~6 us); a tbf burst below ~1 MB stalls TCP.
ip netns exec "$NS" tc qdisc add dev lo root tbf rate "$RATE" burst 1mb latency 10ms
ip netns exec "$NS" env UCX_TLS=tcp,self MPIR_CVAR_NOLOCAL=1 OPENBLAS_NUM_THREADS=1 \
  mpiexec -n 2 "$BUILD/perf/bench_comm" --part overlap "$@"
