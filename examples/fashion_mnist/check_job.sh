#!/usr/bin/env bash
# ctest entries for the main job on the real data (exit 77 = skipped when the dataset is absent):
#   check_job.sh loss    JOB MPIEXEC COMPARE OPTIMIZER REDUCE MAX_LOSS   2 ranks, a few hundred steps
#   check_job.sh repeat  JOB MPIEXEC COMPARE   same seed twice: bit-identical parameters
#   check_job.sh resume  JOB MPIEXEC COMPARE   checkpoint + resume == uninterrupted, bit for bit
#   check_job.sh ranks   JOB MPIEXEC COMPARE   1 rank x batch 2b == 2 ranks x batch b (SGD, average)
#   check_job.sh workers JOB MPIEXEC COMPARE WORKERS
#                        the workers study (WORKERS: fashion_mnist_workers) at K workers per rank
#                        == the main job at K times the ranks (SGD; averaging, and Adasum with
#                        per-worker momentum)
set -euo pipefail
mode=$1 job=$2 mpiexec=$3 compare=$4
shift 4
data=/usr/share/datasets/fashion-mnist
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
  echo "SKIPPED: $data is absent (sudo apt-get install dataset-fashion-mnist)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1
run() { local np=$1; shift; "$mpiexec" -n "$np" "$job" --quiet --seed 3 "$@"; }
study() { local np=$1; shift; "$mpiexec" -n "$np" "$workers_job" --quiet --seed 3 "$@"; }
case "$mode" in
  loss)
    optimizer=$1 reduce=$2 max_loss=$3
    run 2 --optimizer "$optimizer" --reduce "$reduce" --epochs 1 --limit-batches 300 --log "$work/log.csv"
    loss=$(tail -n 1 "$work/log.csv" | cut -d, -f2)
    echo "$optimizer/$reduce: mean training loss over 300 steps $loss (must be below $max_loss)"
    awk -v l="$loss" -v m="$max_loss" 'BEGIN { exit !(l < m) }'
    ;;
  repeat)
    run 2 --epochs 1 --limit-batches 40 --save-model "$work/a.bin"
    run 2 --epochs 1 --limit-batches 40 --save-model "$work/b.bin"
    "$compare" "$work/a.bin" "$work/b.bin" 0
    ;;
  resume)
    run 2 --epochs 2 --limit-batches 20 --save-model "$work/straight.bin"
    run 2 --epochs 1 --limit-batches 20 --checkpoint "$work/ck"
    run 2 --epochs 2 --limit-batches 20 --resume "$work/ck" --save-model "$work/resumed.bin"
    "$compare" "$work/straight.bin" "$work/resumed.bin" 0
    ;;
  ranks)
    run 1 --optimizer sgd --batch 64 --epochs 1 --limit-batches 30 --save-model "$work/one.bin"
    run 2 --optimizer sgd --batch 32 --epochs 1 --limit-batches 30 --save-model "$work/two.bin"
    "$compare" "$work/one.bin" "$work/two.bin" 1e-4
    ;;
  workers)
    workers_job=$1
    study 1 --batch 32 --workers-per-rank 2 --epochs 1 --limit-batches 30 --save-model "$work/a1.bin"
    run 2 --optimizer sgd --batch 32 --epochs 1 --limit-batches 30 --save-model "$work/a2.bin"
    "$compare" "$work/a1.bin" "$work/a2.bin" 1e-6
    adasum=(--reduce adasum --batch 16 --epochs 1 --limit-batches 30)
    study 2 "${adasum[@]}" --workers-per-rank 2 --save-model "$work/d1.bin"
    run 4 --optimizer sgd "${adasum[@]}" --save-model "$work/d2.bin"
    "$compare" "$work/d1.bin" "$work/d2.bin" 1e-4
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
