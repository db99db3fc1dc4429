// nn::Conv2d<T, Mem>: a 2-D convolution as one matrix product over im2col patches
// (kdist/core/im2col.hpp), forward and backward, with the K-FAC hooks.
//
//   Conv2d<T, Mem> conv(c_in, c_out, kh, kw, stride = 1, padding = 0, bias = true);
//   conv.forward(exec, x, y);     // x (B, c_in, H, W), y (B, c_out, OH, OW), NCHW LayoutRight:
//                                 //   P := im2col(x) (B·OH·OW x c_in·kh·kw), y := rows(P Wᵀ + b)
//   conv.backward(exec, dy, dx);  // dY := rows(dy): dW := dYᵀ P, db := Σ_rows dY,
//                                 //   dx := col2im(dY W) (dx like x, or empty: skipped)
//
// OH = (H + 2·padding - kh)/stride + 1, likewise OW. The weight is c_out x (c_in·kh·kw),
// LayoutRight, column (c·kh + p)·kw + q: PyTorch's weight.view(c_out, -1), the order kfac uses.
// forward keeps what backward needs, so x may change after forward: the batch's patches P where
// K-FAC reads them or a device runs the batch at once, else a copy of x, from which the host
// forms each chunk's P again in backward (in cache, cheaper than keeping them all). The products
// are column-major gemms on P, on the output columns and on the weight's storage read as Wᵀ, so
// nothing is transposed. Attached
// (attach(&kfac, l)), forward calls kfac->on_forward(exec, l, geometry, P) once P is formed
// (factor A reuses the patches; on_forward(exec, l, x) instead where kfac computes A faster from
// x) and backward kfac->on_backward(exec, l, dy) with the NCHW output gradient of the MEAN loss
// before anything else. gradient() is kfac::Preconditioner<T, Mem>::Gradient of the layer;
// kfac_layer() the matching kfac::Conv2d.
// Kernels and gemm run on `exec`. Errors (InvalidArgument "kdist::nn::Conv2d::<method>: ... for
// Conv2d(...)"): sizes < 1 or padding < 0, a kernel that does not fit the padded input, extents
// that do not fit, outputs sharing storage with inputs, backward before forward.
#pragma once

#include <kdist/core/im2col.hpp>
#include <kdist/core/impl/lane_sums.hpp>
#include <kdist/nn/impl/affine.hpp>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>

