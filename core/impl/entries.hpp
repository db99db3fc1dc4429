// Element-wise kernels over a matrix's entries, for execution spaces that are not the host's.
// The host kernels of core/ and kfac/ give each thread a column and loop over its rows (the
// loop vectorises, the column stays in cache). On a GPU that leaves a few thousand threads,
// each walking thousands of entries, with neighbouring threads a column apart in memory: the
// first run on an H200 measured unpack_upper at 1 GB/s and the triangle mirror at most of an
// inverse's time. There, kernels run one thread per entry, the fastest index along the view's
// contiguous one; over a triangle, one thread per entry of the triangle (upper_entries: no idle
// half, neighbouring threads on neighbouring rows of a column). Copies run a few entries per
// thread, their loads issued before their stores (for_copies). Sums along a long dimension (a
// bias gradient over a batch's rows) run a team per sum, its threads along the terms.
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

/// Entries a device thread copies at once (for_copies). A thread that loads one entry and stores it
/// keeps one load in flight; if the rate is then the bytes in flight over the memory's latency
/// rather than the bus, four loads a thread raise it. The reading is a hypothesis from the H200 kit
/// run: the one-entry-per-thread copy kernel moved 1622 GB/s on 256 MiB arrays, the triad (two
/// loads a thread) read twice as fast, and cudaMemcpy moved 3510 GB/s on 102 MB ones;
/// bandwidth.hpp's copy_wide, this form, tests it on the next run.
constexpr int copies_per_thread = 4;

/// for_copies' work item: thread t copies entries t + r m, r < copies_per_thread (m the thread
/// count), so that each of a warp's loads and stores is to neighbouring entries; it issues every
/// load before its first store, which the compiler may not reorder (the views may alias).
template <class Where, class Load, class Store>
struct Copies {
  Where where;
  Load load;
  Store store;
  std::int64_t count, threads;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t t) const {
    using Place = std::decay_t<decltype(where(t))>;
    using T = std::decay_t<decltype(load(where(t)))>;
    Place at[copies_per_thread] = {};
    T value[copies_per_thread] = {};
    for (int r = 0; r < copies_per_thread; ++r)
      if (t + r * threads < count) {
        at[r] = where(t + r * threads);
        value[r] = load(at[r]);
      }
    for (int r = 0; r < copies_per_thread; ++r)
      if (t + r * threads < count) store(at[r], value[r]);
  }
};

/// For every entry e < count: store(p, load(p)) with p = where(e), copies_per_thread entries per
/// thread. `where` turns the entry number into what load and store index with (p a plain struct).
template <class ExecSpace, class Where, class Load, class Store>
void for_copies(const char* label, const ExecSpace& exec, std::int64_t count, const Where& where, const Load& load,
                const Store& store) {
  const std::int64_t threads = (count + copies_per_thread - 1) / copies_per_thread;
  Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, threads),
                       Copies<Where, Load, Store>{where, load, store, count, threads});
}

/// An entry of the upper triangle: its row, column and packed 'U' index.
struct UpperPlace {
  int i = 0, j = 0;
  std::int64_t k = 0;
};
struct UpperWhere {
  KOKKOS_INLINE_FUNCTION UpperPlace operator()(const std::int64_t k) const {
    UpperPlace p;
    upper_entry(k, p.i, p.j);
    p.k = k;
    return p;
  }
};

/// store(p, load(p)) for every entry p of the upper triangle of an n x n matrix (for_copies).
template <class ExecSpace, class Load, class Store>
void copy_over_upper(const char* label, const ExecSpace& exec, int n, const Load& load, const Store& store) {
  const std::int64_t m = n;
  for_copies(label, exec, m * (m + 1) / 2, UpperWhere{}, load, store);
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
