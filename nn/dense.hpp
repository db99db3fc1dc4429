// nn::Dense<T, Mem>: the fully connected layer y = x Wᵀ + b, forward and backward, with the
// K-FAC hooks. What a scientific code's own dense layer looks like next to kdist.
//
//   Dense<T, Mem> layer(in, out, bias = true);   // W out x in, b out, zero until nn/init.hpp
//   layer.attach(&kfac, l);                       // optional: call kfac's hooks for layer l
//   layer.forward(exec, x, y);                    // x B x in, y B x out: y := x Wᵀ + b
//   layer.backward(exec, dy, dx);                 // dy B x out: dW := dyᵀ x, db := Σ_rows dy,
//                                                 //   dx := dy W (dx B x in, or empty: skipped)
//   kfac.step(exec, {..., layer.gradient(), ...}); sgd.step(exec);
//
// forward keeps a reference to x (no copy): x must stay alive and unchanged until backward.
// Attached, forward calls kfac->on_forward(exec, l, x) and backward kfac->on_backward(exec, l, dy)
// before anything else, so dy must be the gradient of the MEAN loss (nn::SoftmaxCrossEntropy).
// gradient() has the shapes of kfac::Preconditioner<T, Mem>::Gradient (weight out x in
// LayoutRight, bias out or empty); kfac_layer() is the matching kfac::Dense.
// Views are LayoutRight in Mem, T float or double; kernels and gemm run on `exec`. Errors
// (InvalidArgument "kdist::nn::Dense::<method>: ... for Dense(in, out, bias)"): sizes < 1, an
// empty batch, extents that do not fit, outputs sharing storage with inputs, backward before
// forward; nothing is written then.
#pragma once

#include <kdist/nn/impl/affine.hpp>

namespace kdist {
namespace nn {

template <class T, class Mem = Kokkos::DefaultExecutionSpace::memory_space>
class Dense : public impl::Affine<T, Mem> {
  using Base = impl::Affine<T, Mem>;

 public:
  using execution_space = typename Base::execution_space;

  Dense(int in, int out, bool bias = true)
      : Base(Base::checked("kdist::nn::Dense", [&] { return kfac::Dense(in, out, bias); })) {}

  int inputs() const noexcept { return this->layer_.inputs(); }
  int outputs() const noexcept { return this->layer_.outputs(); }
  kfac::Dense kfac_layer() const { return kfac::Dense(inputs(), outputs(), this->layer_.bias()); }

  void forward(const execution_space& exec, const ConstTensor2<T, Mem>& x, const Tensor2<T, Mem>& y) {
    constexpr const char* func = "kdist::nn::Dense::forward";
    const std::size_t B = x.extent(0);
    if (B == 0) impl::throw_invalid(func, "empty batch " + impl::describe(x) + " for " + this->describe());
    impl::require_extents(func, x, {B, std::size_t(inputs())}, "(batch x inputs) for " + this->describe());
    impl::require_extents(func, y, {B, std::size_t(outputs())}, "(batch x outputs) for " + this->describe());
    impl::require_disjoint(func, x, y);
    this->hook_forward(exec, x);
    impl::affine_forward(exec, this->W_, this->b_, x, y);
    x_ = x;
  }

  void backward(const execution_space& exec, const ConstTensor2<T, Mem>& dy, const Tensor2<T, Mem>& dx = {}) {
    constexpr const char* func = "kdist::nn::Dense::backward";
    if (x_.data() == nullptr) impl::throw_invalid(func, "called before forward on " + this->describe());
    const std::size_t B = x_.extent(0);
    impl::require_extents(func, dy, {B, std::size_t(outputs())},
                          "(batch x outputs, batch from forward) for " + this->describe());
    if (dx.size() > 0) {
      impl::require_extents(func, dx, {B, std::size_t(inputs())}, "(batch x inputs) for " + this->describe());
      impl::require_disjoint(func, dy, dx);
    }
    this->hook_backward(exec, dy);
    impl::affine_backward(exec, this->W_, x_, dy, this->dW_, this->db_, dx);
  }

  // ---- the same on the default instance of Mem's execution space ----
  void forward(const ConstTensor2<T, Mem>& x, const Tensor2<T, Mem>& y) { forward(execution_space{}, x, y); }
  void backward(const ConstTensor2<T, Mem>& dy, const Tensor2<T, Mem>& dx = {}) { backward(execution_space{}, dy, dx); }

 private:
  ConstTensor2<T, Mem> x_;  // the input of the last forward
};

}  // namespace nn
}  // namespace kdist
