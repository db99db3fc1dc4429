#!/usr/bin/env bash
# Runs the CUDA kdist of a bundle (scripts/cuda_bundle.sh) on a GPU machine in about 8 minutes:
#
#   scripts/gpu_check.sh [BUNDLE_DIR]          (default: <repo>/cuda-bundle)
#
# From the device tool: run(command="bash scripts/gpu_check.sh cuda-bundle",
# carry=["cuda-bundle"], timeout_s=560). Without a GPU (no nvidia-smi, or it lists no device) it
# prints "no GPU" and exits 3 before doing anything else.
#
# Steps, in order, each under a time limit; a failing step is recorded and the next one runs:
#   unpack         payload.tar.xz (checked against manifest.json's sha256) to GPU_CHECK_UNPACK
#   device         nvidia-smi: the GPU, driver, memory, compute capability
#   libraries      ldd of every program: what the bundle carries (MPICH, UCX, OpenBLAS, cudart)
#                  and what the device must provide (cuBLAS, cuSOLVER, cuSPARSE, nvJitLink, NCCL,
#                  libcuda), looked up in the CUDA toolkit, the driver and the nvidia-* wheels
#   mpi_probe      mpiexec -n 2 of one short test program (MPI + Kokkos CUDA start-up): the
#                  staged-MPI build's when the bundle has one, else the NCCL build's if the
#                  machine has 2 GPUs; if it fails, again with UCX_TLS=sm,self, kept for the rest
#                  if that works
#   gpu_smoke      cuSOLVER against host LAPACK, d = 256 ... 8192
#   test 1 rank    every run-list entry with 1 rank (all unit tests; Kokkos' default space is
#                  CUDA: TestExec/TestMem are the GPU), GPU_CHECK_JOBS at a time
#   test 2 ranks   every entry with 2 ranks of the NCCL build (device views through NCCL, host
#                  ones through MPI), when the machine has 2 GPUs. With one GPU NCCL refuses two
#                  ranks ("Duplicate GPU detected"): one entry runs as nccl_duplicate_gpu, which
#                  passes when every rank fails at Engine construction naming the shared GPU,
#                  and the others are recorded as skipped
#   staged 2 ranks every <name>.staged entry with 2 ranks: the staged-MPI build (device views
#                  through host memory and MPI), both ranks on the one GPU
#   bench_inverse  kdist::spd_inverse against LAPACK and gemm  [GPU_CHECK_BENCH_INVERSE_ARGS]
#   bench_inverse_cuda  kdist::spd_inverse on the GPU against cuSOLVER potrf + potri
#                  [GPU_CHECK_BENCH_INVERSE_CUDA_ARGS]
#   bench_adasum   2 ranks, Adasum against MPI_Allreduce(SUM)   [GPU_CHECK_BENCH_ADASUM_ARGS]
#                  (the staged-MPI build's with one GPU)
#   portability    kdist_portability on the CUDA space and the host (then --smoke if it fails)
#   fashion_mnist  the MLP with K-FAC, one epoch, 1 rank, on Debian's dataset-fashion-mnist
#                  (fashion_mnist_cnn: the CNN, the same way; fashion_mnist_cnn_trace: 300 of
#                  its steps with --trace, results/cnn_kfac_trace.json, for
#                  perf/tools/trace_summary.py: each phase per step, each K-FAC hook per layer;
#                  cnn_kfac_kernels, cnn_sgd_kernels: 200 CNN steps under Kokkos Tools' simple
#                  kernel timer, when the bundle has it, kp_reader's table of every kernel and
#                  region in results/cnn_<optimizer>_kernels.txt)
#   peers_cuda     perf/peers/side_by_side.sh on this GPU: the main job against PyTorch DDP and
#                  kfac-pytorch (GPU_CHECK_KFAC_PYTORCH, default .peers/kfac-pytorch: a v0.4.2
#                  source tree carried with the repository), 1 rank, 300 steps, 2 rounds; skipped
#                  without a python3 whose torch sees the GPU
#                  (/usr/share/datasets/fashion-mnist, or the bundle's data/, or GPU_CHECK_DATA);
#                  skipped, and said so, when absent
#   staged 3 ranks the <name>.staged entries with 3 ranks (a rank count that is not a power of
#                  two), with what is left of the budget
#
# Output in $OUT (default ./gpu-check-out; 4 files, within what the device tool brings back):
#   gpu-check.json  every step: name, command, ranks, timeout, seconds, rc, status
#                   (pass | fail | timeout | skipped), note, the end of its log; the device;
#                   the libraries; totals. Rewritten after every step (a run cut short keeps it)
#   summary.txt     the same as a table
#   steps.log       the end of every step's log
#   logs.tar.gz     logs/ (every step's whole log) and results/ (the benchmarks' JSON, the
#                   training log)
# Exit status: 0 all steps that ran passed, 1 some failed, 3 no GPU, 4 no bundle (those two
# write only gpu-check.json, {"status", "exit", "message"}, and a one-line summary.txt).
#
# Environment: GPU_CHECK_BUDGET_S (total, default 450), GPU_CHECK_JOBS (1-rank tests at once,
# default 4), GPU_CHECK_JOBS2 (2-rank tests at once, default 2), GPU_CHECK_UNPACK (default
# /tmp/kdist-gpu-kit), GPU_CHECK_DATA, GPU_CHECK_ONLY (a regex: run only the matching steps and
# tests), GPU_CHECK_ASSUME_GPU=1 (skip the GPU test: only to try this script on a CPU machine;
# GPU_CHECK_GPUS then gives the GPU count, default 1).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$PATH:/usr/local/nvidia/bin:/usr/local/cuda/bin"

