// im2col and col2im on a host space, as kdist/core/im2col.hpp's contract states them. Into and
// from a LayoutLeft patch matrix: through a zero-padded copy of each (image, channel) plane in team
// scratch where it fits and there are planes for every thread (im2col_plane_runs,
// col2im_plane_runs), otherwise clipped runs, a patch column or an input row a work item
// (im2col_column_runs, col2im_row_runs); im2col_columns and col2im_columns pick, with the
// measurements behind the choice. im2col_rows fills a patch matrix of any other layout. Each
// element of dx receives its terms in (p, q) order whichever col2im kernel runs.
#pragma once

#include <kdist/core/conv2d_geometry.hpp>
#include <kdist/core/impl/nchw_rows.hpp>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kdist {
namespace impl {

/// The output columns j whose input column j*S - P + q lies in [0, W): [begin, end), clamped to
/// [0, OW]. One pair of divisions, none when the stride is 1.
struct InsideColumns {
  int begin, end;
  KOKKOS_INLINE_FUNCTION InsideColumns(int q, int S, int P, int W, int OW) {
    const int lo = P - q, hi = W + P - q;  // j*S in [lo, hi)
    begin = lo <= 0 ? 0 : (S == 1 ? lo : (lo + S - 1) / S);
    end = hi <= 0 ? 0 : (S == 1 ? hi : (hi + S - 1) / S);
    end = end < OW ? end : OW;
    begin = begin < end ? begin : end;
  }
};

/// Calls f(b, c, pad) once per (image b, channel c) plane on a host space, a team of one whose
/// scratch `pad` holds (H + 2P) x (W + 2P) entries (unset). im2col and col2im keep a zero-padded
/// copy of the plane there, so that a patch column's runs along j (as long as an output row) need
/// no bounds test per entry or per run.
template <class T, class ExecSpace, class F>
void for_padded_planes(const char* func, const ExecSpace& exec, const Conv2dGeometry& g, const F& f) {
  using Scratch = Kokkos::View<T*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  const std::size_t size = std::size_t(g.height + 2 * g.padding) * std::size_t(g.width + 2 * g.padding);
  const int C = g.channels;
  Policy policy(exec, g.batch * C, 1);
  policy.set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(size)));
  Kokkos::parallel_for(
      func, policy, KOKKOS_LAMBDA(const typename Policy::member_type& team) {
        const int b = team.league_rank() / C;
        f(b, team.league_rank() - b * C, Scratch(team.team_scratch(0), size).data());
      });
}

/// Entries of the largest padded plane for_padded_planes takes (256 KiB of floats: the scratch
/// is per thread and stays allocated).
constexpr long long kPaddedPlaneEntries = 1 << 16;
/// Whether im2col and col2im may run through padded planes: the plane fits kPaddedPlaneEntries
/// and there are planes enough for every thread of `exec`.
template <class ExecSpace>
bool padded_planes_fit(const ExecSpace& exec, const Conv2dGeometry& g) {
  const long long entries = (g.height + 2LL * g.padding) * (g.width + 2LL * g.padding);
  return entries <= kPaddedPlaneEntries && planes_suffice(exec, g.batch, g.channels);
}

/// n zeros from `at` on.
template <class T>
KOKKOS_INLINE_FUNCTION void zero_run(T* at, int n) {
  for (int e = 0; e < n; ++e) at[e] = T(0);
}
/// to[j·stride] += from[j] for j < n: one run of a patch column summed into a padded row. `to` and
/// `from` are pointers or nchw_row()'s row of another layout.
template <class To, class From>
KOKKOS_INLINE_FUNCTION void add_run(const To& to, int stride, const From& from, int n) {
  if (stride == 1) {
    for (int j = 0; j < n; ++j) to[j] += from[j];
  } else {
    for (int j = 0; j < n; ++j) to[j * stride] += from[j];
  }
}
/// to[j] := from[j·stride] for j < n. Between two arrays of one type a stride-1 run is a memcpy:
/// the C library picks the widest vectors this CPU runs, where this code is built for baseline
/// x86-64 (SSE2); im2col's runs are an output row, 14-28 floats in the CNN.
template <class To, class From>
KOKKOS_INLINE_FUNCTION void gather_run(const To& to, const From& from, int stride, int n) {
  using Same =
      std::is_same<std::remove_const_t<std::remove_pointer_t<To>>, std::remove_const_t<std::remove_pointer_t<From>>>;
  if constexpr (std::is_pointer_v<To> && std::is_pointer_v<From> && Same::value) {
    if (stride == 1) {
      std::memcpy(to, from, sizeof(*to) * static_cast<std::size_t>(n));
      return;
    }
  }
  if (stride == 1) {
    for (int j = 0; j < n; ++j) to[j] = from[j];
  } else {
    for (int j = 0; j < n; ++j) to[j] = from[j * stride];
  }
}

