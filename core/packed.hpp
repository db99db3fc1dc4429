// Packed symmetric storage in LAPACK 'U' order: AP[i + j(j+1)/2] = A(i,j) for i <= j, n(n+1)/2
// elements. K-FAC factors cross the network in this form (half the bytes of the full matrix).
// pack_upper / unpack_upper (unpack_upper_triangle: the upper triangle only) take the square
// matrix and the packed vector on the caller's execution space; the two must not share storage
// (InvalidArgument naming both, nothing written), and the packed length must be n(n+1)/2.
#pragma once

#include <kdist/core/impl/entries.hpp>
#include <kdist/core/views.hpp>

#include <cstddef>
#include <string>

namespace kdist {

/// Number of elements of the packed upper triangle of an n x n matrix. The halving comes first,
/// so the result is exact whenever it fits in size_t (n up to about 6e9 with 64 bits).
KOKKOS_INLINE_FUNCTION constexpr std::size_t packed_size(std::size_t n) {
  return n % 2 == 0 ? n / 2 * (n + 1) : (n + 1) / 2 * n;
}

/// Position of A(i,j), i <= j, in packed 'U' order.
KOKKOS_INLINE_FUNCTION constexpr std::size_t packed_index(std::size_t i, std::size_t j) {
  return i + packed_size(j);
}

/// Inverse of packed_size: the n with packed_size(n) == size, for every size_t value (exact
/// integer arithmetic, no overflow); throws InvalidArgument if there is none.
std::size_t packed_dim(std::size_t size);

namespace impl {
template <class Exec, class Full, class Packed>
void check_packed_pair(const char* func, const Full& full, const Packed& packed) {
  static_check_view<Exec, Full>();
  static_check_view<Exec, Packed>();
  static_assert(compat::view_rank<Full>() == 2, "kdist: full matrix must be rank 2");
  static_assert(compat::view_rank<Packed>() == 1, "kdist: packed vector must be rank 1");
  require_square(func, full);
  if (packed.extent(0) != packed_size(full.extent(0)))
    throw_invalid(func, "packed view " + describe(packed) + " must hold n(n+1)/2 = " +
                            std::to_string(packed_size(full.extent(0))) + " elements for matrix " + describe(full));
  require_disjoint(func, full, packed);
}
}  // namespace impl

namespace impl {
// The device kernels (any execution space runs them; the tests run them on the host too).

/// pack_upper, a few packed entries per thread (copy_over_upper): reads and writes both walk down
/// the columns.
template <class ExecSpace, class Full, class Packed>
void pack_upper_entries(const ExecSpace& exec, const Full& full, const Packed& packed) {
  using T = typename Packed::non_const_value_type;
  copy_over_upper(
      "kdist::pack_upper", exec, static_cast<int>(full.extent(0)),
      KOKKOS_LAMBDA(const UpperPlace& p)->T { return full(p.i, p.j); },
      KOKKOS_LAMBDA(const UpperPlace& p, const T v) { packed(p.k) = v; });
}

/// The upper triangle of `full` from `packed`, a few entries per thread.
template <class ExecSpace, class Packed, class Full>
void unpack_upper_entries(const ExecSpace& exec, const Packed& packed, const Full& full) {
  using T = typename Full::non_const_value_type;
  copy_over_upper(
      "kdist::unpack_upper", exec, static_cast<int>(full.extent(0)),
      KOKKOS_LAMBDA(const UpperPlace& p)->T { return packed(p.k); },
      KOKKOS_LAMBDA(const UpperPlace& p, const T v) { full(p.i, p.j) = v; });
}

/// D's upper triangle (diagonal included) := S's, a few entries of the triangle per thread.
template <class ExecSpace, class SV, class DV>
void copy_upper_entries(const ExecSpace& exec, const char* label, const SV& S, const DV& D) {
  using T = typename DV::non_const_value_type;
  copy_over_upper(
      label, exec, static_cast<int>(D.extent(0)), KOKKOS_LAMBDA(const UpperPlace& p)->T { return S(p.i, p.j); },
      KOKKOS_LAMBDA(const UpperPlace& p, const T v) { D(p.i, p.j) = v; });
}

/// mirror_upper_to_lower through 32 x 32 tiles in team scratch: a team loads the upper tile
/// down its columns and stores its transpose down the lower tile's columns, so both sides are
/// read and written along memory (a thread per entry would read the upper side a row apart).
/// One team per tile on or below the diagonal; `team_size` threads (1 on a host space), each
/// loading copies_per_thread entries before it stores them into scratch.
template <class ExecSpace, class MV>
void mirror_upper_tiles(const ExecSpace& exec, const MV& M, int team_size) {
  using T = typename MV::non_const_value_type;
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Tile = Kokkos::View<T*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  constexpr int tile = 32, pitch = tile + 1;  // the pitch keeps the transposed reads off one bank
  const int n = static_cast<int>(M.extent(0));
  const int tiles = (n + tile - 1) / tile;
  Kokkos::TeamPolicy<ExecSpace> policy(exec, tiles * (tiles + 1) / 2, team_size);
  policy.set_scratch_size(0, Kokkos::PerTeam(Tile::shmem_size(tile * pitch)));
  Kokkos::parallel_for(
      "kdist::mirror_upper_to_lower", policy, KOKKOS_LAMBDA(const Team& team) {
        int tj, ti;  // the lower tile (ti, tj), ti >= tj, mirrors the upper tile (tj, ti)
        upper_entry(team.league_rank(), tj, ti);
        const int i0 = ti * tile, j0 = tj * tile;
        const Tile s(team.team_scratch(0), tile * pitch);
        // Thread t loads tile columns t / tile + r * step, r < copies_per_thread, all before storing.
        constexpr int step = tile / copies_per_thread;
        static_assert(tile % copies_per_thread == 0, "kdist: a tile's columns split evenly among the copies");
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tile * step), [&](const int t) {
          const int a = t % tile;  // upper entries (j0 + a, i0 + b)
          T v[copies_per_thread] = {};
          for (int r = 0, b = t / tile; r < copies_per_thread; ++r, b += step)
            if (j0 + a < n && i0 + b < n) v[r] = M(j0 + a, i0 + b);
          for (int r = 0, b = t / tile; r < copies_per_thread; ++r, b += step) s(a + pitch * b) = v[r];
        });
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tile * tile), [&](const int t) {
          const int a = t % tile, b = t / tile;  // lower entry (i0 + a, j0 + b)
          const int i = i0 + a, j = j0 + b;
          if (i < n && j < n && i > j) M(i, j) = s(b + pitch * a);
        });
      });
}

