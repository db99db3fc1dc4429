// im2col / col2im and the NCHW <-> rows layout change: what a convolution, its backward pass and
// the K-FAC factors of a Conv2d layer need to treat the convolution as one matrix product.
//
// Contract (all kernels run on the caller's execution-space instance, asynchronously):
//   g: a Conv2dGeometry (kdist/core/conv2d_geometry.hpp), validated by every function here.
//   im2col(exec, g, x, patches): x is NCHW (batch, channels, height, width), patches is
//     rows() x patch(); patches(r, k) with r = (b*out_h + i)*out_w + j and
//     k = (c*kernel_h + p)*kernel_w + q (PyTorch's weight.view(c_out, -1) order) holds
//     x(b, c, i*stride - padding + p, j*stride - padding + q), zero outside the input.
//   col2im(exec, g, patches, dx): the adjoint, <im2col(x), P> = <x, col2im(P)>: dx (NCHW) is
//     overwritten with the sum of every patch entry that im2col read from that element.
//   nchw_to_rows(exec, y, rows) / rows_to_nchw(exec, rows, y): y is (B, C, H, W), rows is
//     (B*H*W) x C with rows((b*H + h)*W + w, c) = y(b, c, h, w); one is the inverse of the other.
// The patch matrix may have any layout; a LayoutLeft one (each column contiguous over the rows)
// takes kernels that run along input rows and is what a column-major gemm or syrk reads in place.
// On a device space (CUDA) im2col runs a team per patch column and image for a LayoutLeft patch
// matrix, one thread per entry otherwise; col2im gathers over dx's rows; the NCHW <-> rows copies
// run a few elements a thread, w fastest. The host kernels are in kdist/core/impl/im2col_host.hpp,
// the NCHW row drivers and copies in kdist/core/impl/nchw_rows.hpp.
// Views: any layout (indexed through operator()), rank and value type checked at compile time;
// extents and overlap of input and output checked first: InvalidArgument naming the function,
// the view's label and extents and the expected ones, nothing written.
#pragma once

#include <kdist/core/conv2d_geometry.hpp>
#include <kdist/core/impl/entries.hpp>
#include <kdist/core/impl/im2col_host.hpp>
#include <kdist/core/impl/nchw_rows.hpp>
#include <kdist/core/views.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