# JSON string of arbitrary text (printable ASCII kept).
jstr() {
  local s
  s="$(printf '%s' "$1" | tr -cd '\11\12\15\40-\176')"
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  s="${s//$'\t'/\\t}"
  s="${s//$'\r'/}"
  s="${s//$'\n'/\\n}"
  printf '"%s"' "$s"
}

OUT="${OUT:-./gpu-check-out}"
# stop STATUS EXIT MESSAGE: nothing can run; say why on stderr and in $OUT's report and summary.
stop() {
  echo "gpu_check: $3" >&2
  mkdir -p "$OUT" || exit "$2"
  rm -f "$OUT/steps.log" "$OUT/logs.tar.gz"
  printf '{"status": %s, "exit": %d, "message": %s, "steps": []}\n' "$(jstr "$1")" "$2" "$(jstr "$3")" >"$OUT/gpu-check.json"
  echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ): $3 (exit $2)" >"$OUT/summary.txt"
  exit "$2"
}

# ---- no GPU: stop before anything else -------------------------------------------------------
if [ "${GPU_CHECK_ASSUME_GPU:-0}" != 1 ]; then
  command -v nvidia-smi >/dev/null 2>&1 || stop "no GPU" 3 "no GPU (nvidia-smi not found): nothing run"
  # Captured, not piped into grep -q: under pipefail an early grep exit fails the pipeline.
  gpus="$(timeout 60 nvidia-smi -L 2>/dev/null)"
  grep '^GPU ' <<<"$gpus" >/dev/null || stop "no GPU" 3 "no GPU (nvidia-smi lists no device): nothing run"
  NGPU="$(grep -c '^GPU ' <<<"$gpus")"
else
  NGPU="${GPU_CHECK_GPUS:-1}"
fi

T0="${EPOCHREALTIME:-$(date +%s.%N)}"
BUDGET="${GPU_CHECK_BUDGET_S:-450}"
BUNDLE="${1:-$ROOT/cuda-bundle}"
KIT="${GPU_CHECK_UNPACK:-/tmp/kdist-gpu-kit}"
JOBS1="${GPU_CHECK_JOBS:-4}"
JOBS2="${GPU_CHECK_JOBS2:-2}"
ONLY="${GPU_CHECK_ONLY:-}"
if [ ! -f "$BUNDLE/payload.tar.xz" ] || [ ! -f "$BUNDLE/runlist.tsv" ]; then
  stop "no bundle" 4 "no bundle at $BUNDLE (payload.tar.xz, runlist.tsv: scripts/cuda_bundle.sh makes one)"
fi
BUNDLE="$(cd "$BUNDLE" && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
W="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
mkdir -p "$W/logs" "$W/results" "$W/res" "$W/run"
rm -f "$OUT/gpu-check.json" "$OUT/summary.txt" "$OUT/steps.log" "$OUT/logs.tar.gz"

now() { echo "${EPOCHREALTIME:-$(date +%s.%N)}"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}'; }
# Seconds left before the whole budget is spent.
left() { awk -v t0="$T0" -v b="$BUDGET" -v n="$(now)" 'BEGIN{printf "%d", t0 + b - n}'; }
# A step's own limit within what is left of the budget (at least 1 s: timeout 0 would not stop it).
capped() { awk -v own="$1" -v l="$(left)" 'BEGIN{v = own < l ? own : l; printf "%d", v < 1 ? 1 : v}'; }
selected() { [ -z "$ONLY" ] || [[ "$1" =~ $ONLY ]]; }

