// Which BLAS the host calls go to, and whether it runs kernels this CPU outgrows.
//
// kdist's host products, syrk, trsm and inverses go to the system BLAS and LAPACK (on Debian, the
// libblas.so.3 alternative, usually OpenBLAS). OpenBLAS picks its kernels for the CPU when it
// loads; a release older than the CPU does not know it and falls back to its oldest x86-64 kernels
// (Debian 12's 0.3.21 runs "Prescott", SSE3, on Emerald Rapids), 2-4x slower for every product.
// The choice is made at load time from OPENBLAS_CORETYPE, so a program can only report it: the
// jobs and benchmarks print host_blas().summary() and store it with their figures.
//
// host_blas() never throws. `library` is "OpenBLAS" when its entry points are found in the
// process, else "unknown" (reference BLAS, BLIS, MKL: nothing is known of their kernels);
// `config` is OpenBLAS's build string, `core` the kernels it runs. `advice` is empty unless the
// core is one of OpenBLAS's pre-AVX fallbacks while this CPU has AVX2 and FMA: it then names the
// OPENBLAS_CORETYPE to set (SkylakeX with AVX-512 F/BW/DQ/VL, else Haswell) and why.
#pragma once

#include <string>

namespace kdist {

struct HostBlas {
  std::string library = "unknown";  ///< "OpenBLAS" or "unknown"
  std::string config;               ///< OpenBLAS's openblas_get_config(), else empty
  std::string core;                 ///< OpenBLAS's openblas_get_corename(), else empty
  std::string advice;               ///< non-empty: the kernels in use are older than this CPU

  /// One line: "OpenBLAS 0.3.21 ..., core Prescott" (plus the advice when there is one).
  std::string summary() const;
};

/// Looked up once per call (cheap: two symbol lookups and a CPUID).
HostBlas host_blas();

/// The advice host_blas() gives when OpenBLAS runs core `core` (any case) on this CPU.
std::string openblas_core_advice(const std::string& core);

}  // namespace kdist