/// im2col into a LayoutLeft patch matrix on a host space, a work item per (column k, image b):
/// for each output row i, an input row segment along j (contiguous when the stride is 1) and the
/// padding around it, clipped run by run. For planes too large for scratch, or too few planes for
/// the host's threads.
template <class ExecSpace, class XView, class PView>
void im2col_column_runs(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                        const PView& patches) {
  using T = typename PView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w, B = g.batch;
  const int H = g.height, W = g.width, S = g.stride, P = g.padding;
  Kokkos::parallel_for(
      func, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int>>(exec, 0, g.patch() * B), KOKKOS_LAMBDA(const int t) {
        const int b = t % B, k = t / B;
        const int q = k % KW, p = (k / KW) % KH, c = k / (KW * KH);
        const InsideColumns inside(q, S, P, W, OW);
        for (int i = 0, r0 = b * OH * OW; i < OH; ++i, r0 += OW) {
          const int h = i * S - P + p;
          const bool row_inside = h >= 0 && h < H;
          const int begin = row_inside ? inside.begin : OW, end = row_inside ? inside.end : OW;
          T* const column = &patches(r0, k);  // LayoutLeft: contiguous over the rows
          for (int j = 0; j < begin; ++j) column[j] = T(0);
          if (row_inside) {
            const auto in = nchw_row(x, b, c, h);
            if (S == 1) {
              for (int j = begin; j < end; ++j) column[j] = T(in[j - P + q]);
            } else {
              for (int j = begin; j < end; ++j) column[j] = T(in[j * S - P + q]);
            }
          }
          for (int j = end; j < OW; ++j) column[j] = T(0);
        }
      });
}

/// im2col into a LayoutLeft patch matrix on a host space: column k is contiguous over the rows
/// (b, i, j). One work item per (image b, channel c) copies the channel into its padded plane,
/// then writes the channel's kh·kw columns, each as out_h runs of out_w entries read from the
/// plane. Faster than per-column work items that clipped every run to the input (2.5 against
/// 3.9 ms a step for the CNN's second convolution; docs/performance.md).
template <class ExecSpace, class XView, class PView>
void im2col_plane_runs(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                       const PView& patches) {
  using T = typename PView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w;
  const int H = g.height, W = g.width, S = g.stride, P = g.padding, PH = H + 2 * P, PW = W + 2 * P;
  for_padded_planes<T>(
      func, exec, g, KOKKOS_LAMBDA(const int b, const int c, T* const pad) {
        zero_run(pad, PH * PW);
        for (int h = 0; h < H; ++h) gather_run(pad + (h + P) * PW + P, nchw_row(x, b, c, h), 1, W);
        for (int p = 0; p < KH; ++p)
          for (int q = 0; q < KW; ++q) {
            T* const column = &patches(b * OH * OW, (c * KH + p) * KW + q);  // LayoutLeft: contiguous
            for (int i = 0; i < OH; ++i) gather_run(column + i * OW, pad + (i * S + p) * PW + q, S, OW);
          }
      });
}

/// im2col into a LayoutLeft patch matrix on a host space: through padded planes where they fit.
template <class ExecSpace, class XView, class PView>
void im2col_columns(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                    const PView& patches) {
  if (padded_planes_fit(exec, g))
    im2col_plane_runs(exec, func, g, x, patches);
  else
    im2col_column_runs(exec, func, g, x, patches);
}

/// col2im from a LayoutLeft patch matrix on a host space, row by row: each input row (b, c, h)
/// sums, for each kernel row p that reads it (one division per p), the kernel columns' contiguous
/// runs along j, clipped to the row; a row's kh·kw runs are read side by side.
template <class ExecSpace, class PView, class XView>
void col2im_row_runs(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const PView& patches,
                     const XView& dx) {
  using T = typename XView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w, S = g.stride, P = g.padding;
  const int W = g.width;
  for_rows_nchw(
      func, exec, g.batch, g.channels, g.height, KOKKOS_LAMBDA(const int b, const int c, const int h) {
        const auto out = nchw_row(dx, b, c, h);
        for (int w = 0; w < W; ++w) out[w] = T(0);
        for (int p = 0; p < KH; ++p) {
          const int hp = h + P - p;  // == i*S for the output row i that reads h through p
          if (hp < 0 || hp % S != 0 || hp / S >= OH) continue;
          const int r0 = (b * OH + hp / S) * OW;
          for (int q = 0; q < KW; ++q) {
            const InsideColumns inside(q, S, P, W, OW);
            const auto* const column = &patches(r0, (c * KH + p) * KW + q);  // LayoutLeft: contiguous
            if (S == 1) {
              for (int j = inside.begin; j < inside.end; ++j) out[j - P + q] += column[j];
            } else {
              for (int j = inside.begin; j < inside.end; ++j) out[j * S - P + q] += column[j];
            }
          }
        }
      });
}