namespace kdist {
namespace impl {

template <class ExecSpace, class NV, class PV>
void check_im2col(const char* func, const Conv2dGeometry& g, const NV& nchw, const PV& patches) {
  static_check_view<ExecSpace, NV>();
  static_check_view<ExecSpace, PV>();
  static_assert(compat::view_rank<NV>() == 4, "kdist: the NCHW tensor must be rank 4");
  static_assert(compat::view_rank<PV>() == 2, "kdist: the patch matrix must be rank 2");
  static_assert(std::is_same<typename NV::non_const_value_type, typename PV::non_const_value_type>::value,
                "kdist: NCHW tensor and patch matrix value types differ");
  g.validate(func);
  const std::string geometry = "for " + g.describe();
  require_extents(func, nchw,
                  {std::size_t(g.batch), std::size_t(g.channels), std::size_t(g.height), std::size_t(g.width)},
                  "(batch x channels x height x width) " + geometry);
  require_extents(func, patches, {std::size_t(g.rows()), std::size_t(g.patch())},
                  "(batch*out_h*out_w x channels*kernel_h*kernel_w) " + geometry);
  require_disjoint(func, nchw, patches);
}

/// im2col on a device space, any layout: one thread per patch entry (r, k), the patch matrix's
/// contiguous index fastest, so neighbouring threads write neighbouring addresses (and, along r
/// at stride 1, read neighbouring inputs).
template <class ExecSpace, class XView, class PView>
void im2col_entries(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                    const PView& patches) {
  using T = typename PView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w;
  const int H = g.height, W = g.width, S = g.stride, P = g.padding;
  const int rows = g.rows(), cols = g.patch();
  constexpr bool rows_fastest = !std::is_same<typename PView::array_layout, Kokkos::LayoutRight>::value;
  const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
  Kokkos::parallel_for(
      func, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
      KOKKOS_LAMBDA(const std::int64_t t) {
        const int r = static_cast<int>(rows_fastest ? t % rows : t / cols);
        const int k = static_cast<int>(rows_fastest ? t / rows : t % cols);
        const int j = r % OW, i = (r / OW) % OH, b = r / (OW * OH);
        const int q = k % KW, p = (k / KW) % KH, c = k / (KW * KH);
        const int h = i * S - P + p, w = j * S - P + q;
        patches(r, k) = h >= 0 && h < H && w >= 0 && w < W ? T(x(b, c, h, w)) : T(0);
      });
}

/// Threads per team of im2col_column_teams for `spatial` output positions: enough for each to copy
/// copies_per_thread of them, in whole 32-thread warps (CUDA's), at most 256, which every CUDA
/// device runs for this kernel (1 on a host space).
template <class ExecSpace>
int im2col_team_size(int spatial) {
  if (runs_on_host<ExecSpace>()) return 1;
  const int threads = (spatial + copies_per_thread - 1) / copies_per_thread;
  return std::min(256, (threads + 31) / 32 * 32);
}

/// im2col into a LayoutLeft patch matrix on a device: im2col_column_runs' work items, each a team
/// whose threads share its output positions, so a team writes down one column and reads along
/// input rows (both contiguous at stride 1), with one division per entry. Thread s0 copies the
/// positions s0 + r m (m the team's share), loading them all before its first store (for_copies).
template <class ExecSpace, class XView, class PView>
void im2col_column_teams(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                         const PView& patches) {
  using T = typename PView::non_const_value_type;
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w, B = g.batch;
  const int H = g.height, W = g.width, S = g.stride, P = g.padding, spatial = OH * OW;
  const int m = (spatial + copies_per_thread - 1) / copies_per_thread;
  Kokkos::parallel_for(
      func, Policy(exec, g.patch() * B, im2col_team_size<ExecSpace>(spatial)),
      KOKKOS_LAMBDA(const typename Policy::member_type& team) {
        const int b = team.league_rank() % B, k = team.league_rank() / B;
        const int q = k % KW, p = (k / KW) % KH, c = k / (KW * KH);
        const int r0 = b * spatial;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, m), [&](const int s0) {
          T v[copies_per_thread] = {};
          for (int r = 0, s = s0; r < copies_per_thread; ++r, s += m) {
            const int i = s / OW, j = s - i * OW;
            const int h = i * S - P + p, w = j * S - P + q;
            if (s < spatial && h >= 0 && h < H && w >= 0 && w < W) v[r] = T(x(b, c, h, w));
          }
          for (int r = 0; r < copies_per_thread; ++r)  // a fixed trip count: v stays in registers
            if (s0 + r * m < spatial) patches(r0 + s0 + r * m, k) = v[r];
        });
      });
}

/// col2im from any other layout: a gather over dx, one element at a time.
template <class ExecSpace, class PView, class XView>
void col2im_rows(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const PView& patches,
                 const XView& dx) {
  using T = typename XView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w, S = g.stride, P = g.padding;
  for_each_nchw(
      func, exec, g.batch, g.channels, g.height, g.width,
      KOKKOS_LAMBDA(const int b, const int c, const int h, const int w) {
        // Kernel offset p reads input row h from output row i when i*S - P + p == h.
        T sum = 0;
        for (int p = 0; p < KH; ++p) {
          const int hp = h + P - p;
          if (hp < 0 || hp % S != 0 || hp / S >= OH) continue;
          for (int q = 0; q < KW; ++q) {
            const int wq = w + P - q;
            if (wq < 0 || wq % S != 0 || wq / S >= OW) continue;
            sum += patches((b * OH + hp / S) * OW + wq / S, (c * KH + p) * KW + q);
          }
        }
        dx(b, c, h, w) = sum;
      });
}

