// View aliases used across kdist, and the checks every public function applies to its views.
//
// Contract of the checks (namespace kdist::impl), used by every public kernel:
//   static_check_view<Exec, V>()  compile time: V is a View whose memory space Exec can access.
//   describe(v)                   "'label' (rows x cols)", the form every error message uses.
//   require_contiguous / require_square(func, v)
//   require_extents(func, v, {e0, e1, ...}, why)
//                                 throws "<func>: view 'label' (extents) must be e0 x e1 ... <why>"
//                                 unless v has exactly those extents.
//   spans_overlap(a, b)           true when the byte ranges [data(), data() + span()) of a and b
//                                 intersect. span(), not the extent product, so padded, strided
//                                 and sub-views are covered; empty views overlap nothing. It is
//                                 conservative: two disjoint interleaved column sets of one
//                                 matrix count as overlapping.
//   require_disjoint(func, a, b)  throws InvalidArgument naming both views (label, extents) when
//                                 they overlap. Every kernel whose outputs must not share storage
//                                 with its inputs or each other calls it before writing anything.
// Every check throws kdist::InvalidArgument("<func>: ...") and writes nothing.
#pragma once

#include <kdist/core/compat.hpp>
#include <kdist/core/error.hpp>

#include <Kokkos_Core.hpp>
#include <array>
#include <cstddef>
#include <cstdint>
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

/// 'label' (rows x cols) for error messages; an unmanaged view has no label.
template <class V>
std::string describe(const V& v) {
  std::ostringstream os;
  if (v.label().empty())
    os << "unlabelled view (";
  else
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

/// Throws InvalidArgument unless v.extent(r) == expected[r] for every r; `why` names what the
/// extents mean and where they come from ("(rows x inputs) for Dense(4, 3, bias)").
template <class V>
void require_extents(const char* func, const V& v, const std::array<std::size_t, compat::view_rank<V>()>& expected,
                     const std::string& why) {
  bool same = true;
  std::ostringstream want;
  for (int r = 0; r < compat::view_rank<V>(); ++r) {
    same = same && v.extent(r) == expected[r];
    want << (r ? " x " : "") << expected[r];
  }
  if (!same) throw_invalid(func, "view " + describe(v) + " must be " + want.str() + " " + why);
}

/// Whether the storage of a and b shares any byte (addresses compared as integers: the views may
/// be unrelated allocations, and on CUDA all spaces share one virtual address space).
template <class A, class B>
bool spans_overlap(const A& a, const B& b) {
  if (a.span() == 0 || b.span() == 0) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data());
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data());
  const std::uintptr_t a1 = a0 + a.span() * sizeof(typename A::value_type);
  const std::uintptr_t b1 = b0 + b.span() * sizeof(typename B::value_type);
  return a0 < b1 && b0 < a1;
}

/// Throws InvalidArgument naming both views when they share storage. Called with an input and an
/// output (the input is never written), or with two outputs.
template <class A, class B>
void require_disjoint(const char* func, const A& a, const B& b) {
  if (spans_overlap(a, b))
    throw_invalid(func, "views " + describe(a) + " and " + describe(b) +
                            " share storage; an output must not overlap an input or another output");
}

}  // namespace impl
}  // namespace kdist