/// col2im from a LayoutLeft patch matrix on a host space, a column at a time: one work item per
/// (image b, channel c) adds each of the channel's kh·kw columns, out_h runs of out_w entries,
/// into its zeroed padded plane, then copies the plane's interior to dx. Each element receives
/// its entries in (p, q) order, as a gather would add them.
template <class ExecSpace, class PView, class XView>
void col2im_plane_runs(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const PView& patches,
                       const XView& dx) {
  using T = typename XView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w;
  const int H = g.height, W = g.width, S = g.stride, P = g.padding, PH = H + 2 * P, PW = W + 2 * P;
  for_padded_planes<T>(
      func, exec, g, KOKKOS_LAMBDA(const int b, const int c, T* const pad) {
        zero_run(pad, PH * PW);
        for (int p = 0; p < KH; ++p)
          for (int q = 0; q < KW; ++q) {
            const auto* const column = &patches(b * OH * OW, (c * KH + p) * KW + q);  // LayoutLeft: contiguous
            for (int i = 0; i < OH; ++i) add_run(pad + (i * S + p) * PW + q, S, column + i * OW, OW);
          }
        for (int h = 0; h < H; ++h) gather_run(nchw_row(dx, b, c, h), pad + (h + P) * PW + P, 1, W);
      });
}

/// col2im from a LayoutLeft patch matrix on a host space. Measured on the 2-core VM (float,
/// docs/performance.md): a column at a time (col2im_plane_runs) was 1.5x faster for 5 x 5 kernels
/// (64 x 16x14x14: 2.9 against 4.5 ms), row by row with the kernel's columns side by side
/// (col2im_row_runs) 1.1-1.6x faster for 3 x 3 ones (8 x 64x56x56: 4.4 against 7.3 ms): kh·kw
/// streams read at once help until there are too many of them.
template <class ExecSpace, class PView, class XView>
void col2im_columns(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const PView& patches,
                    const XView& dx) {
  if (g.kernel_h * g.kernel_w >= 16 && padded_planes_fit(exec, g))
    col2im_plane_runs(exec, func, g, patches, dx);
  else
    col2im_row_runs(exec, func, g, patches, dx);
}

/// im2col into any other layout: one work item per (patch row r, channel c), the kh x kw block of
/// columns of that channel, so the index arithmetic is paid once per block rather than per element.
template <class ExecSpace, class XView, class PView>
void im2col_rows(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                 const PView& patches) {
  using T = typename PView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w;
  const int C = g.channels, H = g.height, W = g.width, S = g.stride, P = g.padding;
  const std::int64_t items = static_cast<std::int64_t>(g.rows()) * C;  // <= the patch matrix's size
  Kokkos::parallel_for(
      func, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, items),
      KOKKOS_LAMBDA(const std::int64_t t) {
        const int c = static_cast<int>(t % C), r = static_cast<int>(t / C);
        const int j = r % OW, i = (r / OW) % OH, b = r / (OW * OH);
        const int k0 = c * KH * KW;
        // Columns q in [q_begin, q_end) read inside the input row (w = j*S - P + q in [0, W)); the
        // rest are padding. Splitting the loop keeps the bounds test out of the inner loop.
        const int w0 = j * S - P;
        const int q_begin = w0 < 0 ? (-w0 < KW ? -w0 : KW) : 0;
        const int q_end = W - w0 < q_begin ? q_begin : (W - w0 < KW ? W - w0 : KW);
        for (int p = 0; p < KH; ++p) {
          const int h = i * S - P + p, k = k0 + p * KW;
          const bool row_inside = h >= 0 && h < H;
          const int inside_begin = row_inside ? q_begin : KW, inside_end = row_inside ? q_end : KW;
          for (int q = 0; q < inside_begin; ++q) patches(r, k + q) = T(0);
          for (int q = inside_begin; q < inside_end; ++q) patches(r, k + q) = T(x(b, c, h, w0 + q));
          for (int q = inside_end > inside_begin ? inside_end : inside_begin; q < KW; ++q) patches(r, k + q) = T(0);
        }
      });
}

}  // namespace impl
}  // namespace kdist