namespace kdist {
namespace nn {

namespace impl {

// Conv2d's own kernels, as free functions: nvcc refuses an extended lambda in a private member.

/// columns_to_nchw's device body: a few elements a thread, w fastest (kdist/core/impl/entries.hpp).
template <class ExecSpace, class CV, class BV, class YV>
void columns_to_nchw_entries(const ExecSpace& exec, const CV& columns, const BV& bias, const YV& y) {
  using T = typename YV::non_const_value_type;
  using kdist::impl::NchwPlace;
  const int H = static_cast<int>(y.extent(2)), W = static_cast<int>(y.extent(3));
  const bool has_bias = bias.extent(0) > 0;
  kdist::impl::copy_over_nchw(
      "kdist::nn::Conv2d::columns_to_nchw", exec, static_cast<int>(y.extent(0)), static_cast<int>(y.extent(1)), H, W,
      KOKKOS_LAMBDA(const NchwPlace& p)->T {
        return columns((p.b * H + p.h) * W + p.w, p.c) + (has_bias ? bias(p.c) : T(0));
      },
      KOKKOS_LAMBDA(const NchwPlace& p, const T v) { y(p.b, p.c, p.h, p.w) = v; });
}

/// y(b, c, h, w) := columns((b*H + h)*W + w, c) + bias(c) (no bias when it is empty).
template <class ExecSpace, class CV, class BV, class YV>
void columns_to_nchw(const ExecSpace& exec, const CV& columns, const BV& bias, const YV& y) {
  if constexpr (!kdist::impl::runs_on_host<ExecSpace>()) {
    columns_to_nchw_entries(exec, columns, bias, y);
  } else {
    using T = typename YV::non_const_value_type;
    const int H = static_cast<int>(y.extent(2)), W = static_cast<int>(y.extent(3));
    const bool has_bias = bias.extent(0) > 0;
    kdist::impl::for_rows_nchw(
        "kdist::nn::Conv2d::columns_to_nchw", exec, static_cast<int>(y.extent(0)), static_cast<int>(y.extent(1)), H,
        KOKKOS_LAMBDA(const int b, const int c, const int h) {
          const T add = has_bias ? bias(c) : T(0);
          T* const row = &y(b, c, h, 0);
          const T* const column = &columns((b * H + h) * W, c);
          for (int w = 0; w < W; ++w) row[w] = column[w] + add;
        });
  }
}

/// add_bias_columns on a device space: a thread per entry (kdist/core/impl/entries.hpp).
template <class ExecSpace, class BV, class YV>
void add_bias_entries(const ExecSpace& exec, const BV& bias, const YV& Y) {
  Kokkos::parallel_for(
      "kdist::nn::Conv2d::add_bias",
      kdist::impl::entries<Kokkos::LayoutLeft>(exec, static_cast<int>(Y.extent(0)), static_cast<int>(Y.extent(1))),
      KOKKOS_LAMBDA(const int r, const int c) { Y(r, c) += bias(c); });
}

/// Y(r, c) += bias(c) for a column-major Y.
template <class ExecSpace, class BV, class YV>
void add_bias_columns(const ExecSpace& exec, const BV& bias, const YV& Y) {
  if constexpr (!kdist::impl::runs_on_host<ExecSpace>()) {
    add_bias_entries(exec, bias, Y);
  } else {
    // The host form: a column per work item.
    using T = typename YV::non_const_value_type;
    const int rows = static_cast<int>(Y.extent(0));
    Kokkos::parallel_for(
        "kdist::nn::Conv2d::add_bias", Kokkos::RangePolicy<ExecSpace>(exec, 0, Y.extent(1)),
        KOKKOS_LAMBDA(const int c) {
          T* const column = &Y(0, c);
          const T add = bias(c);
          for (int r = 0; r < rows; ++r) column[r] += add;
        });
  }
}

/// db(c) := Σ_{b,h,w} dy(b, c, h, w), a team per channel (for a device: a thread per channel
/// would leave all but C threads of a GPU idle, each walking B·H·W values alone).
template <class ExecSpace, class YV, class BV>
void channel_sums_teams(const ExecSpace& exec, const YV& dy, const BV& db) {
  using T = typename BV::non_const_value_type;
  const int B = static_cast<int>(dy.extent(0)), H = static_cast<int>(dy.extent(2)), W = static_cast<int>(dy.extent(3));
  kdist::impl::for_team_sums(
      "kdist::nn::Conv2d::channel_sums", exec, static_cast<int>(db.extent(0)), B * H * W,
      KOKKOS_LAMBDA(const int c, const int r) {
        const int b = r / (H * W), hw = r - b * (H * W);
        return T(dy(b, c, hw / W, hw - hw / W * W));
      },
      KOKKOS_LAMBDA(const int c, const T sum) { db(c) = sum; });
}

/// db(c) := Σ_{b,h,w} dy(b, c, h, w).
template <class ExecSpace, class YV, class BV>
void channel_sums(const ExecSpace& exec, const YV& dy, const BV& db) {
  if constexpr (!kdist::impl::runs_on_host<ExecSpace>()) {
    channel_sums_teams(exec, dy, db);
  } else {
    // The host form: eight running sums per channel (impl::LaneSums), a channel holding B·H·W
    // values (50 176 for 64 images of 28 x 28), each row of W a run.
    using T = typename BV::non_const_value_type;
    const int B = static_cast<int>(dy.extent(0)), H = static_cast<int>(dy.extent(2)),
              W = static_cast<int>(dy.extent(3));
    Kokkos::parallel_for(
        "kdist::nn::Conv2d::channel_sums", Kokkos::RangePolicy<ExecSpace>(exec, 0, db.extent(0)),
        KOKKOS_LAMBDA(const int c) {
          kdist::impl::LaneSums<T> sum;
          for (int b = 0; b < B; ++b)
            for (int h = 0; h < H; ++h) sum.add(&dy(b, c, h, 0), W);
          db(c) = sum.total();
        });
  }
}

}  // namespace impl

template <class T, class Mem = Kokkos::DefaultExecutionSpace::memory_space>
class Conv2d : public impl::Affine<T, Mem> {
  using Base = impl::Affine<T, Mem>;

 public:
  using execution_space = typename Base::execution_space;

  Conv2d(int c_in, int c_out, int kh, int kw, int stride = 1, int padding = 0, bool bias = true)
      : Base(Base::checked("kdist::nn::Conv2d",
                           [&] { return kfac::Conv2d(c_in, c_out, kh, kw, stride, padding, bias); })) {}

