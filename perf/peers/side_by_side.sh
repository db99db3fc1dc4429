#!/usr/bin/env bash
# kdist's main job against its peers, interleaved in one run: for each round and each row (MLP and
# CNN, SGD and K-FAC) the peer (PyTorch DDP, or kfac-pytorch on it) runs, then kdist, on the same
# ranks, batch, steps and real data. Prints one table: the row, the medians of images/s over the
# rounds, the per-round ratios and, last, the ratio of the medians (kdist / peer).
#
#   perf/peers/side_by_side.sh [--rounds 3] [--steps 300] [--ranks 2] [--batch 64]
#       [--rows "mlp:sgd mlp:kfac cnn:sgd cnn:kfac"] [--kfac-pytorch DIR] [--kdist-only]
#       [--build build] [--job PATH] [--data DIR] [--peer-device cpu|cuda] [--json FILE]
#       [--timeout 900] [--kdist-args "ARGS"]
#
# --peer-device cuda puts the peer's ranks on GPUs (NCCL): the side by side of a CUDA build of
# kdist (--job, with MPIEXEC naming the MPI that job was built with; PYTHON the python with torch).
#
# --timeout bounds each run in seconds (a peer's gloo rank can spin forever once its partner is
# gone): a run that fails or times out ends the script with status 1 after the table of the
# rounds completed so far.
# --job measures another program with the main job's options in kdist's place: the LibTorch
# example (build/examples/torch_fashion_mnist) for kdist::torch against the same peers.
# Without --kfac-pytorch the K-FAC rows run kdist alone and say why; without torch (Debian's
# python3-torch) every row does. kdist's figure is its epoch's images/s over --steps steps
# (first step included); the peer's leaves out its first 10 steps: both err against kdist.
# --kdist-args appends options to every kdist run (e.g. "--cholesky-solves measured"); the
# environment (OPENBLAS_CORETYPE included) reaches both sides alike.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
rounds=3 steps=300 ranks=2 batch=64 rows="mlp:sgd mlp:kfac cnn:sgd cnn:kfac"
kfac_dir="" kdist_only=0 build="$root/build" json="" job="" run_timeout=900 kdist_args=()
data=/usr/share/datasets/fashion-mnist peer_device=cpu
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --rows) rows="$2"; shift 2 ;;
    --kfac-pytorch) kfac_dir="$2"; shift 2 ;;
    --kdist-only) kdist_only=1; shift ;;
    --build) build="$2"; shift 2 ;;
    --job) job="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --peer-device) peer_device="$2"; shift 2 ;;
    --timeout) run_timeout="$2"; shift 2 ;;
    --kdist-args) read -r -a kdist_args <<<"$2"; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "side_by_side.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -d "$data" ] || { echo "side_by_side.sh: no Fashion-MNIST in $data (sudo apt-get install dataset-fashion-mnist)" >&2; exit 77; }
job="${job:-$build/examples/fashion_mnist}"
[ -x "$job" ] || { echo "side_by_side.sh: $job not built (cmake --build $build)" >&2; exit 2; }
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
python="${PYTHON:-/usr/bin/python3}"
[ -x "$python" ] || python=python3
mpiexec="${MPIEXEC:-mpiexec}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
results="$work/results.jsonl"
: >"$results"

peer_skip=""  # why no peer ran, per kind
if [ "$kdist_only" = 1 ]; then
  peer_skip="--kdist-only"
elif ! "$python" -c 'import torch' 2>/dev/null; then
  peer_skip="PyTorch is not installed (sudo apt-get install python3-torch)"
fi
[ -n "$peer_skip" ] && echo "side_by_side.sh: no peer runs: $peer_skip"
kfac_skip=""
[ -z "$kfac_dir" ] && kfac_skip="no --kfac-pytorch DIR given"
if [ -z "$peer_skip" ] && [ -z "$kfac_skip" ] && [[ " $rows " == *":kfac "* ]]; then
  "$python" -c "import sys; sys.path.insert(0, '$kfac_dir'); import kfac" 2>/dev/null ||
    kfac_skip="kfac-pytorch does not import from $kfac_dir"
