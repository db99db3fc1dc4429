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
// forward caches the patches P (its own copy, reused while the shapes stay the same), so x may
// change after forward. Attached (attach(&kfac, l)), forward calls kfac->on_forward(exec, l, x)
// with the NCHW input and backward kfac->on_backward(exec, l, dy) with the NCHW output gradient
// of the MEAN loss, each before anything else. gradient() is kfac::Preconditioner<T, Mem>::Gradient
// of the layer; kfac_layer() the matching kfac::Conv2d.
// Kernels and gemm run on `exec`. Errors (InvalidArgument "kdist::nn::Conv2d::<method>: ... for
// Conv2d(...)"): sizes < 1 or padding < 0, a kernel that does not fit the padded input, extents
// that do not fit, outputs sharing storage with inputs, backward before forward.
#pragma once

#include <kdist/core/im2col.hpp>
#include <kdist/nn/impl/affine.hpp>

namespace kdist {
namespace nn {

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
    this->hook_forward(exec, x);
    impl::ensure(exec, patches_, "kdist::nn::Conv2d::patches", g.rows(), g.patch());
    impl::ensure(exec, rows_, "kdist::nn::Conv2d::rows", g.rows(), this->layer_.outputs());
    im2col(exec, g, x, patches_);
    impl::affine_forward(exec, this->W_, this->b_, patches_, rows_);
    rows_to_nchw(exec, rows_, y);
    geometry_ = g;
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
    nchw_to_rows(exec, dy, rows_);
    if (dx.size() > 0) impl::ensure(exec, dpatches_, "kdist::nn::Conv2d::patch_gradients", g.rows(), g.patch());
    impl::affine_backward(exec, this->W_, patches_, rows_, this->dW_, this->db_,
                          dx.size() > 0 ? dpatches_ : Tensor2<T, Mem>());
    if (dx.size() > 0) col2im(exec, g, dpatches_, dx);
  }

  // ---- the same on the default instance of Mem's execution space ----
  void forward(const ConstTensor4<T, Mem>& x, const Tensor4<T, Mem>& y) { forward(execution_space{}, x, y); }
  void backward(const ConstTensor4<T, Mem>& dy, const Tensor4<T, Mem>& dx = {}) { backward(execution_space{}, dy, dx); }

 private:
  static std::array<std::size_t, 4> extents(int b, int c, int h, int w) {
    return {std::size_t(b), std::size_t(c), std::size_t(h), std::size_t(w)};
  }

  Conv2dGeometry geometry_{};       // of the last forward (batch 0: none yet)
  Tensor2<T, Mem> patches_, rows_;  // im2col(x); the output rows, then dy's rows
  Tensor2<T, Mem> dpatches_;        // dY W, before col2im
};

}  // namespace nn
}  // namespace kdist
