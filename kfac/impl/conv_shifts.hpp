// Factor A of a stride-1 Conv2d layer by kernel-row shifts, without the im2col patches' syrk.
//
// Y is the "row patch" matrix of the input: a row per (input row u, image b, output column j),
// a column per (channel c, kernel column q), Y = x(b, c, u, j + q - padding) (0 off the input).
// The patch row (b, i, j)'s entries at kernel row p are
// Y's row (i + p - padding, b, j), so A's block of kernel rows (p, p + d) is a sum over input
// rows u of Y_uᵀ Y_{u+d} on a window of u that depends on p only at its ends. Per shift d the
// windows split the input rows into a few segments; each segment costs one gemm (syrk for
// d = 0), added into the block (p, d) of every p whose window holds it (conv_shifts.cpp derives
// the windows); the bias row sums Y's columns over the shift-0 segments the same way. Σ_d (H - d)
// row products of (C·kw)² instead of the syrk's (C·kh·kw)²/2 · out_h: 3.2x fewer flops for the
// 5 x 5 CNN layer, 1.8-1.9x for 3 x 3.
//
//   conv2d_a_factor_by_shifts(exec, layer, g, X, A, M, update): A as kfac::conv2d_a_factor
//     writes it (scale 1/(B·out_h·out_w), FactorUpdate), M a column-major scratch of at least
//     shift_scratch_entries(g) entries. Stride 1 only; inputs already validated.
//   a_factor_by_shifts<ExecSpace>(layer, g): whether conv2d_a_factor takes this path there (the
//     host, stride 1, a kernel of 2+ rows, 10+ channel x kernel columns, int-sized scratch).
#pragma once

#include <kdist/core/conv2d_geometry.hpp>
#include <kdist/core/impl/lane_sums.hpp>
#include <kdist/core/impl/nchw_rows.hpp>
#include <kdist/core/products.hpp>
#include <kdist/kfac/layers.hpp>

#include <Kokkos_Core.hpp>
#include <climits>
#include <cstddef>
#include <vector>

