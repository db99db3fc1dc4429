#!/usr/bin/env bash
# Installs missing Debian packages, builds kdist (Release, build/) and runs the whole test suite
# (extra arguments go to that ctest); then, unless KDIST_SANITIZE=0, the sanitizer run
# (scripts/sanitize.sh: build-asan/, the serial and 2-rank tests under ASan + UBSan). Exits
# non-zero if either run fails.
source "$(dirname "$0")/common.sh"
KDIST_PACKAGES+=(libtorch-dev)  # the optional kdist::torch module, its tests and example
kdist_install_packages
kdist_build
rc=0
(cd "$KDIST_BUILD" && ctest --output-on-failure "$@") || rc=$?
if [ "${KDIST_SANITIZE:-1}" != 0 ]; then
  bash "$KDIST_ROOT/scripts/sanitize.sh" || rc=$?
fi
exit "$rc"
