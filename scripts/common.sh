# Shared by scripts/test.sh and scripts/demo.sh: install what is missing, configure, build.
set -euo pipefail

KDIST_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KDIST_BUILD="${KDIST_BUILD:-$KDIST_ROOT/build}"

# Debian 12 packages kdist builds, tests and runs with (CUDA comes from /usr/local/cuda if present).
KDIST_PACKAGES=(
  cmake g++ make binutils pkg-config
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev
  mpich libmpich-dev
  libopenblas-dev
  nlohmann-json3-dev libcli11-dev zlib1g-dev catch2
  dataset-fashion-mnist
  iproute2
  python3
)

kdist_install_packages() {
  local missing=()
  for p in "${KDIST_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "kdist: all Debian packages present"
    return
  fi
  echo "kdist: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
}

kdist_build() {
  cmake -S "$KDIST_ROOT" -B "$KDIST_BUILD" -DCMAKE_BUILD_TYPE=Release ${KDIST_CMAKE_ARGS:-}
  cmake --build "$KDIST_BUILD" -j "$(nproc)"
}

# Ranks must not fight over cores: one BLAS thread per process under mpiexec.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