STEPS=()      # one JSON object per step
SUMMARY=()    # one table line per step
N_PASS=0 N_FAIL=0 N_TIMEOUT=0 N_SKIP=0
INFO_JSON=()  # "key": value pairs for the report's top level
# record name group ranks timeout seconds rc status note cmd log
record() {
  local name="$1" group="$2" ranks="$3" tmo="$4" secs="$5" rc="$6" status="$7" note="$8" cmd="$9" log="${10}"
  local tail_txt=""
  [ -f "$log" ] && tail_txt="$(tail -n 25 "$log")"
  STEPS+=("{\"name\": $(jstr "$name"), \"group\": $(jstr "$group"), \"ranks\": ${ranks:-0}, \"timeout_s\": ${tmo:-0}, \"seconds\": ${secs:-0}, \"rc\": ${rc:-null}, \"status\": $(jstr "$status"), \"note\": $(jstr "$note"), \"command\": $(jstr "$cmd"), \"log_tail\": $(jstr "$tail_txt")}")
  SUMMARY+=("$(printf '%-44s %-8s %7s %6s  %s' "$name" "$status" "$secs" "$tmo" "$note")")
  case "$status" in
    pass) N_PASS=$((N_PASS + 1)) ;;
    fail) N_FAIL=$((N_FAIL + 1)) ;;
    timeout) N_TIMEOUT=$((N_TIMEOUT + 1)) ;;
    *) N_SKIP=$((N_SKIP + 1)) ;;
  esac
  if [ -f "$log" ]; then
    {
      echo "===== $name: $status (rc ${rc:-none}, ${secs} s of ${tmo} s) $note"
      echo "\$ $cmd"
      tail -n 60 "$log"
    } >>"$OUT/steps.log"
  fi
  echo "gpu_check: $(printf '%-44s %-8s %6s s  %s' "$name" "$status" "$secs" "$note")"
  write_report
}

