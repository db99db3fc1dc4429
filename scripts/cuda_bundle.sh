#!/usr/bin/env bash
# Builds a CUDA kdist and packs what a lent GPU machine needs to run it into one folder (the GPU
# kit; scripts/gpu_check.sh runs it there; docs/performance.md, "GPU kit").
#
#   scripts/cuda_bundle.sh [options] KOKKOS_SRC KOKKOS_KERNELS_SRC [ARCH]   build all, then pack
#   scripts/cuda_bundle.sh [options] --pack-only BUILD_DIR                  pack an existing build
#
# KOKKOS_SRC, KOKKOS_KERNELS_SRC: unpacked source trees, or the bare git mirrors the search tool's
# `fetch github:kokkos/kokkos` / `fetch github:kokkos/kokkos-kernels` leave in
# /work/.mirror/<owner>+<name>/repo (their HEAD is unpacked with git archive). Never inside the
# repository. ARCH: the CUDA architecture, sm_90 (H100/H200) unless given.
#
# Steps, each reused when its done-marker (WORK/<step>.done, holding the step's inputs) matches:
#   1. WORK/kokkos-src: a copy of KOKKOS_SRC with the CUDA 13 edits below; WORK/kokkos-build ->
#      WORK/kokkos-install (CUDA + Serial, Kokkos_ARCH_<ARCH>, static, Release, nvcc_wrapper)
#   2. WORK/kk-build -> WORK/kk-install: Kokkos Kernels, BLAS component only, no default ETI,
#      TPLs cuBLAS + cuSOLVER (+ cuSPARSE, which cuSOLVER requires) for device views and the host
#      BLAS (OpenBLAS, as in the host build) for host views: without it kdist::gemm on the host
#      space runs Kokkos Kernels' own serial kernel (kdist_portability's @host rows, tests' host
#      mirrors)
#   3. WORK/kdist-build: kdist with KDIST_ENABLE_CUDA + KDIST_ENABLE_NCCL (always re-run: make
#      rebuilds only what a kdist change touched)
#   3b. WORK/kdist-build-staged: the same without NCCL (device views staged through host memory
#      and MPI), only the programs of the run list's entries with 2 ranks and more, and
#      bench_adasum: NCCL refuses two ranks on one GPU, so on a one-GPU machine these are the
#      multi-rank tests that can run (--no-staged skips it)
#   4. OUT (the bundle): payload.tar.xz, runlist.tsv, manifest.json, MANIFEST.txt
# A marker that does not match (another ARCH or source) stops the script: give another --work.
#
# Options (or the environment variable in brackets):
#   --work DIR        work and prefix folder [KDIST_CUDA_WORK, default /tmp/kdist-cuda]
#   --out DIR         the bundle [KDIST_CUDA_BUNDLE, default <repo>/cuda-bundle]
#   --jobs N          parallel compile jobs [KDIST_CUDA_JOBS, default nproc]
#   --pack-only DIR   skip steps 1-3: pack the kdist CUDA build in DIR as it is (missing targets
#                     are listed in the manifest, not built)
#   --log FILE        with --pack-only: that build's log (make's output), for the failed targets
#   --staged DIR      with --pack-only: also pack the staged-MPI build in DIR (step 3b)
#   --no-staged       skip step 3b (the bundle then has no staged-MPI entries)
#   --kokkos-tools SRC  also build Kokkos Tools' simple kernel timer from SRC (a kokkos/kokkos-tools
#                     source tree or its bare git mirror) with the host compiler: lib/tools/
#                     kp_kernel_timer.so and bin/kp_reader, for gpu_check's per-kernel profiles
#                     (KOKKOS_TOOLS_LIBS; the tool asks Kokkos to fence around every kernel and
#                     region, so each one's time is its own)
#   --with-data       also pack Debian's Fashion-MNIST (/usr/share/datasets/fashion-mnist, 30 MB)
#                     if the bundle stays under the limit
#   --max-mib N       fail if the bundle is larger [KDIST_CUDA_BUNDLE_MAX_MIB, default 60: the
#                     device tool carries 64 MiB with the working tree (about 3 MiB) included]
#   KDIST_CUDA_CMAKE_ARGS  extra arguments for kdist's cmake configure
#
# Tried with (2026-12-03, Debian 12, gcc 12.2, CUDA 13.0.88 at /usr/local/cuda, NCCL 2.28.9 in
# /usr/local/cuda/lib, MPICH 4.0.2, OpenBLAS 0.3.21):
#   kokkos/kokkos          28848dfa8fc1411873b6a663c4d29ba05712510e (develop, 2025-06-20; 4.6.99)
#   kokkos/kokkos-kernels  2fc2af19fa7b74b64f3ce7a212c0728afd150c62 (develop, 2025-08-20; 4.7.99)
#   kokkos/kokkos-tools    758d979 (develop; only profiling/simple-kernel-timer, profiling/all and
#                          common are unpacked: the mirror lacks a blob of the perfetto connector)
# Times on 2 cores: Kokkos about 5 min, Kokkos Kernels about 1 min, kdist about 15 min, its staged
# build (step 3b) about 10 min, xz about 3 min.
#
# CUDA 13 edits to the Kokkos copy (applied only where the source lacks them; Kokkos releases
# with CUDA 13 support need none; the fetched source itself is never changed):
#   - bin/nvcc_wrapper: default_arch sm_70 -> ARCH (CUDA 13 dropped sm_70; the wrapper's default
#     is used by CMake's compiler checks, which pass no -arch)
#   - core/src/Cuda/Kokkos_Cuda_Instance.hpp, under CUDART_VERSION >= 13000:
#     cudaGraphAddDependencies(graph, from, to, n) -> (graph, from, to, nullptr, n) (edge data),
#     cudaMemPrefetchAsync(ptr, n, device, stream) -> (ptr, n, cudaMemLocation{...}, 0, stream)
#
# The bundle (carry it: run(carry=["cuda-bundle"], ...); keep it out of git, e.g. /cuda-bundle/
# in .gitignore; this script adds it to .git/info/exclude when it is not ignored):
#   payload.tar.xz  bin/       every test, benchmark and example program, stripped
#                   bin-staged/ the staged-MPI build's multi-rank programs (step 3b), stripped
#                   lib/       the shared libraries the device image may lack: MPICH and its UCX,
#                              hwloc, OpenBLAS/LAPACK, libgfortran, zlib, libcudart; Kokkos and
#                              Kokkos Kernels are static, inside each program
#                   lib/compat libstdc++ and libgcc_s of the build (used only if the device's are
#                              older)
#                   mpich/     mpiexec (Hydra) and hydra_pmi_proxy
#                   lib/tools/ kp_kernel_timer.so, with bin/kp_reader (--kokkos-tools only)
#   data/           Fashion-MNIST, as Debian ships it (--with-data only)
#   runlist.tsv     one line per ctest entry that runs a packed program under mpiexec: name,
#                   ranks, timeout, will_fail, environment, program (bin/...), arguments; the
#                   staged build's entries with 2 ranks and more follow as <name>.staged, program
#                   bin-staged/...
#   manifest.json   every packed file (size, sha256, what it is), the git commit, versions, ARCH,
#                   the libraries the device must provide (cuBLAS, cuSOLVER, cuSPARSE, nvJitLink,
#                   NCCL, libcuda), the ctest entries not in the run list
#   MANIFEST.txt    the same as a table
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${KDIST_CUDA_WORK:-/tmp/kdist-cuda}"
OUT="${KDIST_CUDA_BUNDLE:-$ROOT/cuda-bundle}"
JOBS="${KDIST_CUDA_JOBS:-$(nproc)}"
MAX_MIB="${KDIST_CUDA_BUNDLE_MAX_MIB:-60}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
PACK_ONLY=""
BUILD_LOG=""
STAGED=""
STAGED_LOG=""
WITH_STAGED=1
BUILD_RC=unknown
WITH_DATA=0
TOOLS_SRC=""
DATA_DIR=/usr/share/datasets/fashion-mnist
ARGS=()

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
die() {
  echo "cuda_bundle: $*" >&2
  exit 1
}
say() { echo "cuda_bundle: $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --work) WORK="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --pack-only) PACK_ONLY="$2"; shift 2 ;;
    --with-data) WITH_DATA=1; shift ;;
    --kokkos-tools) TOOLS_SRC="$2"; shift 2 ;;
    --log) BUILD_LOG="$2"; shift 2 ;;
    --staged) STAGED="$2"; shift 2 ;;
    --no-staged) WITH_STAGED=0; shift ;;
    --max-mib) MAX_MIB="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; ARGS+=("$@"); break ;;
    -*) die "unknown option $1 (--help)" ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

