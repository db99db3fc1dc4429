#!/usr/bin/env bash
# Installs missing Debian packages, builds kdist (Release, build/) and runs the main job.
# Until the Fashion-MNIST example lands, the main job is the SPD-inverse benchmark.
source "$(dirname "$0")/common.sh"
kdist_install_packages
kdist_build
unset OPENBLAS_NUM_THREADS  # one process: let OpenBLAS use every core, in every column alike
"$KDIST_BUILD/perf/bench_inverse" --json "$KDIST_BUILD/bench_inverse.json" "$@"
echo "rows written to $KDIST_BUILD/bench_inverse.json"
