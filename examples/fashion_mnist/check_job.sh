#!/usr/bin/env bash
# ctest entries for the main job on the real data (exit 77 = skipped when the dataset is absent):
#   check_job.sh loss    JOB MPIEXEC COMPARE OPTIMIZER REDUCE MAX_LOSS [JOB OPTIONS]
#                        2 ranks, a few hundred steps
#   check_job.sh repeat  JOB MPIEXEC COMPARE   same seed twice: bit-identical parameters
#   check_job.sh resume  JOB MPIEXEC COMPARE   checkpoint + resume == uninterrupted, bit for bit
#                        (K-FAC with --factor-sync before-inverses: up to rounding)
#                        (at an epoch end and inside an epoch; SGD, K-FAC, and Adasum's per-rank momenta)
#   check_job.sh resume_ranks JOB MPIEXEC COMPARE
#                        saved inside an epoch at 2 ranks, resumed at 1, 3 and 4 ranks (global
#                        batch 48): the uninterrupted 2-rank run's parameters to 1e-5 (SGD, K-FAC,
#                        K-FAC on the CNN at 3); Adasum resumes at 3 with the mean momentum
#   check_job.sh refuse  JOB MPIEXEC COMPARE   a global batch the ranks do not divide, a damaged
#                        checkpoint, another run's (model, optimizer, batch, lr, schedule), one
#                        with no epoch left: refused on every rank naming the field, exit 1, the
#                        checkpoint it would have overwritten left as it was
#   check_job.sh peer    JOB MPIEXEC COMPARE   rank 0 fails alone (unwritable --log, --save-model,
#                        --checkpoint, --trace; probed before training), or rank 1 (no data set):
#                        the other rank exits non-zero with its reason (`peer ... log-only`, the
#                        LibTorch job: --log and the data set)
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
    shift 3
    run 2 --optimizer "$optimizer" --reduce "$reduce" --epochs 1 --limit-batches 300 --log "$work/log.csv" "$@"
    loss=$(tail -n 1 "$work/log.csv" | cut -d, -f2)
    echo "$optimizer/$reduce $*: mean training loss over 300 steps $loss (must be below $max_loss)"
    awk -v l="$loss" -v m="$max_loss" 'BEGIN { exit !(l < m) }'
    ;;
  repeat)
    run 2 --epochs 1 --limit-batches 40 --save-model "$work/a.bin"
    run 2 --epochs 1 --limit-batches 40 --save-model "$work/b.bin"
    "$compare" "$work/a.bin" "$work/b.bin" 0
    ;;
  resume)
    for opt in "--optimizer kfac" "--optimizer sgd --reduce adasum"; do
      # shellcheck disable=SC2086
      set -- $opt --epochs 2 --limit-batches 20
      run 2 "$@" --save-model "$work/straight.bin"
      run 2 "$@" --epochs 1 --checkpoint "$work/ck"
      run 2 "$@" --resume "$work/ck" --save-model "$work/resumed.bin"
      "$compare" "$work/straight.bin" "$work/resumed.bin" 0
      run 2 "$@" --stop-after 27 --checkpoint-every 5 --checkpoint "$work/ck"
      run 2 "$@" --resume "$work/ck" --save-model "$work/resumed.bin"
      "$compare" "$work/straight.bin" "$work/resumed.bin" 0
    done
    # Factors synced before inverse steps only: a checkpoint all-reduces the rank-local factors
    # first, so the resumed run matches the uninterrupted one up to rounding.
    set -- --optimizer kfac --factor-sync before-inverses --epochs 2 --limit-batches 20
    run 2 "$@" --save-model "$work/straight.bin"
    run 2 "$@" --stop-after 27 --checkpoint-every 5 --checkpoint "$work/ck"
    run 2 "$@" --resume "$work/ck" --save-model "$work/resumed.bin"
    "$compare" "$work/straight.bin" "$work/resumed.bin" 1e-5
    ;;
  resume_ranks)
    for opt in "--optimizer sgd" "--optimizer kfac"; do
      # shellcheck disable=SC2086
      set -- $opt --epochs 2 --limit-batches 20
      run 2 "$@" --global-batch 48 --save-model "$work/straight.bin"
      run 2 "$@" --global-batch 48 --stop-after 27 --checkpoint "$work/ck"
      for np in 1 3 4; do
        run "$np" "$@" --resume "$work/ck" --save-model "$work/resumed.bin"
        "$compare" "$work/straight.bin" "$work/resumed.bin" 1e-5
      done
    done
    cnn=(--model cnn --optimizer kfac --epochs 1 --limit-batches 8 --global-batch 48)
    run 2 "${cnn[@]}" --save-model "$work/straight.bin"
    run 2 "${cnn[@]}" --stop-after 3 --checkpoint "$work/ck"
    "$mpiexec" -n 3 "$job" --seed 3 "${cnn[@]}" --resume "$work/ck" --save-model "$work/resumed.bin" | tee "$work/out"
    # Every factor's form changes with the split (an inverse at 2 ranks, its Cholesky factor at 3, or the reverse).
    grep -qF "K-FAC restored from $work/ck (step 3, saved at 2 rank(s)), 8 inverse(s) converted to or from a Cholesky factor for this run: placement, preconditioning split and fusion plan made for 3 rank(s)" "$work/out"
    "$compare" "$work/straight.bin" "$work/resumed.bin" 1e-5
    adasum=(--optimizer sgd --reduce adasum --epochs 1 --limit-batches 10 --global-batch 48)
    run 2 "${adasum[@]}" --stop-after 4 --checkpoint "$work/ck"
    "$mpiexec" -n 3 "$job" --seed 3 "${adasum[@]}" --resume "$work/ck" | tee "$work/out"
    grep -q "each rank's momentum: the mean of the saved ranks'" "$work/out"
    ;;
  refuse)
    expect() {  # expect NP TEXT ARGS...: exit 1, every rank names TEXT
      local np=$1 text=$2
      shift 2
      if "$mpiexec" -n "$np" "$job" --quiet --seed 3 "$@" 2> "$work/err"; then
        echo "expected a failure: $*"
        exit 1
      fi
      cat "$work/err"
      for ((r = 0; r < np; r++)); do grep -F "(rank $r): " "$work/err" | grep -qF -- "$text"; done
    }
    expect 3 "a global batch of 64 samples does not divide among 3 ranks" --global-batch 64 --limit-batches 2
    run 2 --optimizer kfac --epochs 1 --limit-batches 4 --checkpoint "$work/ck"
    cp "$work/ck" "$work/saved"
    # Each refused run resumes from ck and would checkpoint into it: it must leave it as it was.
    again=(--resume "$work/ck" --checkpoint "$work/ck" --checkpoint-every 1 --limit-batches 4)
    expect 2 "field 'job.optimizer' (byte " --optimizer sgd "${again[@]}"
    expect 3 "field 'job.global_batch' (byte " --optimizer kfac --batch 64 "${again[@]}"
    expect 2 "field 'job.model' (byte " --model cnn --optimizer kfac "${again[@]}"
    expect 2 "field 'job.lr' (byte " --optimizer kfac --lr 0.2 "${again[@]}"
    expect 2 "field 'job.lr_schedule' (byte " --optimizer kfac --lr-schedule cosine "${again[@]}"
    expect 2 "leaves nothing to train" --optimizer kfac --epochs 1 "${again[@]}"
    cmp "$work/ck" "$work/saved"
    head -c 5000 "$work/saved" > "$work/cut"
    expect 2 "$work/cut: section 'param.0." --optimizer kfac --resume "$work/cut" --limit-batches 4
    grep -q "(truncated)" "$work/err"
    ;;
  peer)
    if "$mpiexec" -n 2 "$job" --quiet --seed 3 --epochs 2 --limit-batches 3 --log /nonexistent-dir/log.csv \
      2> "$work/err"; then
      echo "expected a failure"
      exit 1
    fi
    cat "$work/err"
    grep -F "(rank 0): " "$work/err" | grep -qF "cannot write '/nonexistent-dir/log.csv'"
    grep -F "(rank 1): " "$work/err" | grep -F "rank 0" | grep -qF "cannot write '/nonexistent-dir/log.csv'"
    # The data set missing on rank 1 alone, before any Engine exists: rank 0 hears why.
    few=(--quiet --seed 3 --epochs 1 --limit-batches 3)
    if "$mpiexec" -n 1 "$job" "${few[@]}" : -n 1 "$job" "${few[@]}" --data /nonexistent-data 2> "$work/err"; then
      echo "expected a failure: --data on rank 1"
      exit 1
    fi
    cat "$work/err"
    grep -F "(rank 1): " "$work/err" | grep -qF "/nonexistent-data"
    grep -F "(rank 0): " "$work/err" | grep -F "rank 1 failed before training" | grep -qF "/nonexistent-data"
    [ "${1:-}" = log-only ] && exit 0  # the LibTorch job writes only --log
    # Every output rank 0 writes is probed before training: both ranks fail at once, naming it.
    for option in --save-model --checkpoint --trace; do
      if "$mpiexec" -n 2 "$job" --quiet --seed 3 --epochs 2 --limit-batches 3 "$option" /nonexistent-dir/out \
        2> "$work/err"; then
        echo "expected a failure: $option"
        exit 1
      fi
      cat "$work/err"
      for r in 0 1; do
        grep -F "(rank $r): " "$work/err" | grep -F "fashion_mnist $option" | grep -qF "cannot write '/nonexistent-dir/out'"
      done
    done
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