write_report() {
  local IFS=,
  {
    echo "{\"bundle\": $(jstr "$BUNDLE"), \"budget_s\": $BUDGET, \"elapsed_s\": $(elapsed "$T0"),"
    echo " \"totals\": {\"pass\": $N_PASS, \"fail\": $N_FAIL, \"timeout\": $N_TIMEOUT, \"skipped\": $N_SKIP},"
    [ ${#INFO_JSON[@]} -gt 0 ] && echo " ${INFO_JSON[*]},"
    echo " \"steps\": ["
    local i
    for i in "${!STEPS[@]}"; do
      if [ "$i" -gt 0 ]; then echo ",${STEPS[$i]}"; else echo " ${STEPS[$i]}"; fi
    done
    echo "]}"
  } >"$OUT/gpu-check.json.tmp" && mv "$OUT/gpu-check.json.tmp" "$OUT/gpu-check.json"
  {
    echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ): $N_PASS pass, $N_FAIL fail, $N_TIMEOUT timeout, $N_SKIP skipped; $(elapsed "$T0") s of $BUDGET"
    printf '%s\n' "${HEADER[@]}"
    echo
    printf '%-44s %-8s %7s %6s  %s\n' step status seconds limit note
    printf '%s\n' "${SUMMARY[@]}"
  } >"$OUT/summary.txt"
}
HEADER=()

# run_step name group ranks timeout cmd...: runs in its own folder, output to logs/<name>.log,
# result to res/<name>.res; for the pools, also callable in the background.
run_step() {
  local name="$1" group="$2" ranks="$3" tmo="$4" will_fail="$5"
  shift 5
  local log="$W/logs/$name.log" dir="$W/run/$name" t rc status note=""
  mkdir -p "$dir"
  t="$(now)"
  (cd "$dir" && timeout -k 10 "$tmo" "$@") >"$log" 2>&1 </dev/null
  rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    status=timeout
  elif [ "$rc" = 126 ] || [ "$rc" = 127 ]; then
    status=fail  # the program could not start: no pass even where it must fail
  elif [ "$will_fail" = 1 ]; then
    if [ "$rc" != 0 ]; then status=pass; note="fails as it must (WILL_FAIL)"; else status=fail; note="passed but must fail (WILL_FAIL)"; fi
  elif [ "$rc" = 0 ]; then
    status=pass
  else
    status=fail
  fi
  grep -q 'Duplicate GPU detected' "$log" && note="${note:+$note; }NCCL: Duplicate GPU detected (two ranks on one GPU)"
  grep -q 'error while loading shared libraries' "$log" && note="${note:+$note; }$(grep -m1 -o 'error while loading shared libraries: [^:]*' "$log")"
  if [ "$status" != pass ] && [ -z "$note" ]; then
    note="$(grep -m1 -E 'FAILED|Error|error:|what\(\)|Abort|terminate' "$log" | cut -c1-160)"
    [ -n "$note" ] || note="$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-160)"
    [ "$rc" -gt 128 ] && [ "$status" = fail ] && note="${note:+$note; }rc $rc: signal $((rc - 128))"
  fi
  note="${note//$'\t'/ }"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$group" "$ranks" "$tmo" "$(elapsed "$t")" "$rc" "$status" "$note" >"$W/res/$name.res"
  printf '%s ' "$@" >"$W/res/$name.cmd"
}

# Records a finished run_step from its .res file.
collect() {
  local name="$1" n g r tmo secs rc status note
  IFS=$'\t' read -r n g r tmo secs rc status note <"$W/res/$name.res"
  [ "$rc" = - ] && rc=""
  record "$n" "$g" "$r" "$tmo" "$secs" "$rc" "$status" "$note" "$(cat "$W/res/$name.cmd")" "$W/logs/$name.log"
}

# step name group ranks own_limit cmd...: one step, in the foreground, within the budget.
step() {
  local name="$1" group="$2" ranks="$3" own="$4"
  shift 4
  if ! selected "$name"; then return 0; fi
  local l
  l="$(left)"
  if [ "$l" -lt 10 ]; then
    record "$name" "$group" "$ranks" 0 0 "" skipped "the ${BUDGET} s budget is spent" "$*" ""
    return 0
  fi
  own="$(capped "$own")"
  local a
  for a in "$@"; do
    if [[ "$a" == "$KIT/bin/"* ]] && [ ! -x "$a" ]; then
      record "$name" "$group" "$ranks" "$own" 0 "" fail "${a#"$KIT"/} is not in the bundle (its build failed?)" "$*" ""
      return 0
    fi
  done
  run_step "$name" "$group" "$ranks" "$own" 0 "$@"
  collect "$name"
}

# ---- unpack -------------------------------------------------------------------------------------
HEADER+=("bundle $BUNDLE")
[ -f "$BUNDLE/MANIFEST.txt" ] && sed -n '1,8p' "$BUNDLE/MANIFEST.txt" | sed 's/^/  /'
want_sha="$(grep -A4 '"payload"' "$BUNDLE/manifest.json" 2>/dev/null | sed -n 's/.*"sha256": "\([0-9a-f]*\)".*/\1/p' | head -1)"
t="$(now)"
(
  set -e
  got_sha="$(sha256sum "$BUNDLE/payload.tar.xz" | cut -d' ' -f1)"
  echo "payload sha256 $got_sha (manifest: ${want_sha:-none})"
  [ -z "$want_sha" ] || [ "$got_sha" = "$want_sha" ] || { echo "sha256 differs from the manifest"; exit 1; }
  rm -rf "$KIT" && mkdir -p "$KIT"
  if command -v xz >/dev/null 2>&1; then
    tar -xJf "$BUNDLE/payload.tar.xz" -C "$KIT"
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$BUNDLE/payload.tar.xz" "$KIT"
  fi
  du -sh "$KIT"
) >"$W/logs/unpack.log" 2>&1
rc=$?
if [ "$rc" = 0 ]; then st=pass; else st=fail; fi
record unpack setup 0 0 "$(elapsed "$t")" "$rc" "$st" "to $KIT" "tar -xJf payload.tar.xz -C $KIT" "$W/logs/unpack.log"
if [ "$rc" != 0 ]; then
  echo "gpu_check: the bundle did not unpack; nothing else can run" >&2
  tar -czf "$OUT/logs.tar.gz" -C "$W" logs results
  exit 1
fi
export PATH="$KIT/mpich:$PATH"
MPIEXEC="$KIT/mpich/mpiexec"
export HYDRA_LAUNCHER=fork

# ---- the device -----------------------------------------------------------------------------------
t="$(now)"
{
  timeout 60 nvidia-smi
  echo "nvidia-smi rc $?"
  echo
  timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm --format=csv
  echo
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  echo "cores: $(nproc); memory: $(awk '/MemTotal/{print $2/1048576 " GiB"}' /proc/meminfo)"
  grep PRETTY_NAME /etc/os-release 2>/dev/null
} >"$W/logs/device.log" 2>&1
rc="$(sed -n 's/^nvidia-smi rc //p' "$W/logs/device.log")"
gpu_line="$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -1)"
HEADER+=("device: ${gpu_line:-unknown}" "$(grep '^glibc' "$W/logs/device.log")" "$(grep PRETTY_NAME "$W/logs/device.log")")
INFO_JSON+=("\"device\": $(jstr "${gpu_line:-unknown}")" "\"device_log\": $(jstr "$(cat "$W/logs/device.log")")")
sed -n '1,20p' "$W/logs/device.log"
if [ "$rc" = 0 ]; then st=pass; else st=fail; fi
record device setup 0 30 "$(elapsed "$t")" "$rc" "$st" "${gpu_line:-}" "nvidia-smi" "$W/logs/device.log"

# ---- the libraries --------------------------------------------------------------------------------
t="$(now)"
LD="$KIT/lib"
export LD_LIBRARY_PATH="$LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
missing_libs() {
  for f in "$KIT"/bin/* "$KIT"/mpich/*; do ldd "$f" 2>/dev/null; done | awk '$2 == "=>" && $3 == "not" {print $1}' | sort -u
}
{
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  mapfile -t need < <(missing_libs)
  echo "not in the bundle nor the loader's path: ${need[*]:-none}"
  if [ ${#need[@]} -gt 0 ]; then
    # The CUDA toolkit, the driver, the Python wheels (nvidia-*: cuBLAS, cuSOLVER, NCCL, ...).
    expr=()
    for n in "${need[@]}"; do expr+=(-o -name "$n"); done
    mapfile -t found < <(find /usr/local/cuda/ /usr/local/nvidia/ /usr/lib/x86_64-linux-gnu /usr/lib64 /opt /usr/local/lib \
      /usr/lib/python3 /root/.local -maxdepth 9 \( -false "${expr[@]}" \) \( -type f -o -type l \) 2>/dev/null | sort -u)
    declare -A seen=()
    extra=""
    for p in "${found[@]}"; do
      d="$(dirname "$p")"
      echo "found $p"
      # one directory per library name: the first found (the toolkit before the wheels)
      b="$(basename "$p")"
      [ -n "${seen[$b]:-}" ] && continue
      seen[$b]=1
      case ":$extra:" in *":$d:"*) ;; *) extra="${extra:+$extra:}$d" ;; esac
    done
    echo "EXTRA=$extra"
  fi
} >"$W/logs/libraries.log" 2>&1
extra="$(sed -n 's/^EXTRA=//p' "$W/logs/libraries.log")"
[ -n "$extra" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$extra"
# libstdc++ / libgcc_s older than the build's: use the bundle's.
ldd_all="$(for f in "$KIT"/bin/*; do ldd "$f" 2>&1; done)"
if grep -E "version .(GLIBCXX|CXXABI|GCC)_[0-9.]*' not found" <<<"$ldd_all" >/dev/null; then
  export LD_LIBRARY_PATH="$KIT/lib/compat:$LD_LIBRARY_PATH"
  echo "libstdc++ too old here: using the bundle's (lib/compat)" >>"$W/logs/libraries.log"
fi
{
  echo "final LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$KIT"/bin/* "$KIT"/mpich/* 2>&1 | grep -E "not found" | sort -u | sed 's/^/MISSING /'
  glibc_bad="$(for f in "$KIT"/bin/*; do ldd "$f" 2>&1; done | grep -E "version .GLIBC_[0-9.]*' not found" | sort -u | head -3)"
  [ -z "$glibc_bad" ] || echo "MISSING glibc: $glibc_bad"
} >>"$W/logs/libraries.log" 2>&1
# What each group of libraries resolved to, over every program.
lib_report=()
lib_json=()
for pair in "MPICH:libmpich" "UCX:libucp" "NCCL:libnccl" "OpenBLAS:libopenblas|libblas|liblapack" "cuBLAS:libcublas" \
  "cuSOLVER:libcusolver" "cuSPARSE:libcusparse" "cudart:libcudart" "driver:libcuda\\." "nvJitLink:libnvJitLink"; do
  what="${pair%%:*}"
  re="${pair#*:}"
  where="$(for f in "$KIT"/bin/*; do ldd "$f" 2>/dev/null; done | grep -E "^\s*($re)" |
    awk '{print $1 " => " $3}' | sort -u | tr '\n' ' ')"
  [ -n "$where" ] || where="not needed by the programs"
  case "$where" in *" not "* | *"not found"*) where="MISSING: $where" ;; esac
  lib_report+=("$(printf '  %-9s %s' "$what" "$where")")
  lib_json+=("$(jstr "$what"): $(jstr "$where")")
done
{
  echo
  printf '%s\n' "${lib_report[@]}"
} >>"$W/logs/libraries.log"
HEADER+=("libraries:" "${lib_report[@]}")
INFO_JSON+=("\"libraries\": {$(IFS=,; echo "${lib_json[*]}")}" "\"ld_library_path\": $(jstr "$LD_LIBRARY_PATH")")
printf '%s\n' "${lib_report[@]}"
n_missing="$(grep -c '^MISSING' "$W/logs/libraries.log")"
if [ "$n_missing" = 0 ]; then st=pass; note="all found"; else st=fail; note="$(grep '^MISSING' "$W/logs/libraries.log" | awk '{print $2}' | sort -u | tr '\n' ' ')"; fi
record libraries setup 0 0 "$(elapsed "$t")" "$n_missing" "$st" "$note" "ldd bin/* mpich/*" "$W/logs/libraries.log"

# ---- the run list -----------------------------------------------------------------------------------
# name ranks timeout will_fail env program args...
# R1: 1 rank; R2: 2 ranks, NCCL build; S2, S3: 2 and 3 ranks, staged-MPI build (<name>.staged).
declare -a R1=() R2=() S2=() S3=()
while IFS= read -r line; do
  case "$line" in '#'* | '') continue ;; esac
  IFS=$'\t' read -r -a f <<<"$line"
  selected "${f[0]}" || continue
  case "${f[0]}:${f[1]}" in
    *.staged:2) S2+=("$line") ;;
    *.staged:3) S3+=("$line") ;;
    *.staged:*) ;;
    *:1) R1+=("$line") ;;
    *:2) R2+=("$line") ;;
  esac
done <"$BUNDLE/runlist.tsv"
HEADER+=("GPUs: $NGPU; run list: ${#R1[@]} 1-rank, ${#R2[@]} 2-rank (NCCL), ${#S2[@]} + ${#S3[@]} 2- and 3-rank (staged MPI) entries")

# run_entry line limit: one run-list entry under mpiexec (called in the background).
run_entry() {
  local -a f envs=()
  IFS=$'\t' read -r -a f <<<"$1"
  local name="${f[0]}" ranks="${f[1]}" tmo="${f[2]}" wf="${f[3]}" env="${f[4]}" prog="${f[5]}"
  [ "$env" = - ] || IFS=';' read -r -a envs <<<"$env"
  [ "$tmo" -gt "$2" ] && tmo="$2"
  run_step "$name" "test ${ranks} rank" "$ranks" "$tmo" "$wf" \
    env "${envs[@]}" "$MPIEXEC" -n "$ranks" "$KIT/$prog" "${f[@]:6}"
}

# pool group jobs limit entries...: the entries, `jobs` at a time, all within `limit` seconds.
pool() {
  local group="$1" jobs="$2" limit="$3"
  shift 3
  local end names=() e name
  limit="$(capped "$limit")"
  end=$(($(date +%s) + limit))
  for e in "$@"; do
    name="${e%%$'\t'*}"
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    local rem=$((end - $(date +%s)))
    if [ "$rem" -lt 5 ]; then
      printf '%s\t%s\t%s\t0\t0\t-\tskipped\tthe %s s for %s are spent\n' "$name" "$group" "$(cut -f2 <<<"$e")" "$limit" "$group" >"$W/res/$name.res"
      echo "(not run)" >"$W/res/$name.cmd"
    else
      run_entry "$e" "$rem" &
    fi
    names+=("$name")
  done
  wait
  for name in "${names[@]}"; do collect "$name"; done
}

# nccl_duplicate_gpu entry: the NCCL build's 2-rank entry on one GPU must fail at Engine
# construction on every rank, naming the shared GPU, within its limit (no hang).
nccl_duplicate_gpu() {
  local e="$1" name=nccl_duplicate_gpu
  [ -n "$e" ] && selected "$name" || return 0
  local -a f envs=()
  IFS=$'\t' read -r -a f <<<"$e"
  [ "${f[4]}" = - ] || IFS=';' read -r -a envs <<<"${f[4]}"
  run_step "$name" "test 2 ranks" 2 "$(capped 60)" 1 env "${envs[@]}" "$MPIEXEC" -n 2 "$KIT/${f[5]}" "${f[@]:6}"
  local log="$W/logs/$name.log" r ok=1 res
  for r in 0 1; do
    grep -q "use the same GPU.*(rank $r)" "$log" || ok=0
  done
  res="$(cat "$W/res/$name.res")"
  if [ "$ok" = 1 ] && grep -q $'\tpass\t' <<<"$res"; then
    res="$(awk -F'\t' -v OFS='\t' -v n="${f[0]}" '{$8 = "every rank: the shared-GPU error (" n ")"} 1' <<<"$res")"
  elif ! grep -q $'\ttimeout\t' <<<"$res"; then
    res="$(awk -F'\t' -v OFS='\t' -v n="${f[0]}" '{$7 = "fail"; $8 = "not every rank named the shared GPU (" n ")"} 1' <<<"$res")"
  fi
  printf '%s\n' "$res" >"$W/res/$name.res"
  collect "$name"
}

# ---- MPI start-up -------------------------------------------------------------------------------------
# One short 2-rank test program (test_clock_sync, else the first 2-rank test_*), run whole: MPI,
# Kokkos' CUDA start-up and the harness. (Catch2's --list-* options exit with the count, not 0.)
# The staged build's when there is one: with one GPU the NCCL build's stops at the Engine.
# first_test entries...: the test_clock_sync entry among them, else the first test_* one.
first_test() {
  local e hit=""
  for e in "$@"; do
    case "$(cut -f6 <<<"$e")" in
      bin*/test_clock_sync) hit="$e" && break ;;
      bin*/test_*) [ -n "$hit" ] || hit="$e" ;;
    esac
  done
  printf '%s' "$hit"
}
probe_entry="$(first_test "${S2[@]}")"
[ -n "$probe_entry" ] || [ "$NGPU" -lt 2 ] || probe_entry="$(first_test "${R2[@]}")"
if [ -n "$probe_entry" ] && selected mpi_probe; then
  IFS=$'\t' read -r -a pf <<<"$probe_entry"
  penv=()
  [ "${pf[4]}" = - ] || IFS=';' read -r -a penv <<<"${pf[4]}"
  run_step mpi_probe setup 2 "$(capped 60)" 0 env "${penv[@]}" "$MPIEXEC" -n 2 "$KIT/${pf[5]}" "${pf[@]:6}"
  if ! grep -q $'\tpass\t' "$W/res/mpi_probe.res"; then
    export UCX_TLS=sm,self
    run_step mpi_probe_ucx_sm setup 2 "$(capped 60)" 0 env "${penv[@]}" "$MPIEXEC" -n 2 "$KIT/${pf[5]}" "${pf[@]:6}"
    if grep -q $'\tpass\t' "$W/res/mpi_probe_ucx_sm.res"; then
      HEADER+=("MPI: UCX_TLS=sm,self (the default transports failed)")
      # The machine's transports, not the kit: no failure of its own (its log is kept).
      awk -F'\t' -v OFS='\t' '{$7 = "skipped"; $8 = "the default UCX transports failed; UCX_TLS=sm,self passed (mpi_probe_ucx_sm)"} 1' \
        "$W/res/mpi_probe.res" >"$W/res/mpi_probe.res.tmp" && mv "$W/res/mpi_probe.res.tmp" "$W/res/mpi_probe.res"
    else
      unset UCX_TLS
    fi
  fi
  collect mpi_probe
  [ -f "$W/res/mpi_probe_ucx_sm.res" ] && collect mpi_probe_ucx_sm