namespace kdist {
namespace kfac {
namespace impl {

/// One gemm of the shifts: Y's rows of input rows [first, last) against those of [first + shift,
/// last + shift), added into the blocks (p, shift) of kernel rows p in [p_first, p_last).
struct ShiftSegment {
  int shift, first, last, p_first, p_last;
};

/// Every shift's segments, shift 0 first (conv_shifts.cpp). g.stride must be 1.
std::vector<ShiftSegment> shift_segments(const Conv2dGeometry& g);

/// Y's columns: channels · kernel_w. (No ones column for the bias: OpenBLAS runs a gemm of 80 x 80
/// outputs 15 % faster a flop than one of 81 x 81.)
inline int shift_columns(const Conv2dGeometry& g) {
  return g.channels * g.kernel_w;
}
/// Y's rows: input rows · images · output columns.
inline long long shift_rows(const Conv2dGeometry& g) {
  return static_cast<long long>(g.height) * g.batch * g.out_w();
}
/// Scratch entries: Y, a segment's product T and the kernel_h² blocks S (m x m each), the bias
/// sums (m x kernel_h); a multiple of m.
inline long long shift_scratch_entries(const Conv2dGeometry& g) {
  const long long m = shift_columns(g), kh = g.kernel_h;
  return (shift_rows(g) + m * (1 + kh * kh) + kh) * m;
}

template <class ExecSpace>
bool a_factor_by_shifts(const Layer& layer, const Conv2dGeometry& g) {
  // perf/bench_conv_factor on the VM's one core, against the syrk on formed patches: 3.1x for 16
  // channels of 5 x 5, 1.4-2.0x from 10 channel x kernel columns up (3 x 3 and 5 x 5 kernels),
  // 0.7x for one channel of 5 x 5 (gemms of 5 x 5 outputs). Device BLAS runs the one large syrk
  // well: the shifts stay on the host.
  return kdist::impl::runs_on_host<ExecSpace>() && layer.stride() == 1 && layer.kernel_h() > 1 &&
         layer.in_channels() * static_cast<long long>(layer.kernel_w()) >= 10 && shift_scratch_entries(g) <= INT_MAX;
}

/// Y(r, c·kw + q) = x(b, c, u, j + q - padding), r = (u·B + b)·out_w + j; 0 off the input. A work
/// item per (column, input row u) walks the images: the index arithmetic once per B·out_w entries.
template <class ExecSpace, class XView, class YView>
void row_patches(const ExecSpace& exec, const Conv2dGeometry& g, const XView& X, const YView& Y) {
  using T = typename YView::non_const_value_type;
  const int B = g.batch, H = g.height, W = g.width, kw = g.kernel_w, P = g.padding, OW = g.out_w();
  Kokkos::parallel_for(
      "kdist::kfac::row_patches", Kokkos::RangePolicy<ExecSpace>(exec, 0, g.channels * kw * H),
      KOKKOS_LAMBDA(const int item) {
        const int column = item / H, u = item - column * H;
        const int c = column / kw, q = column - c * kw;
        // Output columns j read input column j + q - P: inside for j in [lo, hi).
        const int lo = P - q < 0 ? 0 : (P - q > OW ? OW : P - q);
        const int hi = W + P - q < lo ? lo : (W + P - q > OW ? OW : W + P - q);
        for (int b = 0; b < B; ++b) {
          T* const out = &Y((u * B + b) * OW, column);  // LayoutLeft: the run is contiguous
          const auto in = kdist::impl::nchw_row(X, b, c, u);
          for (int j = 0; j < lo; ++j) out[j] = T(0);
          for (int j = lo; j < hi; ++j) out[j] = in[j + q - P];
          for (int j = hi; j < OW; ++j) out[j] = T(0);
        }
      });
}

/// S(:, :, block) += T for the blocks [first, last) of the step `stride`.
template <class ExecSpace, class MV, class SV>
void add_to_blocks(const ExecSpace& exec, const MV& Tm, const SV& S, int first, int last, int stride) {
  const int m = static_cast<int>(Tm.extent(0));
  Kokkos::parallel_for(
      "kdist::kfac::shift_blocks", Kokkos::RangePolicy<ExecSpace>(exec, 0, m), KOKKOS_LAMBDA(const int j) {
        for (int block = first; block < last; block += stride)
          for (int i = 0; i < m; ++i) S(i, j, block) += Tm(i, j);
      });
}

/// sums(col, p) += Σ_{r in [first, first + count)} Y(r, col) for p in [p_first, p_last): a shift-0
/// segment's terms of the bias row, in eight running sums a column (impl::LaneSums).
template <class ExecSpace, class MV>
void add_column_sums(const ExecSpace& exec, const MV& Y, int first, int count, const MV& sums, int p_first,
                     int p_last) {
  using T = typename MV::non_const_value_type;
  Kokkos::parallel_for(
      "kdist::kfac::shift_bias_sums", Kokkos::RangePolicy<ExecSpace>(exec, 0, Y.extent(1)),
      KOKKOS_LAMBDA(const int column) {
        kdist::impl::LaneSums<T> lanes;
        lanes.add(&Y(first, column), count);  // LayoutLeft: contiguous
        const T sum = lanes.total();
        for (int p = p_first; p < p_last; ++p) sums(column, p) += sum;
      });
}

/// A := alpha · F + beta · A (beta 0: A not read), F the factor's raw sums read from the blocks
/// S(:, :, p·kh + d) of kernel rows (p, p + d) and, with a bias, sums(:, p); only the upper
/// triangle with `upper_only`.
template <class ExecSpace, class SV, class MV, class AView>
void assemble_from_blocks(const ExecSpace& exec, const Conv2dGeometry& g, bool bias, const SV& S, const MV& sums,
                          const AView& A, typename AView::non_const_value_type alpha,
                          typename AView::non_const_value_type beta, bool upper_only) {
  using T = typename AView::non_const_value_type;
  const int kh = g.kernel_h, kw = g.kernel_w, inputs = g.patch();
  const T rows = static_cast<T>(g.rows());
  const int n = inputs + (bias ? 1 : 0);
  Kokkos::parallel_for(
      "kdist::kfac::shift_assemble", Kokkos::RangePolicy<ExecSpace>(exec, 0, n), KOKKOS_LAMBDA(const int j) {
        // Column j is (cj, pj, qj), or the bias; rows i walk (ci, pi, qi) without a division.
        const int cj = j / (kh * kw), pj = j / kw - cj * kh, qj = j - j / kw * kw, bj = cj * kw + qj;
        const int end = upper_only ? j + 1 : n;
        int ci = 0, pi = 0, qi = 0;
        for (int i = 0; i < end; ++i) {
          T raw;
          if (i == inputs) {
            raw = j == inputs ? rows : sums(bj, pj);
          } else if (j == inputs) {
            raw = sums(ci * kw + qi, pi);
          } else {
            const int bi = ci * kw + qi;
            if (pi < pj)
              raw = S(bi, bj, pi * kh + (pj - pi));
            else if (pi > pj)
              raw = S(bj, bi, pj * kh + (pi - pj));
            else
              raw = bi <= bj ? S(bi, bj, pi * kh) : S(bj, bi, pi * kh);  // shift 0: syrk's upper
          }
          A(i, j) = beta == T(0) ? alpha * raw : beta * A(i, j) + alpha * raw;
          if (++qi == kw) {
            qi = 0;
            if (++pi == kh) {
              pi = 0;
              ++ci;
            }
          }
        }
      });
}

template <class ExecSpace, class XView, class AView, class MV>
void conv2d_a_factor_by_shifts(const ExecSpace& exec, const Layer& layer, const Conv2dGeometry& g, const XView& X,
                               const AView& A, const MV& scratch, const FactorUpdate& update) {
  using T = typename AView::non_const_value_type;
  using Mem = typename MV::memory_space;
  using Matrix = Kokkos::View<T**, Kokkos::LayoutLeft, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Blocks = Kokkos::View<T***, Kokkos::LayoutLeft, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const bool bias = layer.bias();
  const int m = shift_columns(g), kh = g.kernel_h, yrows = static_cast<int>(shift_rows(g));
  const int row_step = g.batch * g.out_w();  // Y's rows per input row
  T* const base = scratch.data();
  const Matrix Y(base, yrows, m), Tm(base + std::size_t(yrows) * m, m, m);
  const Blocks S(base + (std::size_t(yrows) + m) * m, m, m, std::size_t(kh) * kh);
  const Matrix sums(S.data() + S.size(), m, kh);
  row_patches(exec, g, X, Y);
  // T's lower triangle stays 0 through the shift-0 syrks, which write the upper one only.
  Kokkos::deep_copy(exec, Matrix(Tm.data(), std::size_t(m) * (1 + kh * kh) + kh, m), T(0));
  using Range = Kokkos::pair<int, int>;
  for (const ShiftSegment& s : shift_segments(g)) {
    const int first = s.first * row_step, count = (s.last - s.first) * row_step;
    if (s.shift == 0) {
      kdist::impl::Blas3<ExecSpace, T>::syrk(exec, 'T', m, count, T(1), Y.data() + first, yrows, T(0), Tm.data(), m);
    } else {
      const int second = first + s.shift * row_step;
      kdist::gemm(exec, "T", "N", T(1), Kokkos::subview(Y, Range(first, first + count), Kokkos::ALL()),
                  Kokkos::subview(Y, Range(second, second + count), Kokkos::ALL()), T(0), Tm);
    }
    add_to_blocks(exec, Tm, S, s.p_first * kh + s.shift, s.p_last * kh + s.shift, kh);
    if (bias && s.shift == 0) add_column_sums(exec, Y, first, count, sums, s.p_first, s.p_last);
  }
  const T alpha = static_cast<T>((1.0 - update.keep()) / static_cast<double>(g.rows()));
  assemble_from_blocks(exec, g, bias, S, sums, A, alpha, static_cast<T>(update.keep()), update.upper_only());
}

}  // namespace impl
}  // namespace kfac
}  // namespace kdist
