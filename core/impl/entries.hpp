// Element-wise kernels over a matrix's entries, for execution spaces that are not the host's.
// The host kernels of core/ and kfac/ give each thread a column and loop over its rows (the
// loop vectorises, the column stays in cache). On a GPU that leaves a few thousand threads,
// each walking thousands of entries, with neighbouring threads a column apart in memory: the
// first run on an H200 measured unpack_upper at 1 GB/s and the triangle mirror at most of an
// inverse's time. There, kernels run one thread per entry, the fastest index along the view's
// contiguous one.
#pragma once

#include <Kokkos_Core.hpp>
#include <type_traits>

namespace kdist {
namespace impl {

/// True for execution spaces that run on the host (Serial, OpenMP, Threads).
template <class ExecSpace>
constexpr bool runs_on_host() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;
}

/// One index pair (i, j) per entry of a rows x cols matrix of layout `Layout`: i fastest for
/// LayoutLeft (and strided layouts), j fastest for LayoutRight.
template <class Layout, class ExecSpace>
auto entries(const ExecSpace& exec, int rows, int cols) {
  constexpr Kokkos::Iterate order =
      std::is_same<Layout, Kokkos::LayoutRight>::value ? Kokkos::Iterate::Right : Kokkos::Iterate::Left;
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2, order, order>, Kokkos::IndexType<int>>;
  return Policy(exec, {0, 0}, {rows, cols});
}

}  // namespace impl
}  // namespace kdist
