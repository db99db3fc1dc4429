// Kokkos 3.4 (Debian's Trilinos build) vs Kokkos 4.x: every difference kdist relies on is
// bridged here, so the rest of the code is written once (docs/architecture.md §5).
#pragma once

#include <Kokkos_Core.hpp>
#include <cmath>
#include <string>

namespace kdist {
namespace compat {

/// Fence one execution-space instance; the label is used where Kokkos accepts one (3.6+).
template <class ExecSpace>
void fence(const ExecSpace& exec, const char* label) {
#if KOKKOS_VERSION >= 30600
  exec.fence(label);
#else
  (void)label;
  exec.fence();
#endif
}

/// Device-callable exponential and natural logarithm (Kokkos::exp is 3.7+, Experimental:: is gone in
/// 4.3).
template <class T>
KOKKOS_INLINE_FUNCTION T exp(T x) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::exp(x);
#else
  return Kokkos::Experimental::exp(x);
#endif
}
template <class T>
KOKKOS_INLINE_FUNCTION T log(T x) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::log(x);
#else
  return Kokkos::Experimental::log(x);
#endif
}

/// Device-callable finiteness test (std::isfinite is host-only; x - x is NaN for Inf and NaN).
template <class T>
KOKKOS_INLINE_FUNCTION bool isfinite(T x) {
  return (x - x) == T(0);
}

/// Rank of a view type as an int (View::rank() is a call only in 4.x).
template <class V>
constexpr int view_rank() {
  return static_cast<int>(V::rank);
}

}  // namespace compat
}  // namespace kdist