ARCH="sm_90"
if [ -z "$PACK_ONLY" ]; then
  if [ ${#ARGS[@]} -lt 2 ] || [ ${#ARGS[@]} -gt 3 ]; then
    usage >&2
    exit 2
  fi
  KOKKOS_SRC="${ARGS[0]}"
  KK_SRC="${ARGS[1]}"
  ARCH="${ARGS[2]:-sm_90}"
else
  [ ${#ARGS[@]} -eq 0 ] || die "--pack-only takes no sources"
  [ -f "$PACK_ONLY/CMakeCache.txt" ] || die "$PACK_ONLY is not a CMake build folder"
  PACK_ONLY="$(cd "$PACK_ONLY" && pwd)"
fi

# The Kokkos_ARCH_ option for an sm_XY.
kokkos_arch() {
  case "$1" in
    sm_75) echo TURING75 ;;
    sm_80) echo AMPERE80 ;;
    sm_86) echo AMPERE86 ;;
    sm_87) echo AMPERE87 ;;
    sm_89) echo ADA89 ;;
    sm_90) echo HOPPER90 ;;
    sm_100) echo BLACKWELL100 ;;
    sm_120) echo BLACKWELL120 ;;
    *) die "ARCH $1: expected sm_75, sm_80, sm_86, sm_87, sm_89, sm_90, sm_100 or sm_120" ;;
  esac
}

# A step's marker holds its inputs; a marker with other inputs is an error, not a rebuild.
step_done() {  # step inputs
  local m="$WORK/$1.done"
  [ -f "$m" ] || return 1
  if [ "$(cat "$m")" != "$2" ]; then
    die "$m was made for other inputs:
$(cat "$m")
now:
$2
Use another --work folder, or delete $WORK/$1* to rebuild that step."
  fi
  say "$1: reused ($m)"
}

# A source tree from a folder or a bare git mirror (its HEAD) into dest; its commit (or
# "unknown") into commit_file.
unpack_source() {  # src dest commit_file
  local src="$1" dest="$2" commit="unknown"
  if [ ! -f "$src/CMakeLists.txt" ] && git --git-dir="$src" rev-parse --verify -q HEAD >/dev/null 2>&1; then
    commit="$(git --git-dir="$src" rev-parse HEAD)"
    if [ ! -f "$dest/CMakeLists.txt" ]; then
      rm -rf "$dest" && mkdir -p "$dest"
      git --git-dir="$src" archive HEAD | tar -x -C "$dest"
    fi
  else
    [ -f "$src/CMakeLists.txt" ] || die "$src: neither a source tree nor a git mirror"
    if git -C "$src" rev-parse --verify -q HEAD >/dev/null 2>&1; then commit="$(git -C "$src" rev-parse HEAD)"; fi
    if [ ! -f "$dest/CMakeLists.txt" ]; then
      rm -rf "$dest" && mkdir -p "$dest"
      cp -a "$src/." "$dest/"
    fi
  fi
  echo "$commit" >"$3"
}