fi

# ---- the checks, within the budget (the limits below add up to it) ------------------------------------
step gpu_smoke gpu_smoke 1 60 "$KIT/bin/gpu_smoke"

[ ${#R1[@]} -gt 0 ] && pool "test 1 rank" "$JOBS1" 110 "${R1[@]}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
if [ ${#R2[@]} -gt 0 ] && [ "$NGPU" -ge 2 ]; then
  pool "test 2 ranks" "$JOBS2" 80 "${R2[@]}"
elif [ ${#R2[@]} -gt 0 ]; then
  dup_entry="$(first_test "${R2[@]}")"
  nccl_duplicate_gpu "$dup_entry"
  for e in "${R2[@]}"; do
    n="${e%%$'\t'*}"
    [ "$e" = "$dup_entry" ] && continue
    s_note="needs 2 GPUs: NCCL refuses two ranks on one GPU"
    grep -q "^$n.staged"$'\t' "$BUNDLE/runlist.tsv" && s_note="$s_note; ran as $n.staged"
    record "$n" "test 2 ranks" 2 0 0 "" skipped "$s_note" "(not run)" ""
  done
fi
unset NCCL_DEBUG
[ ${#S2[@]} -gt 0 ] && pool "staged 2 ranks" "$JOBS2" 150 "${S2[@]}"

# The benchmarks use every core for the host side (no OPENBLAS_NUM_THREADS=1 here).
# shellcheck disable=SC2086 # the *_ARGS variables are argument lists
step bench_inverse bench 1 30 "$KIT/bin/bench_inverse" \
  ${GPU_CHECK_BENCH_INVERSE_ARGS:---sizes 256,1024,4096 --reps 3} --json "$W/results/bench_inverse.json"
# shellcheck disable=SC2086
step bench_inverse_cuda bench 1 45 "$KIT/bin/bench_inverse" --cuda \
  ${GPU_CHECK_BENCH_INVERSE_CUDA_ARGS:---sizes 256,512,1024,2048,4096 --reps 5} \
  --json "$W/results/bench_inverse_cuda.json"
# shellcheck disable=SC2086
adasum_bin="$KIT/bin/bench_adasum"
[ "$NGPU" -lt 2 ] && [ -x "$KIT/bin-staged/bench_adasum" ] && adasum_bin="$KIT/bin-staged/bench_adasum"
# shellcheck disable=SC2086
step bench_adasum bench 2 30 env OPENBLAS_NUM_THREADS=1 "$MPIEXEC" -n 2 "$adasum_bin" \
  ${GPU_CHECK_BENCH_ADASUM_ARGS:---reps 3 --max-bytes 16777216} --json "$W/results/bench_adasum.json"
step kdist_portability bench 1 60 "$MPIEXEC" -n 1 "$KIT/bin/kdist_portability" --platform "${gpu_line%%,*} (gpu_check)" \
  --reps 3 --json "$W/results/kdist_portability.json"
if [ -f "$W/res/kdist_portability.res" ] && ! grep -q $'\tpass\t' "$W/res/kdist_portability.res"; then
  step kdist_portability_smoke bench 1 20 "$MPIEXEC" -n 1 "$KIT/bin/kdist_portability" --smoke \
    --platform gpu-check-smoke --json "$W/results/kdist_portability_smoke.json"
fi

# bash -c script: $1 the tool, $2 kp_reader, $3 the table, the rest the program run under the tool
# in this folder (where the tool writes its <host>-<pid>.dat).
# shellcheck disable=SC2016 # expanded by that bash, not this one
KERNEL_PROFILE='rm -f ./*.dat && KOKKOS_TOOLS_LIBS="$1" "${@:4}" >run.log 2>&1; rc=$?; tail -n 4 run.log
[ "$rc" = 0 ] || exit "$rc"
"$2" ./*.dat >"$3" && head -n 60 "$3"'

data=""
for d in "${GPU_CHECK_DATA:-}" /usr/share/datasets/fashion-mnist "$BUNDLE/data/fashion-mnist"; do
  if [ -n "$d" ] && [ -f "$d/train-images-idx3-ubyte.gz" ]; then
    data="$d"
    break
  fi
done
fashion_steps=(fashion_mnist fashion_mnist_cnn fashion_mnist_cnn_trace cnn_kfac_kernels cnn_sgd_kernels)
any_fashion=0
for n in "${fashion_steps[@]}"; do selected "$n" && any_fashion=1; done
if [ "$any_fashion" = 0 ]; then
  :
elif [ -z "$data" ]; then
  record fashion_mnist example 1 0 0 "" skipped \
    "no Fashion-MNIST here (/usr/share/datasets/fashion-mnist: Debian's dataset-fashion-mnist; or cuda_bundle.sh --with-data)" \
    "fashion_mnist --model mlp --optimizer kfac --epochs 1" ""
else
  step fashion_mnist example 1 75 env OPENBLAS_NUM_THREADS=1 "$MPIEXEC" -n 1 "$KIT/bin/fashion_mnist" --model mlp \
    --optimizer kfac --epochs 1 --data "$data" --log "$W/results/fashion_mnist.csv"
  step fashion_mnist_cnn example 1 90 env OPENBLAS_NUM_THREADS=1 "$MPIEXEC" -n 1 "$KIT/bin/fashion_mnist" \
    --model cnn --optimizer kfac --epochs 1 --data "$data" --log "$W/results/fashion_mnist_cnn.csv"
  step fashion_mnist_cnn_trace example 1 45 env OPENBLAS_NUM_THREADS=1 "$MPIEXEC" -n 1 "$KIT/bin/fashion_mnist" \
    --model cnn --optimizer kfac --epochs 1 --limit-batches 300 --quiet --data "$data" \
    --trace "$W/results/cnn_kfac_trace.json"
  # Every kernel and region of 200 CNN steps (K-FAC, then SGD for the convolution path alone)
  # under Kokkos Tools' simple kernel timer: it fences around each, so each time is its own.
  # kp_reader's table goes to results/cnn_<optimizer>_kernels.txt.
  for opt in kfac sgd; do
    if ! selected "cnn_${opt}_kernels"; then
      :
    elif [ ! -f "$KIT/lib/tools/kp_kernel_timer.so" ]; then
      record "cnn_${opt}_kernels" profile 1 0 0 "" skipped \
        "the bundle has no Kokkos Tools kernel timer (cuda_bundle.sh --kokkos-tools)" "(not run)" ""
    else
      step "cnn_${opt}_kernels" profile 1 40 bash -c "$KERNEL_PROFILE" kernel_profile \
        "$KIT/lib/tools/kp_kernel_timer.so" "$KIT/bin/kp_reader" "$W/results/cnn_${opt}_kernels.txt" \
        env OPENBLAS_NUM_THREADS=1 "$MPIEXEC" -n 1 "$KIT/bin/fashion_mnist" --model cnn --optimizer "$opt" \
        --epochs 1 --limit-batches 200 --quiet --data "$data"
    fi
  done
fi

# The main job against PyTorch (and kfac-pytorch) on this GPU, when the machine's python has torch
# with CUDA. The peer runs without the kit's libraries on its path (torch brings its own).
peer_python="$(command -v python3 || true)"
kfac_dir="${GPU_CHECK_KFAC_PYTORCH:-$ROOT/.peers/kfac-pytorch}"
if ! selected peers_cuda || [ -z "$data" ]; then
  :
elif [ -z "$peer_python" ] || ! env -u LD_LIBRARY_PATH "$peer_python" -c \
  'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  record peers_cuda bench 1 0 0 "" skipped "no python3 with CUDA torch here" "perf/peers/side_by_side.sh" ""
else
  printf '#!/bin/sh\nunset LD_LIBRARY_PATH\nexec %s "$@"\n' "$peer_python" >"$W/peer-python"
  chmod +x "$W/peer-python"
  kfac_args=()
  [ -d "$kfac_dir/kfac" ] && kfac_args=(--kfac-pytorch "$kfac_dir")
  step peers_cuda bench 1 "${GPU_CHECK_PEERS_LIMIT_S:-200}" env PYTHON="$W/peer-python" MPIEXEC="$MPIEXEC" \
    bash "$ROOT/perf/peers/side_by_side.sh" --ranks 1 --rounds "${GPU_CHECK_PEERS_ROUNDS:-2}" --steps 300 \
    --job "$KIT/bin/fashion_mnist" --data "$data" --peer-device cuda --timeout 60 "${kfac_args[@]}" \
    --json "$W/results/peers_cuda.json"
fi

# A rank count that is not a power of two, with what is left.
[ ${#S3[@]} -gt 0 ] && pool "staged 3 ranks" "$JOBS2" 90 "${S3[@]}"

# ---- the report ----------------------------------------------------------------------------------------
write_report
tar -czf "$OUT/logs.tar.gz" -C "$W" logs results
echo
cat "$OUT/summary.txt"
echo "gpu_check: $OUT/{gpu-check.json,summary.txt,steps.log,logs.tar.gz}"
rm -rf "$W"
[ "$N_FAIL" = 0 ] && [ "$N_TIMEOUT" = 0 ]
