// Element-wise kernels over a matrix's entries, for execution spaces that are not the host's.
// The host kernels of core/ and kfac/ give each thread a column and loop over its rows (the
// loop vectorises, the column stays in cache). On a GPU that leaves a few thousand threads,
// each walking thousands of entries, with neighbouring threads a column apart in memory: the
// first run on an H200 measured unpack_upper at 1 GB/s and the triangle mirror at most of an
// inverse's time. There, kernels run one thread per entry, the fastest index along the view's
// contiguous one; over a triangle, one thread per entry of the triangle (upper_entries: no idle
// half, neighbouring threads on neighbouring rows of a column). Sums along a long dimension
// (a bias gradient over a batch's rows) run a team per sum, its threads along the terms.
#pragma once

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
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

/// One index k per entry (i, j), i <= j, of the upper triangle of an n x n matrix, in packed 'U'
/// order (column by column, k = i + j(j+1)/2); upper_entry turns k back into (i, j).
template <class ExecSpace>
auto upper_entries(const ExecSpace& exec, int n) {
  const std::int64_t m = n;
  return Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, m * (m + 1) / 2);
}

/// (i, j) of the packed 'U' index k: j is the largest with j(j+1)/2 <= k. The square root is
/// within one of it for any k below 2^53; the two loops correct the rounding.
KOKKOS_INLINE_FUNCTION void upper_entry(const std::int64_t k, int& i, int& j) {
  std::int64_t c = static_cast<std::int64_t>((::sqrt(8.0 * static_cast<double>(k) + 1.0) - 1.0) / 2.0);
  while (c * (c + 1) / 2 > k) --c;
  while ((c + 1) * (c + 2) / 2 <= k) ++c;
  j = static_cast<int>(c);
  i = static_cast<int>(k - c * (c + 1) / 2);
}

/// Calls f(i, j, k) once per entry of the upper triangle, one thread each (k its packed index).
template <class F>
struct UpperEntries {
  F f;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t k) const {
    int i, j;
    upper_entry(k, i, j);
    f(i, j, k);
  }
};
template <class ExecSpace, class F>
void for_upper_entries(const char* label, const ExecSpace& exec, int n, const F& f) {
  Kokkos::parallel_for(label, upper_entries(exec, n), UpperEntries<F>{f});
}

/// store(j, Σ_{r < terms} term(j, r)) for each j < count: a team per j, its threads along r (a
/// tree of partial sums, not a chain of `terms` additions in one thread), store called by one
/// thread of the team. The sum has term's value type.
template <class ExecSpace, class Term, class Store>
void for_team_sums(const char* label, const ExecSpace& exec, int count, int terms, const Term& term,
                   const Store& store) {
  using T = std::decay_t<decltype(term(0, 0))>;
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Kokkos::parallel_for(
      label, Kokkos::TeamPolicy<ExecSpace>(exec, count, Kokkos::AUTO), KOKKOS_LAMBDA(const Team& team) {
        const int j = team.league_rank();
        T sum = T(0);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, terms), [&](const int r, T& s) { s += term(j, r); }, sum);
        Kokkos::single(Kokkos::PerTeam(team), [&] { store(j, sum); });
      });
}

}  // namespace impl
}  // namespace kdist