# The CUDA 13 edits (see the header); prints what it changed.
patch_kokkos() {  # dir arch
  local dir="$1" arch="$2" inst="$1/core/src/Cuda/Kokkos_Cuda_Instance.hpp"
  if grep -q '^default_arch="sm_[0-9]*"' "$dir/bin/nvcc_wrapper" &&
    ! grep -q "^default_arch=\"$arch\"" "$dir/bin/nvcc_wrapper"; then
    sed -i "s/^default_arch=\"sm_[0-9]*\"/default_arch=\"$arch\"/" "$dir/bin/nvcc_wrapper"
    echo "bin/nvcc_wrapper: default_arch=$arch"
  fi
  local cudart
  cudart="$(sed -n 's/^#define CUDART_VERSION *\([0-9]*\).*/\1/p' "$CUDA_HOME/include/cuda_runtime_api.h" | head -1)"
  if [ "${cudart:-0}" -ge 13000 ] && [ -f "$inst" ] && ! grep -q 'CUDART_VERSION >= 13000' "$inst" &&
    grep -q 'cudaGraphAddDependencies(graph, from, to, numDependencies)' "$inst"; then
    (cd "$dir" && patch -p1 --forward) <<'PATCH' >&2
--- a/core/src/Cuda/Kokkos_Cuda_Instance.hpp
+++ b/core/src/Cuda/Kokkos_Cuda_Instance.hpp
@@ -222,7 +222,11 @@
       cudaGraph_t graph, const cudaGraphNode_t* from, const cudaGraphNode_t* to,
       size_t numDependencies) const {
     set_cuda_device();
+#if CUDART_VERSION >= 13000
+    return cudaGraphAddDependencies(graph, from, to, nullptr, numDependencies);
+#else
     return cudaGraphAddDependencies(graph, from, to, numDependencies);
+#endif
   }
 
   cudaError_t cuda_graph_add_empty_node_wrapper(
@@ -276,7 +280,19 @@
   cudaError_t cuda_mem_prefetch_async_wrapper(const void* devPtr, size_t count,
                                               int dstDevice) const {
     set_cuda_device();
+#if CUDART_VERSION >= 13000
+    cudaMemLocation loc{};
+    if (dstDevice == cudaCpuDeviceId) {
+      loc.type = cudaMemLocationTypeHost;
+      loc.id   = 0;
+    } else {
+      loc.type = cudaMemLocationTypeDevice;
+      loc.id   = dstDevice;
+    }
+    return cudaMemPrefetchAsync(devPtr, count, loc, 0, m_stream);
+#else
     return cudaMemPrefetchAsync(devPtr, count, dstDevice, m_stream);
+#endif
   }
 
   cudaError_t cuda_memcpy_wrapper(void* dst, const void* src, size_t count,
PATCH
    echo "core/src/Cuda/Kokkos_Cuda_Instance.hpp: cudaGraphAddDependencies, cudaMemPrefetchAsync for CUDA 13"
  fi
}

# The programs of a configured build's ctest entries that run with 2 ranks or more.
multi_rank_programs() {  # build_dir
  (cd "$1" && ctest --show-only=json-v1) 2>/dev/null | python3 -c '
import json, os, sys
progs = set()
for t in json.load(sys.stdin).get("tests", []):
    c = t.get("command") or []
    if len(c) >= 4 and os.path.basename(c[0]).startswith("mpiexec") and c[1] in ("-n", "-np") and int(c[2]) >= 2:
        progs.add(os.path.basename(c[3]))
print(" ".join(sorted(progs)))'
}

is_elf_exe() { [ -f "$1" ] && [ -x "$1" ] && head -c 4 "$1" | grep -q 'ELF'; }

# Deletes a reused build folder's programs before it builds again: with make -k a target that
# fails to compile keeps the previous commit's executable, which packing would take for this one.
# Only the link steps run again.
drop_old_programs() {  # build_dir
  local dir f
  for dir in "$1/unit_tests" "$1/perf" "$1/examples" "$1"; do
    for f in "$dir"/*; do
      case "$f" in *.so* | *.a) continue ;; esac
      if is_elf_exe "$f"; then rm -f "$f"; fi
    done
  done
  return 0
}

# ---- 1-3: build -----------------------------------------------------------------------------------
if [ -z "$PACK_ONLY" ]; then
  mkdir -p "$WORK"
  WORK="$(cd "$WORK" && pwd)"
  case "$WORK/" in "$ROOT"/*) die "--work $WORK is inside the repository" ;; esac
  [ -x "$CUDA_HOME/bin/nvcc" ] || die "no CUDA toolkit at $CUDA_HOME (CUDA_HOME)"
  KARCH="$(kokkos_arch "$ARCH")" || exit 1
  cuda_version="$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"

  in_kokkos="src=$(readlink -f "$KOKKOS_SRC") arch=$ARCH cuda=$cuda_version"
  if ! step_done kokkos "$in_kokkos"; then
    ksrc="$WORK/kokkos-src"
    unpack_source "$KOKKOS_SRC" "$ksrc" "$WORK/kokkos-src.commit"
    patch_kokkos "$ksrc" "$ARCH" >"$WORK/kokkos-src.patches"
    say "kokkos: $(wc -l <"$WORK/kokkos-src.patches") edit(s) for CUDA 13 / $ARCH; configuring (log $WORK/kokkos.log)"
    rm -rf "$WORK/kokkos-build"
    {
      cmake -S "$ksrc" -B "$WORK/kokkos-build" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CXX_COMPILER="$ksrc/bin/nvcc_wrapper" -DCMAKE_CXX_STANDARD=17 \
        -DCMAKE_INSTALL_PREFIX="$WORK/kokkos-install" -DBUILD_SHARED_LIBS=OFF \
        -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_SERIAL=ON "-DKokkos_ARCH_$KARCH=ON" \
        -DKokkos_ENABLE_TESTS=OFF -DKokkos_ENABLE_EXAMPLES=OFF
      cmake --build "$WORK/kokkos-build" -j "$JOBS"
      cmake --install "$WORK/kokkos-build"
    } >"$WORK/kokkos.log" 2>&1 || die "Kokkos failed: tail $WORK/kokkos.log"
    echo "$in_kokkos" >"$WORK/kokkos.done"
  fi

  in_kk="src=$(readlink -f "$KK_SRC") kokkos=$WORK/kokkos-install arch=$ARCH tpls=cublas,cusolver,cusparse,blas"
  if ! step_done kk "$in_kk"; then
    kksrc="$WORK/kk-src"
    unpack_source "$KK_SRC" "$kksrc" "$WORK/kk-src.commit"
    say "kokkos-kernels: configuring (log $WORK/kk.log)"
    rm -rf "$WORK/kk-build"
    {
      cmake -S "$kksrc" -B "$WORK/kk-build" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CXX_COMPILER="$WORK/kokkos-install/bin/nvcc_wrapper" \
        -DCMAKE_INSTALL_PREFIX="$WORK/kk-install" -DBUILD_SHARED_LIBS=OFF \
        -DKokkos_ROOT="$WORK/kokkos-install" \
        -DKokkosKernels_ENABLE_ALL_COMPONENTS=OFF -DKokkosKernels_ENABLE_COMPONENT_BLAS=ON \
        -DKokkosKernels_ADD_DEFAULT_ETI=OFF -DKokkosKernels_ENABLE_TESTS=OFF \
        -DKokkosKernels_ENABLE_TPL_CUBLAS=ON -DKokkosKernels_ENABLE_TPL_CUSOLVER=ON \
        -DKokkosKernels_ENABLE_TPL_CUSPARSE=ON -DKokkosKernels_ENABLE_TPL_BLAS=ON
      cmake --build "$WORK/kk-build" -j "$JOBS"
      cmake --install "$WORK/kk-build"
    } >"$WORK/kk.log" 2>&1 || die "Kokkos Kernels failed: tail $WORK/kk.log"
    echo "$in_kk" >"$WORK/kk.done"
  fi

  BUILD="$WORK/kdist-build"
  BUILD_LOG="$WORK/kdist.log"
  BUILD_RC=0
  say "kdist: building $ROOT in $BUILD (log $WORK/kdist.log)"
  # shellcheck disable=SC2086 # KDIST_CUDA_CMAKE_ARGS is a list of arguments
  {
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CXX_COMPILER="$WORK/kokkos-install/bin/nvcc_wrapper" \
      -DKokkos_ROOT="$WORK/kokkos-install" -DKokkosKernels_ROOT="$WORK/kk-install" \
      -DKDIST_ENABLE_CUDA=ON -DKDIST_ENABLE_NCCL=ON ${KDIST_CUDA_CMAKE_ARGS:-}
    # -k: a target that fails leaves the others built; the manifest lists what is missing.
    drop_old_programs "$BUILD"
    cmake --build "$BUILD" -j "$JOBS" -- -k
  } >"$WORK/kdist.log" 2>&1 || BUILD_RC=$?
  [ "$BUILD_RC" = 0 ] || say "kdist: build FAILED (packing what exists; see $WORK/kdist.log)"
  grep -E '^make(\[[0-9]+\])?: \*\*\*' "$WORK/kdist.log" | sed 's/^/  /' | head -20 || true

  if [ "$WITH_STAGED" = 1 ]; then
    STAGED="$WORK/kdist-build-staged"
    STAGED_LOG="$WORK/kdist-staged.log"
    say "kdist (staged MPI, no NCCL): building the multi-rank programs in $STAGED (log $STAGED_LOG)"
    # shellcheck disable=SC2086 # KDIST_CUDA_CMAKE_ARGS and the target list are word lists
    {
      cmake -S "$ROOT" -B "$STAGED" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CXX_COMPILER="$WORK/kokkos-install/bin/nvcc_wrapper" \
        -DKokkos_ROOT="$WORK/kokkos-install" -DKokkosKernels_ROOT="$WORK/kk-install" \
        -DKDIST_ENABLE_CUDA=ON -DKDIST_ENABLE_NCCL=OFF ${KDIST_CUDA_CMAKE_ARGS:-}
      targets="$(multi_rank_programs "$STAGED") bench_adasum"
      echo "targets: $targets"
      drop_old_programs "$STAGED"
      cmake --build "$STAGED" -j "$JOBS" --target $targets -- -k
    } >"$STAGED_LOG" 2>&1 || say "kdist (staged): build FAILED (packing what exists; see $STAGED_LOG)"
  fi
else
  BUILD="$PACK_ONLY"
  if [ -n "$STAGED" ]; then
    [ -f "$STAGED/CMakeCache.txt" ] || die "--staged $STAGED is not a CMake build folder"
    STAGED="$(cd "$STAGED" && pwd)"
  fi
fi

# Kokkos Tools' simple kernel timer into dir (a C ABI plug-in: built with the host g++, loaded by
# any Kokkos 4 through KOKKOS_TOOLS_LIBS).
build_kernel_timer() {  # src dir
  local src="$1" dir="$2" tree="$2/src" commit=unknown
  local parts=(profiling/simple-kernel-timer profiling/all common)
  rm -rf "$dir" && mkdir -p "$tree"
  if [ -d "$src/profiling/simple-kernel-timer" ]; then
    for p in "${parts[@]}"; do mkdir -p "$tree/$(dirname "$p")" && cp -a "$src/$p" "$tree/$p"; done
    commit="$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)"
  elif git --git-dir="$src" rev-parse --verify -q HEAD >/dev/null 2>&1; then
    # (the mirror lacks a perfetto blob: git archive says so on stderr and still exits 0)
    git --git-dir="$src" archive HEAD "${parts[@]}" 2>"$dir/archive.log" | tar -x -C "$tree"
    commit="$(git --git-dir="$src" rev-parse HEAD)"
  else
    die "--kokkos-tools $src: neither a kokkos-tools source tree nor its git mirror"
  fi
  local k="$tree/profiling/simple-kernel-timer"
  local flags=(-O2 -std=c++17 "-I$k" "-I$tree/common/makefile-only" "-I$tree/profiling/all" "-I$tree/common")
  if ! g++ "${flags[@]}" -shared -fPIC -o "$dir/kp_kernel_timer.so" "$k/kp_kernel_timer.cpp" "$k/kp_shared.cpp" ||
    ! g++ "${flags[@]}" -o "$dir/kp_reader" "$k/kp_reader.cpp" "$k/kp_shared.cpp"; then
    die "Kokkos Tools' simple kernel timer did not build from $src"
  fi
  echo "$commit" >"$dir/commit"
}
if [ -n "$TOOLS_SRC" ]; then
  mkdir -p "$WORK"
  build_kernel_timer "$TOOLS_SRC" "$WORK/kokkos-tools"
  say "kokkos-tools: simple kernel timer built ($(cat "$WORK/kokkos-tools/commit"))"
fi

# ---- 4: pack --------------------------------------------------------------------------------------
cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt" | head -1; }
[ "$(cache KDIST_ENABLE_CUDA)" = ON ] || die "$BUILD is not a KDIST_ENABLE_CUDA build"
KOKKOS_DIR="$(cache Kokkos_DIR)"
KK_DIR="$(cache KokkosKernels_DIR)"
SOURCE_DIR="$(cache kdist_SOURCE_DIR)"
[ -n "$PACK_ONLY" ] || SOURCE_DIR="$ROOT"
# The Kokkos the build used: its architecture, and its source commit if this script made it.
kokkos_prefix="$(cd "$KOKKOS_DIR/../../.." 2>/dev/null && pwd)" || kokkos_prefix=""
built_arch=""
if [ -f "$kokkos_prefix/bin/nvcc_wrapper" ]; then
  built_arch="$(sed -n 's/^default_arch="\(sm_[0-9]*\)"/\1/p' "$kokkos_prefix/bin/nvcc_wrapper" | head -1)"
fi
[ -n "$PACK_ONLY" ] && ARCH="${built_arch:-unknown}"

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
case "$OUT/" in
  "$ROOT"/*)
    if ! git -C "$ROOT" check-ignore -q "$OUT/" 2>/dev/null; then
      rel="${OUT#"$ROOT"/}"
      echo "/$rel/" >>"$(git -C "$ROOT" rev-parse --git-path info/exclude)"
      say "$rel/ was not ignored by git: added to .git/info/exclude (add /$rel/ to .gitignore)"
    fi
    ;;
esac
STAGE="$(mktemp -d "${TMPDIR:-/tmp}/kdist-bundle.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/bin-staged" "$STAGE/lib/compat" "$STAGE/mpich" "$STAGE/final"
# name<TAB>kind lines for the manifest
KINDS="$STAGE/kinds.tsv"
: >"$KINDS"

n_prog=0
for dir_kind in "unit_tests:unit test" "perf:benchmark" "examples:example" ".:tool"; do
  dir="${dir_kind%%:*}"
  kind="${dir_kind#*:}"
  for f in "$BUILD/$dir"/*; do
    is_elf_exe "$f" || continue
    name="$(basename "$f")"
    case "$name" in *.so* | *.a) continue ;; esac
    [ -e "$STAGE/bin/$name" ] && continue
    strip --strip-unneeded -o "$STAGE/bin/$name" "$f"
    printf 'bin/%s\t%s (from %s/)\n' "$name" "$kind" "$dir" >>"$KINDS"
    n_prog=$((n_prog + 1))
  done
done
[ "$n_prog" -gt 0 ] || die "no programs in $BUILD"
say "packed $n_prog programs from $BUILD"
# The staged-MPI build: only its multi-rank programs (and bench_adasum), into bin-staged/.
n_staged=0
if [ -n "$STAGED" ]; then
  for name in $(multi_rank_programs "$STAGED") bench_adasum; do
    for dir in unit_tests perf examples; do
      f="$STAGED/$dir/$name"
      is_elf_exe "$f" || continue
      strip --strip-unneeded -o "$STAGE/bin-staged/$name" "$f"
      case "$dir" in unit_tests) kind="unit test" ;; perf) kind=benchmark ;; *) kind=example ;; esac
      printf 'bin-staged/%s\t%s, staged MPI build (no NCCL) (from %s/)\n' "$name" "$kind" "$dir" >>"$KINDS"
      n_staged=$((n_staged + 1))
    done
  done
  say "packed $n_staged staged-MPI programs from $STAGED"
fi

# Shared libraries: the device provides the CUDA driver and the large CUDA libraries (its image
# has the toolkit and the nvidia-* Python wheels); glibc stays the device's. Everything else
# the programs or the launcher load is carried.
DEVICE_LIBS='^(libcuda\.so|libcublas\.so|libcublasLt\.so|libcusolver\.so|libcusparse\.so|libnvJitLink\.so|libnccl\.so|libcurand\.so|libcufft\.so)'
GLIBC_LIBS='^(linux-vdso\.so|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libresolv\.so|libutil\.so|libmvec\.so)'
COMPAT_LIBS='^(libstdc\+\+\.so|libgcc_s\.so)'
MPIEXEC="$(readlink -f "$(command -v mpiexec)")"
PROXY="$(dirname "$MPIEXEC")/hydra_pmi_proxy"
[ -x "$PROXY" ] || die "no hydra_pmi_proxy beside $MPIEXEC (MPICH's Hydra launcher)"
cp "$MPIEXEC" "$STAGE/mpich/mpiexec"
cp "$PROXY" "$STAGE/mpich/hydra_pmi_proxy"
printf 'mpich/mpiexec\tMPI launcher (%s)\nmpich/hydra_pmi_proxy\tMPI launcher proxy\n' "$MPIEXEC" >>"$KINDS"
if [ -n "$TOOLS_SRC" ]; then
  mkdir -p "$STAGE/lib/tools"
  strip --strip-unneeded -o "$STAGE/lib/tools/kp_kernel_timer.so" "$WORK/kokkos-tools/kp_kernel_timer.so"
  strip --strip-unneeded -o "$STAGE/bin/kp_reader" "$WORK/kokkos-tools/kp_reader"
  tools_commit="$(cat "$WORK/kokkos-tools/commit")"
  printf 'lib/tools/kp_kernel_timer.so\tKokkos Tools simple kernel timer (kokkos-tools %s; KOKKOS_TOOLS_LIBS)\n' "$tools_commit" >>"$KINDS"
  printf 'bin/kp_reader\tKokkos Tools reader of the kernel timer'"'"'s .dat files (kokkos-tools %s)\n' "$tools_commit" >>"$KINDS"
fi
declare -A device_needs=()
ldd_all="$STAGE/ldd.txt"
for f in "$STAGE"/bin/* "$STAGE"/bin-staged/* "$STAGE"/mpich/*; do [ -f "$f" ] && { ldd "$f" 2>/dev/null || true; }; done >"$ldd_all"
while read -r soname arrow path _; do
  [ "$arrow" = "=>" ] || continue
  if [[ "$soname" =~ $GLIBC_LIBS ]]; then continue; fi
  if [[ "$soname" =~ $DEVICE_LIBS ]]; then device_needs[$soname]=1; continue; fi
  [ "$path" != "not" ] || die "$soname: not found here (ldd); cannot pack it"
  dest="$STAGE/lib"
  [[ "$soname" =~ $COMPAT_LIBS ]] && dest="$STAGE/lib/compat"
  [ -e "$dest/$soname" ] && continue
  cp -L "$path" "$dest/$soname"
  case "$soname" in
    libcudart*) k="CUDA runtime (the build's; the driver must be at least its version)" ;;
    libmpich*) k="MPICH (its ch4 netmod: UCX below)" ;;
    libuc[pstm]*) k="UCX (MPICH's transport)" ;;
    libopenblas* | libblas* | liblapack*) k="OpenBLAS / LAPACK (host BLAS)" ;;
    libstdc++* | libgcc_s*) k="C++ runtime of the build (used only if the device's is older)" ;;
    *) k="shared library" ;;
  esac
  printf '%s\t%s (from %s)\n' "${dest#"$STAGE"/}/$soname" "$k" "$(readlink -f "$path")" >>"$KINDS"
done < <(sort -u "$ldd_all")
chmod u+w "$STAGE"/lib/*.so* "$STAGE"/lib/compat/*.so* 2>/dev/null || true

# Fashion-MNIST (gzip'ed already): beside the payload, not in it.
if [ "$WITH_DATA" = 1 ]; then
  if [ -f "$DATA_DIR/train-images-idx3-ubyte.gz" ]; then
    mkdir -p "$STAGE/final/data/fashion-mnist"
    for f in "$DATA_DIR"/*-ubyte.gz; do
      cp "$f" "$STAGE/final/data/fashion-mnist/"
      printf 'data/fashion-mnist/%s\tFashion-MNIST (Debian dataset-fashion-mnist), beside the payload\n' "$(basename "$f")" >>"$KINDS"
    done
  else
    say "--with-data: $DATA_DIR absent (apt-get install dataset-fashion-mnist); packing no data"
  fi
fi

# The run list, from ctest's own description of the tests (paths made relative to the bundle).
(cd "$BUILD" && ctest --show-only=json-v1) >"$STAGE/ctest.json" 2>/dev/null || die "ctest --show-only failed in $BUILD"
if [ -n "$STAGED" ]; then
  (cd "$STAGED" && ctest --show-only=json-v1) >"$STAGE/ctest-staged.json" 2>/dev/null || die "ctest --show-only failed in $STAGED"
fi
python3 - "$STAGE" "$BUILD" "$STAGED" <<'PY'
import json, os, sys
stage, build, staged = sys.argv[1], sys.argv[2], sys.argv[3]
rows, left = [], []
def add(doc_path, build, bindir, suffix, min_ranks):
    packed = set(os.listdir(os.path.join(stage, bindir)))
    for t in json.load(open(doc_path)).get("tests", []):
        cmd = t.get("command") or []
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        name = t["name"] + suffix
        # mpiexec -n N <program> args...: MPIEXEC_PREFLAGS/POSTFLAGS are empty with MPICH
        if len(cmd) >= 4 and os.path.basename(cmd[0]).startswith("mpiexec") and cmd[1] in ("-n", "-np"):
            if int(cmd[2]) < min_ranks:
                continue
            prog = os.path.basename(cmd[3])
            if prog in packed and cmd[3].startswith(build):
                env = [e for e in props.get("ENVIRONMENT", []) if " " not in e and "\t" not in e]
                args = cmd[4:]
                if any("\t" in a for a in args):
                    left.append((name, "an argument holds a tab"))
                    continue
                rows.append([name, cmd[2], str(int(float(props.get("TIMEOUT", 1500)))),
                             "1" if props.get("WILL_FAIL") else "0", ";".join(env) or "-", bindir + "/" + prog] + args)
                continue
            left.append((name, "program not packed: " + prog))
        elif not suffix:
            left.append((name, "not 'mpiexec -n N program' (a cmake -P or shell check of the build tree)"))
add(os.path.join(stage, "ctest.json"), build, "bin", "", 1)
if staged:
    add(os.path.join(stage, "ctest-staged.json"), staged, "bin-staged", ".staged", 2)
with open(os.path.join(stage, "runlist.tsv"), "w") as f:
    f.write("# name\tranks\ttimeout_s\twill_fail\tenvironment (;-separated, - for none)\tprogram\targuments...\n")
    for r in rows:
        f.write("\t".join(r) + "\n")
json.dump([{"test": n, "why": w} for n, w in left], open(os.path.join(stage, "not_in_runlist.json"), "w"), indent=1)
print("cuda_bundle: run list: %d ctest entries; %d left out (cmake/shell checks)" % (len(rows), len(left)))
PY

# Compressed together: the programs share most of their code (Kokkos, kdist, Catch2), which a
# 256 MiB dictionary finds across files. Decompressing needs about 260 MB of memory.
say "compressing (xz, this takes a few minutes on 2 cores)"
payload_list="$(cd "$STAGE" && find bin bin-staged lib mpich -type f 2>/dev/null | sort)"
# shellcheck disable=SC2086 # one path per word, none with spaces
(cd "$STAGE" && tar --owner=0 --group=0 -cf - $payload_list) |
  xz -T"$JOBS" --lzma2=preset=9e,dict=256MiB -c >"$STAGE/payload.tar.xz"

# The manifest.
git_commit="$(git -C "$SOURCE_DIR" rev-parse HEAD 2>/dev/null || echo unknown)"
git_dirty="$(git -C "$SOURCE_DIR" status --porcelain --untracked-files=no 2>/dev/null | grep -c . || true)"
version_of() { if [ -f "$1" ]; then sed -n 's/.*set(PACKAGE_VERSION "\([^"]*\)").*/\1/p' "$1" | head -1; else echo unknown; fi; }
kokkos_version="$(version_of "$KOKKOS_DIR/KokkosConfigVersion.cmake")"
kk_version="$(version_of "$KK_DIR/KokkosKernelsConfigVersion.cmake")"
commit_of() { if [ -f "$1" ]; then cat "$1"; else echo unknown; fi; }
kokkos_work="$(dirname "$kokkos_prefix")"
kokkos_commit="${KDIST_KOKKOS_COMMIT:-$(commit_of "$kokkos_work/kokkos-src.commit")}"
kk_commit="${KDIST_KK_COMMIT:-$(commit_of "$kokkos_work/kk-src.commit")}"
# The CUDA 13 edits, read off the installed Kokkos (whoever built it).
patches=""
[ -n "$built_arch" ] && patches="bin/nvcc_wrapper: default_arch=$built_arch"
if grep -qs 'CUDART_VERSION >= 13000' "$kokkos_prefix/include/Cuda/Kokkos_Cuda_Instance.hpp"; then
  patches="$patches
core/src/Cuda/Kokkos_Cuda_Instance.hpp: CUDART_VERSION >= 13000 branches (cudaGraphAddDependencies, cudaMemPrefetchAsync)"
fi
cuda_version="$("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\), V\([0-9.]*\).*/\2/p' || true)"
nccl_version="$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v[$2]=$3} END{if(v["NCCL_MAJOR"]!="")print v["NCCL_MAJOR"]"."v["NCCL_MINOR"]"."v["NCCL_PATCH"]}' "$(cache NCCL_INCLUDE_DIR)/nccl.h" 2>/dev/null || true)"
glibc_needed="$(for f in "$STAGE"/bin/* "$STAGE"/lib/*.so* "$STAGE"/mpich/*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n -u | tail -1 || true)"
glibcxx_needed="$(for f in "$STAGE"/bin/*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -t. -k3 -n -u | tail -1 || true)"
# Targets whose build failed, from the build log (make's "*** [.../CMakeFiles/<target>.dir/all]"),
# unless the build ended well: our own rc, or a log whose last line is "done 0".
failed_targets=""
staged_failed=""
if [ -n "$STAGED_LOG" ] && [ -f "$STAGED_LOG" ]; then
  staged_failed="$(grep -oE 'CMakeFiles/[A-Za-z0-9_.+-]+\.dir/all\] Error' "$STAGED_LOG" |
    sed -E 's#CMakeFiles/(.*)\.dir/all\] Error#\1#' | sort -u || true)"
