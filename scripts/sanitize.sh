#!/usr/bin/env bash
# AddressSanitizer + UBSan run: builds kdist and its test programs with
# -fsanitize=address,undefined in build-asan/ (KDIST_SANITIZE=ON; no benchmarks, no examples) and
# runs the tests labelled 'sanitize' there: every serial test and every 2-rank test. Any ASan,
# LSan or UBSan report fails the test; unit_tests/lsan.supp is the only suppression list.
# Extra arguments go to ctest. Run by scripts/test.sh unless KDIST_SANITIZE=0.
source "$(dirname "$0")/common.sh"
KDIST_ASAN_BUILD="${KDIST_ASAN_BUILD:-$KDIST_ROOT/build-asan}"
kdist_install_packages
# Debug (-O0 -g): compiles about 3x faster than -O1 with the sanitizers, and the tests stay short.
cmake -S "$KDIST_ROOT" -B "$KDIST_ASAN_BUILD" -DKDIST_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
  -DKDIST_ENABLE_PERF=OFF -DKDIST_ENABLE_EXAMPLES=OFF -DKDIST_CUDA_COMPILE_CHECK=OFF ${KDIST_ASAN_CMAKE_ARGS:-}
cmake --build "$KDIST_ASAN_BUILD" -j "$(nproc)"
cd "$KDIST_ASAN_BUILD"
ctest --output-on-failure -L sanitize "$@"