  kfac::Conv2d kfac_layer() const {
    const kfac::Layer& l = this->layer_;
    return kfac::Conv2d(l.in_channels(), l.outputs(), l.kernel_h(), l.kernel_w(), l.stride(), l.padding(), l.bias());
  }
  /// The geometry of an input of these extents (batch, height, width from x; channels c_in).
  Conv2dGeometry geometry(int batch, int height, int width) const {
    const kfac::Layer& l = this->layer_;
    return {batch, l.in_channels(), height, width, l.kernel_h(), l.kernel_w(), l.stride(), l.padding()};
  }

  void forward(const execution_space& exec, const ConstTensor4<T, Mem>& x, const Tensor4<T, Mem>& y) {
    constexpr const char* func = "kdist::nn::Conv2d::forward";
    const std::string why = " for " + this->describe();
    const Conv2dGeometry g =
        geometry(static_cast<int>(x.extent(0)), static_cast<int>(x.extent(2)), static_cast<int>(x.extent(3)));
    impl::require_extents(func, x, {x.extent(0), std::size_t(g.channels), x.extent(2), x.extent(3)},
                          "(batch x in_channels x height x width)" + why);
    g.validate(func, why);
    impl::require_extents(func, y, extents(g.batch, this->layer_.outputs(), g.out_h(), g.out_w()),
                          "(batch x out_channels x out_h x out_w)" + why);
    impl::require_disjoint(func, x, y);
    keeps_patches_ = !on_host || this->hook_reads_patches(g);
    reserve_patches(exec, g);
    if (!keeps_patches_) {
      impl::ensure_like(exec, input_, "kdist::nn::Conv2d::input", x);
      Kokkos::deep_copy(exec, input_, x);
    }
    reserve_chunks(exec, g);
    // Chunk by chunk, so each chunk's patches are still in cache for its gemm.
    for_chunks(g, [&](const Conv2dGeometry& c, int first, const Range& rows) {
      const auto P = chunk_patches(c, rows);
      kdist::impl::im2col_kernel(exec, func, c, images(x, first, c.batch), P);
      if (c.batch == 1 && y.span_is_contiguous()) {
        // One image's output (out x OH·OW, row-major) is the column-major matrix the gemm
        // writes: straight into y, the bias added while it is in cache.
        const auto Y = image_columns(y, first);
        kdist::gemm(exec, "N", "N", T(1), P, weight_columns(this->W_), T(0), Y);
        if (this->b_.extent(0) > 0) impl::add_bias_columns(exec, this->b_, Y);
      } else {
        const auto Y = chunk(columns_, c.rows(), this->layer_.outputs());
        kdist::gemm(exec, "N", "N", T(1), P, weight_columns(this->W_), T(0), Y);
        impl::columns_to_nchw(exec, Y, this->b_, images(y, first, c.batch));
      }
    });
    geometry_ = g;
    this->hook_forward_conv(exec, g, patches_, x);
  }

  void backward(const execution_space& exec, const ConstTensor4<T, Mem>& dy, const Tensor4<T, Mem>& dx = {}) {
    constexpr const char* func = "kdist::nn::Conv2d::backward";
    const std::string why = " for " + this->describe();
    const Conv2dGeometry& g = geometry_;
    if (g.batch == 0) impl::throw_invalid(func, "called before forward" + why);
    impl::require_extents(func, dy, extents(g.batch, this->layer_.outputs(), g.out_h(), g.out_w()),
                          "(batch x out_channels x out_h x out_w, from forward's " + g.describe() + ")" + why);
    if (dx.size() > 0) {
      impl::require_extents(func, dx, extents(g.batch, g.channels, g.height, g.width),
                            "(batch x in_channels x height x width, from forward)" + why);
      impl::require_disjoint(func, dy, dx);
    }
    this->hook_backward(exec, dy);
    if (dx.size() > 0) reserve_patch_gradients(exec, g);
    // Chunk by chunk: dWᵀ += Pᵀ dY (the weight's row-major storage read column-major), then
    // dP = dY W in a chunk-sized scratch that col2im reads while it is still in cache.
    for_chunks(g, [&](const Conv2dGeometry& c, int first, const Range& rows) {
      const auto P = chunk_patches(c, rows);
      if (!keeps_patches_) kdist::impl::im2col_kernel(exec, func, c, images(input_, first, c.batch), P);
      // One image's dy is already the column-major matrix dY; a chunk of several is copied.
      const bool in_place = c.batch == 1 && dy.span_is_contiguous();
      const ConstColumns dY = in_place ? image_columns(dy, first) : chunk(columns_, c.rows(), this->layer_.outputs());
      if (!in_place) nchw_to_rows(exec, images(dy, first, c.batch), chunk(columns_, c.rows(), this->layer_.outputs()));
      kdist::gemm(exec, "T", "N", T(1), P, dY, T(first == 0 ? 0 : 1), weight_columns(this->dW_));
      if (dx.size() == 0) return;
      const auto dP = chunk(dpatches_, c.rows(), c.patch());
      patch_gradients(exec, dY, dP);
      kdist::impl::col2im_kernel(exec, func, c, dP, images(dx, first, c.batch));
      if constexpr (on_host) {
        Kokkos::deep_copy(exec, dP, T(0));
        dpatches_zero_ = true;
      }
    });
    if (this->db_.extent(0) > 0) impl::channel_sums(exec, dy, this->db_);
  }

