#!/usr/bin/env bash
# Installs missing Debian packages, builds kdist (Release, build/) and runs the whole test suite.
source "$(dirname "$0")/common.sh"
kdist_install_packages
kdist_build
cd "$KDIST_BUILD"
ctest --output-on-failure "$@"