/// Threads per team of mirror_upper_tiles on ExecSpace.
template <class ExecSpace>
constexpr int mirror_team_size() {
  return runs_on_host<ExecSpace>() ? 1 : 256;
}
}  // namespace impl

/// Copy the upper triangle of the square matrix `full` into `packed`.
template <class ExecSpace, class Full, class Packed>
void pack_upper(const ExecSpace& exec, const Full& full, const Packed& packed) {
  impl::check_packed_pair<ExecSpace>("kdist::pack_upper", full, packed);
  const int n = static_cast<int>(full.extent(0));
  if constexpr (!impl::runs_on_host<ExecSpace>()) {
    impl::pack_upper_entries(exec, full, packed);
  } else {
    // One pass over the packed vector: thread t handles the column j it falls in.
    Kokkos::parallel_for(
        "kdist::pack_upper", Kokkos::RangePolicy<ExecSpace>(exec, 0, n), KOKKOS_LAMBDA(const int j) {
          const std::size_t base = packed_index(0, j);
          for (int i = 0; i <= j; ++i) packed(base + i) = full(i, j);
        });
  }
}

/// M(i,j) := M(j,i) for i > j: LAPACK and gemm results are made exactly symmetric. Works in
/// square tiles so both the row reads and the column writes stay in cache.
template <class ExecSpace, class MV>
void mirror_upper_to_lower(const ExecSpace& exec, const MV& M) {
  constexpr int tile = 64;
  const int n = static_cast<int>(M.extent(0));
  const int tiles = (n + tile - 1) / tile;
  if constexpr (!impl::runs_on_host<ExecSpace>()) {
    impl::mirror_upper_tiles(exec, M, impl::mirror_team_size<ExecSpace>());
  } else if constexpr (std::is_same<typename MV::array_layout, Kokkos::LayoutLeft>::value) {
    // Through the raw column-major storage: the loops keep the pointer in a register (through
    // the view, Kokkos 3.4 Serial reloaded it on every element).
    const std::size_t ld = M.stride(1);
    auto* const data = M.data();
    Kokkos::parallel_for(
        "kdist::mirror_upper_to_lower", Kokkos::RangePolicy<ExecSpace>(exec, 0, tiles), KOKKOS_LAMBDA(const int tj) {
          auto* const a = data;
          const int j0 = tj * tile, j1 = j0 + tile < n ? j0 + tile : n;
          for (int i0 = j0; i0 < n; i0 += tile) {
            const int i1 = i0 + tile < n ? i0 + tile : n;
            for (int j = j0; j < j1; ++j)
              for (int i = (i0 > j + 1 ? i0 : j + 1); i < i1; ++i) a[i + j * ld] = a[j + i * ld];
          }
        });
  } else {
    Kokkos::parallel_for(
        "kdist::mirror_upper_to_lower", Kokkos::RangePolicy<ExecSpace>(exec, 0, tiles), KOKKOS_LAMBDA(const int tj) {
          const int j0 = tj * tile, j1 = j0 + tile < n ? j0 + tile : n;
          for (int i0 = j0; i0 < n; i0 += tile) {
            const int i1 = i0 + tile < n ? i0 + tile : n;
            for (int j = j0; j < j1; ++j)
              for (int i = (i0 > j + 1 ? i0 : j + 1); i < i1; ++i) M(i, j) = M(j, i);
          }
        });
  }
}