  // ---- the same on the default instance of Mem's execution space ----
  void forward(const ConstTensor4<T, Mem>& x, const Tensor4<T, Mem>& y) { forward(execution_space{}, x, y); }
  void backward(const ConstTensor4<T, Mem>& dy, const Tensor4<T, Mem>& dx = {}) { backward(execution_space{}, dy, dx); }

 private:
  using Columns = Kokkos::View<T**, Kokkos::LayoutLeft, Mem>;
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;

  static std::array<std::size_t, 4> extents(int b, int c, int h, int w) {
    return {std::size_t(b), std::size_t(c), std::size_t(h), std::size_t(w)};
  }
  /// The out x patch row-major weight (or its gradient) as the patch x out column-major matrix
  /// it also is: Wᵀ without a copy.
  using WeightColumns = Kokkos::View<T**, Kokkos::LayoutLeft, Mem, Unmanaged>;
  static WeightColumns weight_columns(const Tensor2<T, Mem>& w) {
    return WeightColumns(w.data(), w.extent(1), w.extent(0));
  }
  /// A chunk's patch matrix of at most this many bytes stays in a core's L2 between im2col and
  /// the gemm, and its patch gradients between the gemm and col2im: the host runs a batch in
  /// chunks of whole images that fit (one image at least).
  static constexpr std::size_t chunk_bytes = std::size_t(512) << 10;
  using Range = std::pair<int, int>;

