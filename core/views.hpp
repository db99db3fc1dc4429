// View aliases used across kdist, and the checks every public function applies to its views.
#pragma once

#include <kdist/core/compat.hpp>
#include <kdist/core/error.hpp>

#include <Kokkos_Core.hpp>
#include <sstream>
#include <string>
#include <type_traits>

namespace kdist {

template <class T, class Space = Kokkos::DefaultExecutionSpace::memory_space>
using Vector = Kokkos::View<T*, Space>;
/// Matrices default to LayoutLeft: that is what BLAS, LAPACK and cuSOLVER take without copies.
template <class T, class Space = Kokkos::DefaultExecutionSpace::memory_space>
using Matrix = Kokkos::View<T**, Kokkos::LayoutLeft, Space>;
template <class T>
using HostVector = Kokkos::View<T*, Kokkos::HostSpace>;
template <class T>
using HostMatrix = Kokkos::View<T**, Kokkos::LayoutLeft, Kokkos::HostSpace>;

namespace impl {

template <class ExecSpace, class V>
constexpr void static_check_view() {
  static_assert(Kokkos::is_view<V>::value, "kdist: argument must be a Kokkos::View");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, typename V::memory_space>::accessible,
                "kdist: view memory space is not accessible from the execution space");
}

/// "label" (rows x cols) for error messages.
template <class V>
std::string describe(const V& v) {
  std::ostringstream os;
  os << "'" << v.label() << "' (";
  for (int r = 0; r < compat::view_rank<V>(); ++r) os << (r ? " x " : "") << v.extent(r);
  os << ")";
  return os.str();
}

template <class V>
void require_contiguous(const char* func, const V& v) {
  if (!v.span_is_contiguous()) throw_invalid(func, "view " + describe(v) + " must be contiguous");
}

template <class V>
void require_square(const char* func, const V& v) {
  if (v.extent(0) != v.extent(1)) throw_invalid(func, "matrix " + describe(v) + " must be square");
}

}  // namespace impl
}  // namespace kdist
