// What every reference layer of kdist::nn shares: the tensor aliases, a named (parameter,
// gradient) pair for the optimizer, and two small view utilities.
//
//   Tensor1/2/4<T, Mem>       View<T*>, View<T**, LayoutRight>, View<T****, LayoutRight> in Mem:
//                             batch-major like PyTorch (rows = samples, NCHW for images).
//   ConstTensor2/4<T, Mem>    the same with const elements: what a layer reads.
//   Labels<Mem>               View<const int*, Mem>, one class index per sample.
//   Parameter<T, Mem>         {name, value, gradient}: rank-1 views over a layer's weight or bias
//                             and its gradient (same size). They do not own the storage: the layer
//                             that handed them out must outlive whoever keeps them (nn::SGD).
//   flat(func, v)             a rank-1 view over every element of a contiguous view, in storage
//                             order (row-major for LayoutRight); InvalidArgument naming func and
//                             the view when v is not contiguous. Not owning either.
//   impl::ensure(exec, v, label, n0, ...)
//                             reallocates v (uninitialised, on exec) unless it has these extents:
//                             the layers' scratch and caches, reused across batches of one size.
// Nothing here launches a kernel or touches a device view's elements from the host.
#pragma once

#include <kdist/core/compat.hpp>
#include <kdist/core/views.hpp>

#include <Kokkos_Core.hpp>
#include <array>
#include <cstddef>
#include <string>
#include <utility>

namespace kdist {
namespace nn {
namespace impl {
// The view checks of core (kdist/core/views.hpp), spelled impl:: inside kdist::nn too.
using kdist::impl::describe;
using kdist::impl::require_contiguous;
using kdist::impl::require_disjoint;
using kdist::impl::require_extents;
using kdist::impl::throw_invalid;
}  // namespace impl

template <class T, class Mem>
using Tensor1 = Kokkos::View<T*, Mem>;
template <class T, class Mem>
using Tensor2 = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
template <class T, class Mem>
using Tensor4 = Kokkos::View<T****, Kokkos::LayoutRight, Mem>;
template <class T, class Mem>
using ConstTensor2 = Kokkos::View<const T**, Kokkos::LayoutRight, Mem>;
template <class T, class Mem>
using ConstTensor4 = Kokkos::View<const T****, Kokkos::LayoutRight, Mem>;
template <class Mem>
using Labels = Kokkos::View<const int*, Mem>;

/// One trainable tensor for an optimizer: its values and its gradient, flattened.
template <class T, class Mem>
struct Parameter {
  std::string name;
  Tensor1<T, Mem> value;
  Kokkos::View<const T*, Mem> gradient;
};

/// Every element of the contiguous view v as a rank-1 view of the same storage (not owning it).
template <class V>
Kokkos::View<typename V::value_type*, typename V::memory_space> flat(const char* func, const V& v) {
  static_assert(Kokkos::is_view<V>::value, "kdist::nn::flat: argument must be a Kokkos::View");
  impl::require_contiguous(func, v);
  return Kokkos::View<typename V::value_type*, typename V::memory_space>(v.data(), v.size());
}

namespace impl {

/// Elements per work item of an element-wise kernel: a host space runs a block with the loop in
/// the body, on locals, so that it vectorises (Kokkos 3.4 Serial's per-element dispatch did not:
/// one scalar element and a branch per call); a device space one element per thread.
template <class ExecSpace>
constexpr std::size_t elementwise_block() {
  return Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible ? 4096 : 1;
}
template <class F, std::size_t Block>
struct Blocks {
  F f;
  std::size_t n;
  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t t) const {
    const std::size_t begin = t * Block, end = begin + Block < n ? begin + Block : n;
    f(begin, end);
  }
};
/// f(begin, end) for consecutive blocks of [0, n).
template <class ExecSpace, class F>
void for_blocks(const char* name, const ExecSpace& exec, std::size_t n, const F& f) {
  constexpr std::size_t block = elementwise_block<ExecSpace>();
  Kokkos::parallel_for(name, Kokkos::RangePolicy<ExecSpace>(exec, 0, (n + block - 1) / block), Blocks<F, block>{f, n});
}

template <class ExecSpace>
using Policy2 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<int>>;

/// The MDRange over every index of a rank-2 view (rank 4: kdist::impl::for_each_nchw).
template <class ExecSpace, class V>
auto over(const ExecSpace& exec, const V& v) {
  static_assert(compat::view_rank<V>() == 2, "kdist::nn::impl::over: rank-2 views");
  return Policy2<ExecSpace>(exec, {0, 0}, {static_cast<int>(v.extent(0)), static_cast<int>(v.extent(1))});
}

/// The extents of v, as require_extents takes them.
template <class V>
std::array<std::size_t, compat::view_rank<V>()> extents_of(const V& v) {
  std::array<std::size_t, compat::view_rank<V>()> e;
  for (int r = 0; r < compat::view_rank<V>(); ++r) e[r] = v.extent(r);
  return e;
}

/// v := a fresh uninitialised view of extents n... unless it already has them.
template <class ExecSpace, class V, class... N>
void ensure(const ExecSpace& exec, V& v, const std::string& label, N... n) {
  static_assert(sizeof...(N) == compat::view_rank<V>(), "kdist::nn::impl::ensure: one extent per rank");
  const std::array<std::size_t, sizeof...(N)> want{static_cast<std::size_t>(n)...};
  bool same = true;
  for (std::size_t r = 0; r < want.size(); ++r) same = same && v.extent(r) == want[r];
  if (same && v.data() != nullptr) return;
  v = V();  // free first: the peak is the new size only
  v = V(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, label), static_cast<std::size_t>(n)...);
}

/// ensure() with the extents of `like`.
template <class ExecSpace, class V, class Like, std::size_t... R>
void ensure_like(const ExecSpace& exec, V& v, const std::string& label, const Like& like, std::index_sequence<R...>) {
  ensure(exec, v, label, like.extent(R)...);
}
template <class ExecSpace, class V, class Like>
void ensure_like(const ExecSpace& exec, V& v, const std::string& label, const Like& like) {
  ensure_like(exec, v, label, like, std::make_index_sequence<compat::view_rank<Like>()>());
}

}  // namespace impl
}  // namespace nn
}  // namespace kdist