  static constexpr bool on_host = kdist::impl::runs_on_host<execution_space>();
  static int images_per_chunk(const Conv2dGeometry& g) {
    if (!on_host) return g.batch;  // GPUs: one launch
    const std::size_t image = std::size_t(g.out_h()) * std::size_t(g.out_w()) * std::size_t(g.patch()) * sizeof(T);
    return static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(std::size_t(g.batch), chunk_bytes / image)));
  }
  /// f(geometry of the chunk, its first image, its rows of the patch matrix) for each chunk.
  template <class F>
  static void for_chunks(const Conv2dGeometry& g, const F& f) {
    const int per = images_per_chunk(g), rows_per_image = g.out_h() * g.out_w();
    for (int first = 0; first < g.batch; first += per) {
      Conv2dGeometry c = g;
      c.batch = std::min(per, g.batch - first);
      f(c, first, Range(first * rows_per_image, (first + c.batch) * rows_per_image));
    }
  }
  /// The patch matrix: the whole batch's when the device runs it in one launch or K-FAC reads
  /// it (with a bias a last column of ones, ā itself: factor A is then one syrk); otherwise one
  /// chunk's, formed again in backward from a copy of the input, so that it is written and read
  /// in a core's L2 instead of streaming the batch's (20 MB for the CNN's conv2) through L3.
  void reserve_patches(const execution_space& exec, const Conv2dGeometry& g) {
    const int K = g.patch();
    if (!keeps_patches_) {
      const int rows = images_per_chunk(g) * g.out_h() * g.out_w();
      if (patches_.size() < std::size_t(rows) * K) impl::ensure(exec, patches_, "kdist::nn::Conv2d::patches", rows, K);
      return;
    }
    const int augmented = this->layer_.bias() ? 1 : 0;
    impl::ensure(exec, patches_, "kdist::nn::Conv2d::patches", g.rows(), K + augmented);
    if (augmented) Kokkos::deep_copy(exec, Kokkos::subview(patches_, Kokkos::ALL(), K), T(1));
  }
  /// A chunk's patch matrix: its rows of the whole batch's, or the chunk-sized scratch.
  auto chunk_patches(const Conv2dGeometry& c, const Range& rows) const {
    const int K = c.patch();
    const auto all = keeps_patches_ ? WeightColumns(patches_.data(), patches_.extent(0), patches_.extent(1))
                                    : chunk(patches_, c.rows(), K);
    const auto P = Kokkos::subview(all, keeps_patches_ ? rows : Range(0, c.rows()), Range(0, K));
    static_assert(std::is_same<typename decltype(P)::array_layout, Kokkos::LayoutLeft>::value,
                  "kdist::nn::Conv2d: a row range of the patches must stay LayoutLeft for the BLAS gemm");
    return P;
  }
  void reserve_chunks(const execution_space& exec, const Conv2dGeometry& g) {
    const int rows = images_per_chunk(g) * g.out_h() * g.out_w();
    if (columns_.size() < std::size_t(rows) * this->layer_.outputs())
      impl::ensure(exec, columns_, "kdist::nn::Conv2d::columns", rows, this->layer_.outputs());
  }
  void reserve_patch_gradients(const execution_space& exec, const Conv2dGeometry& g) {
    const int rows = images_per_chunk(g) * g.out_h() * g.out_w();
    if (dpatches_.size() < std::size_t(rows) * g.patch()) {
      dpatches_zero_ = false;
      impl::ensure(exec, dpatches_, "kdist::nn::Conv2d::patch_gradients", rows, g.patch());
    }
  }
  /// dP := dY W. On the host into a scratch kept at zero between chunks, as dP += dY W: a BLAS
  /// gemm with beta 0 first zeroes its output in a pass of its own (OpenBLAS' sgemm_beta, 7 % of
  /// the CNN's step), slower than zeroing the chunk after col2im has read it, while it is in cache.
  template <class DY, class DP>
  void patch_gradients(const execution_space& exec, const DY& dY, const DP& dP) {
    if constexpr (on_host) {
      if (!dpatches_zero_) Kokkos::deep_copy(exec, dpatches_, T(0));
      dpatches_zero_ = false;  // until the chunk is zeroed again
      kdist::gemm(exec, "N", "T", T(1), dY, weight_columns(this->W_), T(1), dP);
    } else {
      kdist::gemm(exec, "N", "T", T(1), dY, weight_columns(this->W_), T(0), dP);
    }
  }
  using ConstColumns = Kokkos::View<const T**, Kokkos::LayoutLeft, Mem, Unmanaged>;
  /// Image b of a contiguous NCHW tensor as the (OH·OW) x channels column-major matrix it is.
  template <class V>
  static auto image_columns(const V& v, int b) {
    using M = Kokkos::View<typename V::value_type**, Kokkos::LayoutLeft, Mem, Unmanaged>;
    // From data(), not &v(b, 0, 0, 0): the host may not dereference a device view.
    return M(v.data() + std::size_t(b) * v.stride_0(), v.extent(2) * v.extent(3), v.extent(1));
  }
  /// The first rows x cols of a scratch buffer, as a column-major matrix of its own.
  static WeightColumns chunk(const Columns& buffer, int rows, int cols) {
    return WeightColumns(buffer.data(), std::size_t(rows), std::size_t(cols));
  }
  /// Images [first, first + n) of an NCHW tensor.
  template <class V>
  static auto images(const V& v, int first, int n) {
    return Kokkos::subview(v, std::make_pair(first, first + n), Kokkos::ALL(), Kokkos::ALL(), Kokkos::ALL());
  }
  Conv2dGeometry geometry_{};  // of the last forward (batch 0: none yet)
  // im2col(x), the whole batch's (backward and factor A read it again), rows x patch; one chunk's
  // patch gradients dY W, and its output rows (forward), then dy's (backward), rows x out.
  // Column-major, so gemm and the factor's syrk read them in place and im2col, col2im and the
  // NCHW copies run along contiguous rows.
  Columns patches_, dpatches_, columns_;
  bool keeps_patches_ = true;  // patches_ holds the whole batch's (else one chunk's, and input_ x)
  Tensor4<T, Mem> input_;
  bool dpatches_zero_ = false;  // every entry of dpatches_ is 0 (host: see patch_gradients)
};

}  // namespace nn
}  // namespace kdist