fi
if [ "$BUILD_RC" != 0 ] && [ -f "$BUILD_LOG" ] && ! tail -n 1 "$BUILD_LOG" | grep -qx 'done 0'; then
  failed_targets="$(grep -oE 'CMakeFiles/[A-Za-z0-9_.+-]+\.dir/all\] Error' "$BUILD_LOG" |
    sed -E 's#CMakeFiles/(.*)\.dir/all\] Error#\1#' | sort -u || true)"
fi

mv "$STAGE/payload.tar.xz" "$STAGE/runlist.tsv" "$STAGE/final/"
export STAGE BUILD SOURCE_DIR ARCH git_commit git_dirty kokkos_version kk_version kokkos_commit kk_commit patches \
  cuda_version nccl_version glibc_needed glibcxx_needed failed_targets MPIEXEC STAGED staged_failed
export DEVICE_NEEDS="${!device_needs[*]}"
python3 - <<'PY'
import hashlib, json, os, subprocess, tarfile, time
E = os.environ
stage, final = E["STAGE"], os.path.join(E["STAGE"], "final")
kinds = dict(l.rstrip("\n").split("\t", 1) for l in open(os.path.join(stage, "kinds.tsv")) if "\t" in l)
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()
files = []
for rel in sorted(kinds):
    p = os.path.join(stage, rel)
    if not os.path.exists(p):
        p = os.path.join(final, rel)  # data/, beside the payload
    files.append({"path": rel, "bytes": os.path.getsize(p), "sha256": sha(p), "what": kinds[rel]})
