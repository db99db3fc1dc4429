#!/usr/bin/env bash
# Installs missing Debian packages, builds kdist (Release, build/) and runs the main job: K-FAC
# (SPD-KFAC) training the Fashion-MNIST MLP on 2 ranks, then draws the training curves with
# gnuplot. Extra arguments go to the job (e.g. --epochs 5, --model cnn, --optimizer sgd).
# Output: demo/ (CSV log, Chrome trace, curves.png).
source "$(dirname "$0")/common.sh"
KDIST_PACKAGES+=(gnuplot-nox)
kdist_install_packages
kdist_build
OUT="${KDIST_DEMO_OUT:-$KDIST_ROOT/demo}"
mkdir -p "$OUT"
export OPENBLAS_NUM_THREADS=1  # one core per rank
mpiexec -n 2 "$KDIST_BUILD/examples/fashion_mnist" --model mlp --optimizer kfac --epochs 4 \
  --log "$OUT/training.csv" --trace "$OUT/trace.json" "$@" | tee "$OUT/output.txt"
gnuplot -e "csv='$OUT/training.csv'; png='$OUT/curves.png'" "$KDIST_ROOT/scripts/curves.gp"
accuracy=$(tail -n 1 "$OUT/output.txt")
echo
echo "$accuracy"
echo "CSV log:         $OUT/training.csv"
echo "Chrome trace:    $OUT/trace.json (open in chrome://tracing or ui.perfetto.dev)"
echo "training curves: $OUT/curves.png"