template <class View>
constexpr bool is_layout_left() {
  return std::is_same<typename View::array_layout, Kokkos::LayoutLeft>::value;
}

/// im2col's kernel for the space and the patch layout, unchecked (nn::Conv2d calls it per chunk).
/// Host: the column and row kernels, a loop per work item. Device: a team per column and image
/// (LayoutLeft), else every entry its own thread.
template <class ExecSpace, class XView, class PView>
void im2col_kernel(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                   const PView& patches) {
  if constexpr (runs_on_host<ExecSpace>() && is_layout_left<PView>())
    im2col_columns(exec, func, g, x, patches);
  else if constexpr (runs_on_host<ExecSpace>())
    im2col_rows(exec, func, g, x, patches);
  else if constexpr (is_layout_left<PView>())
    im2col_column_teams(exec, func, g, x, patches);
  else
    im2col_entries(exec, func, g, x, patches);
}

/// col2im's kernel, unchecked: the column kernel on the host for LayoutLeft, otherwise the gather
/// over dx's rows.
template <class ExecSpace, class PView, class XView>
void col2im_kernel(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const PView& patches,
                   const XView& dx) {
  if constexpr (is_layout_left<PView>() && runs_on_host<ExecSpace>())
    col2im_columns(exec, func, g, patches, dx);
  else
    col2im_rows(exec, func, g, patches, dx);
}

}  // namespace impl

/// patches := im2col(x) for the geometry g (see the header's contract). A LayoutLeft patch
/// matrix (each column contiguous over the rows) is the fast one: its kernel copies along the
/// input rows, and a gemm or syrk reads it as a column-major matrix in place.
template <class ExecSpace, class XView, class PView>
void im2col(const ExecSpace& exec, const Conv2dGeometry& g, const XView& x, const PView& patches) {
  constexpr const char* func = "kdist::im2col";
  impl::check_im2col<ExecSpace>(func, g, x, patches);
  impl::im2col_kernel(exec, func, g, x, patches);
}

/// dx := col2im(patches), the adjoint of im2col: each element of dx (or its padded plane) is
/// written by one work item, so no atomics.
template <class ExecSpace, class PView, class XView>
void col2im(const ExecSpace& exec, const Conv2dGeometry& g, const PView& patches, const XView& dx) {
  constexpr const char* func = "kdist::col2im";
  impl::check_im2col<ExecSpace>(func, g, dx, patches);
  impl::col2im_kernel(exec, func, g, patches, dx);
}

/// rows((b*H + h)*W + w, c) := y(b, c, h, w).
template <class ExecSpace, class YView, class RView>
void nchw_to_rows(const ExecSpace& exec, const YView& y, const RView& rows) {
  impl::nchw_rows_copy<impl::ToRows>(exec, "kdist::nchw_to_rows", y, rows);
}

/// y(b, c, h, w) := rows((b*H + h)*W + w, c); y's extents give the shape.
template <class ExecSpace, class RView, class YView>
void rows_to_nchw(const ExecSpace& exec, const RView& rows, const YView& y) {
  impl::nchw_rows_copy<impl::ToNchw>(exec, "kdist::rows_to_nchw", y, rows);
}

// ---- the same on the output view's default execution space ------------------------------------

template <class XView, class PView>
void im2col(const Conv2dGeometry& g, const XView& x, const PView& patches) {
  im2col(typename PView::execution_space{}, g, x, patches);
}
template <class PView, class XView>
void col2im(const Conv2dGeometry& g, const PView& patches, const XView& dx) {
  col2im(typename XView::execution_space{}, g, patches, dx);
}
template <class YView, class RView>
void nchw_to_rows(const YView& y, const RView& rows) {
  nchw_to_rows(typename RView::execution_space{}, y, rows);
}
template <class RView, class YView>
void rows_to_nchw(const RView& rows, const YView& y) {
  rows_to_nchw(typename YView::execution_space{}, rows, y);
}

}  // namespace kdist