payload = os.path.join(final, "payload.tar.xz")
runlist = [l.split("\t") for l in open(os.path.join(final, "runlist.tsv")) if not l.startswith("#")]
doc = {
    "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "kdist_commit": E["git_commit"], "kdist_tracked_files_modified": int(E["git_dirty"] or 0),
    "kdist_source_dir": E["SOURCE_DIR"], "build_dir": E["BUILD"], "arch": E["ARCH"],
    "cuda": E["cuda_version"], "nccl_headers": E["nccl_version"],
    "kokkos": {"version": E["kokkos_version"], "commit": E["kokkos_commit"],
               "cuda13_edits": [l for l in E["patches"].splitlines() if l], "libraries": "static, inside every program"},
    "kokkos_kernels": {"version": E["kk_version"], "commit": E["kk_commit"], "tpls": "cuBLAS, cuSOLVER, cuSPARSE, BLAS (host)",
                       "libraries": "static, inside every program"},
    "mpiexec": E["MPIEXEC"],
    "needs_glibc": E["glibc_needed"], "needs_glibcxx": E["glibcxx_needed"],
    "device_must_provide": sorted(E["DEVICE_NEEDS"].split()),
    "failed_build_targets": [l for l in E["failed_targets"].splitlines() if l],
    "staged_build_dir": E["STAGED"] or None,
    "staged_failed_build_targets": [l for l in E["staged_failed"].splitlines() if l],
    "payload": {"path": "payload.tar.xz", "bytes": os.path.getsize(payload), "sha256": sha(payload),
                "unpacked_bytes": sum(f["bytes"] for f in files if not f["path"].startswith("data/")),
                "files": [f for f in files if not f["path"].startswith("data/")]},
    "beside_payload": [f for f in files if f["path"].startswith("data/")],
    "runlist": {"path": "runlist.tsv", "entries": len(runlist),
                "ranks": sorted({int(r[1]) for r in runlist})},
    "not_in_runlist": json.load(open(os.path.join(stage, "not_in_runlist.json"))),
}
json.dump(doc, open(os.path.join(final, "manifest.json"), "w"), indent=1)
mib = lambda b: "%.2f" % (b / 1048576)
with open(os.path.join(final, "MANIFEST.txt"), "w") as f:
    w = f.write
    w("kdist CUDA bundle (scripts/cuda_bundle.sh; run it with scripts/gpu_check.sh)\n")
    w("made %s from kdist %s%s, build %s\n" % (doc["made"], doc["kdist_commit"],
      " (+%d modified tracked files)" % doc["kdist_tracked_files_modified"] if doc["kdist_tracked_files_modified"] else "",
      doc["build_dir"]))
    w("arch %s, CUDA %s, NCCL headers %s\n" % (doc["arch"], doc["cuda"], doc["nccl_headers"]))
    w("Kokkos %s (%s), edits: %s\n" % (doc["kokkos"]["version"], doc["kokkos"]["commit"],
      "; ".join(doc["kokkos"]["cuda13_edits"]) or "none recorded"))
    w("Kokkos Kernels %s (%s), TPLs %s; both static\n" % (doc["kokkos_kernels"]["version"],
      doc["kokkos_kernels"]["commit"], doc["kokkos_kernels"]["tpls"]))
    w("needs on the device: %s; glibc >= %s; libstdc++ %s (else lib/compat)\n" % (
      ", ".join(doc["device_must_provide"]), doc["needs_glibc"][6:], doc["needs_glibcxx"]))
    if doc["failed_build_targets"]:
        w("FAILED build targets: %s\n" % ", ".join(doc["failed_build_targets"]))
    w("staged-MPI build (bin-staged/, entries <name>.staged): %s\n" % (doc["staged_build_dir"] or "none"))
    if doc["staged_failed_build_targets"]:
        w("FAILED staged build targets: %s\n" % ", ".join(doc["staged_failed_build_targets"]))
    w("payload.tar.xz %s MiB (unpacked %s MiB), sha256 %s\n" % (mib(doc["payload"]["bytes"]),
      mib(doc["payload"]["unpacked_bytes"]), doc["payload"]["sha256"]))
    w("runlist.tsv: %d entries (ranks %s); %d ctest entries left out (manifest.json)\n\n" % (
      doc["runlist"]["entries"], ",".join(map(str, doc["runlist"]["ranks"])), len(doc["not_in_runlist"])))
    w("%10s  %-16s  %-40s  %s\n" % ("bytes", "sha256", "path", "what"))
    for x in files:
        w("%10d  %-16s  %-40s  %s\n" % (x["bytes"], x["sha256"][:16], x["path"], x["what"]))
PY

# Replace the bundle's files (and only them) in OUT.
rm -rf "$OUT/payload.tar.xz" "$OUT/runlist.tsv" "$OUT/manifest.json" "$OUT/MANIFEST.txt" "$OUT/data"
mv "$STAGE"/final/* "$OUT/"
total=$(du -cb "$OUT" | tail -1 | cut -f1)
say "bundle $OUT: $(awk -v b="$total" 'BEGIN{printf "%.2f", b/1048576}') MiB"
sed -n '1,8p' "$OUT/MANIFEST.txt" | sed 's/^/  /'
if [ "$total" -gt $((MAX_MIB * 1048576)) ]; then
  die "the bundle is over --max-mib $MAX_MIB MiB: the device tool would refuse it"
fi
case "$OUT/" in
  "$ROOT"/*) say "on the device: run(command=\"bash scripts/gpu_check.sh ${OUT#"$ROOT"/}\", carry=[\"${OUT#"$ROOT"/}\"], timeout_s=560)" ;;
  *) say "the device tool carries only paths inside the repository: copy $OUT there (git-ignored) to use it" ;;
esac