namespace impl {
/// Columns j of `packed` into the upper triangle of `full`, contiguous pieces (checked by callers).
template <class ExecSpace, class Packed, class Full>
void unpack_columns(const ExecSpace& exec, const Packed& packed, const Full& full) {
  const int n = static_cast<int>(full.extent(0));
  if constexpr (!runs_on_host<ExecSpace>()) {
    unpack_upper_entries(exec, packed, full);
  } else {
    Kokkos::parallel_for(
        "kdist::unpack_upper", Kokkos::RangePolicy<ExecSpace>(exec, 0, n), KOKKOS_LAMBDA(const int j) {
          const std::size_t base = packed_index(0, j);
          for (int i = 0; i <= j; ++i) full(i, j) = packed(base + i);
        });
  }
}
}  // namespace impl

/// Fill the upper triangle of the square matrix `full` from `packed`; the strictly lower triangle
/// is not written (for readers of the upper one only: syrk/potrf/syevd with 'U', pack_upper).
template <class ExecSpace, class Packed, class Full>
void unpack_upper_triangle(const ExecSpace& exec, const Packed& packed, const Full& full) {
  impl::check_packed_pair<ExecSpace>("kdist::unpack_upper_triangle", full, packed);
  impl::unpack_columns(exec, packed, full);
}

/// Fill the square matrix `full` from `packed`: the upper triangle, then the tiled mirror fills
/// the lower one.
template <class ExecSpace, class Packed, class Full>
void unpack_upper(const ExecSpace& exec, const Packed& packed, const Full& full) {
  impl::check_packed_pair<ExecSpace>("kdist::unpack_upper", full, packed);
  impl::unpack_columns(exec, packed, full);
  mirror_upper_to_lower(exec, full);
}

template <class Full, class Packed>
void pack_upper(const Full& full, const Packed& packed) {
  pack_upper(typename Full::execution_space{}, full, packed);
}
template <class Packed, class Full>
void unpack_upper(const Packed& packed, const Full& full) {
  unpack_upper(typename Full::execution_space{}, packed, full);
}

}  // namespace kdist
