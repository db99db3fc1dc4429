#include <kdist/core/host_blas.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <string>

namespace kdist {
namespace {

// OpenBLAS's x86 cores without AVX (driver/others/dynamic.c): what it falls back to on a CPU it
// does not know. A CPU with AVX2 and FMA runs Haswell's kernels at least.
bool pre_avx_core(std::string core) {
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* old : {"katmai", "coppermine", "northwood", "prescott", "banias", "core2", "penryn", "dunnington",
                          "nehalem", "atom", "opteron", "opteron_sse3", "barcelona", "nano"})
    if (core == old) return true;
  return false;
}

std::string suggested_core() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return {};
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  return "Haswell";
#else
  return {};
#endif
}

template <class F>
F lookup(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

std::string HostBlas::summary() const {
  std::string s = library == "OpenBLAS" ? config + ", core " + core : std::string("host BLAS: unknown library");
  if (!advice.empty()) s += "; " + advice;
  return s;
}

HostBlas host_blas() {
  HostBlas b;
  using Text = char* (*)();
  const Text config = lookup<Text>("openblas_get_config"), corename = lookup<Text>("openblas_get_corename");
  if (config == nullptr || corename == nullptr) return b;
  b.library = "OpenBLAS";
  b.config = config();
  b.core = corename();
  b.advice = openblas_core_advice(b.core);
  return b;
}

std::string openblas_core_advice(const std::string& core) {
  if (!pre_avx_core(core)) return {};
  const std::string better = suggested_core();
  if (better.empty()) return {};
  return "this CPU has AVX2 and FMA (" + better + "'s kernels run 2-4x faster): set OPENBLAS_CORETYPE=" + better +
         " in the environment of every rank";
}

}  // namespace kdist