fi
if [ -n "$kfac_skip" ] && [ -z "$peer_skip" ] && [[ " $rows " == *":kfac "* ]]; then
  echo "side_by_side.sh: kfac-pytorch rows run kdist alone: $kfac_skip"
fi

# Each run goes through `timeout`, which puts it in a process group of its own so that a stuck
# run is stopped whole: stdin is closed (a run reading the terminal would stop), and Ctrl-C
# reaches the run in flight only through --timeout (the script stops after it).
bounded() {  # log command...: the command under --timeout, its status in $status
  local log="$1"
  shift
  status=0
  timeout -k 10 "$run_timeout" "$@" </dev/null >"$log" 2>&1 || status=$?
}

summarise() {
  "$python" "$root/perf/peers/summarise.py" "$results" --ranks "$ranks" --batch "$batch" --steps "$steps" "$@"
}

# who model optimizer status log: says why a run gave no result, prints the rounds so far, exits 1.
give_up() {
  local why="failed (status $4)"
  [ "$4" = 124 ] && why="gave no result within --timeout $run_timeout s and was stopped"
  [ "$4" = 137 ] && why="was killed (status 137: past --timeout $run_timeout s and deaf to TERM, or out of memory)"
  echo "side_by_side.sh: $1 $why ($2 $3):" >&2
  tail -20 "$5" >&2
  if [ -s "$results" ]; then
    echo "side_by_side.sh: the runs completed so far:" >&2
    summarise >&2 || true
  fi
  exit 1
}

run_peer() {  # model optimizer round
  local out="$work/peer.json" extra=()
  [ "$2" = kfac ] && extra=(--kfac-pytorch "$kfac_dir")
  bounded "$work/peer.log" "$python" "$root/perf/peers/torch_peer.py" --model "$1" --optimizer "$2" \
    --ranks "$ranks" --batch "$batch" --limit-steps "$steps" --warmup "$(( steps > 20 ? 10 : 1 ))" "${extra[@]}" \
    --data "$data" --device "$peer_device" --json "$out"
  [ "$status" = 0 ] || give_up "the peer" "$1" "$2" "$status" "$work/peer.log"
  "$python" -c "import json,sys; r=json.load(open('$out')); r.update(side='peer', round=$3); print(json.dumps(r))" \
    >>"$results"
}

run_kdist() {  # model optimizer round
  local log="$work/kdist.csv"
  bounded "$work/kdist.out" "$mpiexec" -n "$ranks" "$job" --model "$1" --optimizer "$2" --batch "$batch" --epochs 1 \
    --limit-batches "$steps" --data "$data" --quiet --log "$log" "${kdist_args[@]}"
  [ "$status" = 0 ] || give_up kdist "$1" "$2" "$status" "$work/kdist.out"
  "$python" - "$log" "$1" "$2" "$3" >>"$results" <<'EOF'
import csv, json, sys
row = list(csv.DictReader(open(sys.argv[1])))[-1]
print(json.dumps({"side": "kdist", "model": sys.argv[2], "optimizer": sys.argv[3], "round": int(sys.argv[4]),
                  "images_per_second": float(row["images_per_second"]), "seconds": float(row["seconds"])}))
EOF
}

# round model optimizer: the row's figures as they come, so a run stopped before the table
# still leaves them in its log.
progress() {
  "$python" - "$results" "$1/$rounds" "$2" "$3" <<'EOF'
import json, sys
path, round_, model, opt = sys.argv[1:]
mine = [r for r in map(json.loads, open(path)) if (r["model"], r["optimizer"], r["round"]) ==
        (model, opt, int(round_.split("/")[0]))]
print(f"side_by_side.sh: round {round_}, {model} {opt} done: " +
      ", ".join(f"{r['side']} {r['images_per_second']:.0f} images/s" for r in mine))
EOF
}

for ((r = 1; r <= rounds; ++r)); do
  for row in $rows; do
    model="${row%%:*}" opt="${row##*:}"
    if [ -z "$peer_skip" ] && { [ "$opt" = sgd ] || [ -z "$kfac_skip" ]; }; then
      run_peer "$model" "$opt" "$r"
    fi
    run_kdist "$model" "$opt" "$r"
    progress "$r" "$model" "$opt" >&2
  done
done

summarise ${json:+--json "$json"}
