// The part Dense and Conv2d share (kdist/nn/dense.hpp, kdist/nn/conv2d.hpp): both are the affine
// map Y = X Wᵀ + b on rows (samples, or im2col patches), so both own the same parameters, the
// same gradients and the same K-FAC hooks. Not used on its own.
//
//   affine_forward(exec, W, b, X, Y)            Y := X Wᵀ + b (b empty: no bias), X n x in,
//                                               W out x in, Y n x out.
//   affine_backward(exec, W, X, dY, dW, db, dX) dW := dYᵀ X, db := column sums of dY (skipped
//                                               when db is empty), dX := dY W (skipped when dX is
//                                               empty). Extents are the caller's to check.
//   Affine<T, Mem>: weight W (outputs x inputs, LayoutRight), bias b (outputs, empty without a
//     bias), their gradients dW, db in the same shapes: gradient() is the
//     kfac::Preconditioner<T, Mem>::Gradient of the layer, parameters() the (value, gradient)
//     pairs for nn::SGD; use_gradient_storage(exec, storage) moves dW and db into memory of the
//     caller's (one block for a fused all-reduce). attach(kfac, index) makes the layer call
//     kfac->on_forward(exec, index, x) first in forward (Conv2d: kfac->on_forward(exec, index,
//     geometry, patches) once its patches are formed, or with x then where kfac computes factor A
//     faster from x) and kfac->on_backward(exec, index, dy) first
//     in backward; attach(nullptr, -1) detaches. The parameters start at zero (nn/init.hpp
//     initialises them).
// Every kernel runs on the caller's instance; gemm goes through kdist::gemm.
#pragma once

#include <kdist/core/error.hpp>
#include <kdist/core/products.hpp>
#include <kdist/kfac/layers.hpp>
#include <kdist/kfac/preconditioner.hpp>
#include <kdist/nn/tensor.hpp>

#include <Kokkos_Core.hpp>
#include <string>
#include <vector>

namespace kdist {
namespace nn {
namespace impl {

/// Y := X Wᵀ + b, with b broadcast over the rows (no bias when b is empty).
template <class ExecSpace, class WV, class BV, class XV, class YV>
void affine_forward(const ExecSpace& exec, const WV& W, const BV& b, const XV& X, const YV& Y) {
  using T = typename YV::non_const_value_type;
  const bool bias = b.extent(0) > 0;
  if (bias)
    Kokkos::parallel_for(
        "kdist::nn::affine_forward::bias", over(exec, Y), KOKKOS_LAMBDA(const int i, const int j) { Y(i, j) = b(j); });
  kdist::gemm(exec, "N", "T", T(1), X, W, bias ? T(1) : T(0), Y);
}

/// db(j) := Σ_i dY(i, j), a team per column (for a device).
template <class ExecSpace, class DYV, class DBV>
void column_sums_teams(const ExecSpace& exec, const DYV& dY, const DBV& db) {
  using T = typename DBV::non_const_value_type;
  kdist::impl::for_team_sums(
      "kdist::nn::column_sums", exec, static_cast<int>(db.extent(0)), static_cast<int>(dY.extent(0)),
      KOKKOS_LAMBDA(const int j, const int i) { return T(dY(i, j)); },
      KOKKOS_LAMBDA(const int j, const T sum) { db(j) = sum; });
}

/// db(j) := Σ_i dY(i, j): a team per column on a device, a column per work item on the host.
template <class ExecSpace, class DYV, class DBV>
void column_sums(const ExecSpace& exec, const DYV& dY, const DBV& db) {
  if constexpr (!kdist::impl::runs_on_host<ExecSpace>()) {
    column_sums_teams(exec, dY, db);
  } else {
    using T = typename DBV::non_const_value_type;
    const int rows = static_cast<int>(dY.extent(0));
    Kokkos::parallel_for(
        "kdist::nn::column_sums", Kokkos::RangePolicy<ExecSpace>(exec, 0, db.extent(0)), KOKKOS_LAMBDA(const int j) {
          T sum = 0;
          for (int i = 0; i < rows; ++i) sum += dY(i, j);
          db(j) = sum;
        });
  }
}

/// dW := dYᵀ X; db := Σ_rows dY (when db is not empty); dX := dY W (when dX is not empty).
template <class ExecSpace, class WV, class XV, class DYV, class DWV, class DBV, class DXV>
void affine_backward(const ExecSpace& exec, const WV& W, const XV& X, const DYV& dY, const DWV& dW, const DBV& db,
                     const DXV& dX) {
  using T = typename DWV::non_const_value_type;
  kdist::gemm(exec, "T", "N", T(1), dY, X, T(0), dW);
  if (db.extent(0) > 0) column_sums(exec, dY, db);
  if (dX.size() > 0) kdist::gemm(exec, "N", "N", T(1), dY, W, T(0), dX);
}

template <class T, class Mem>
class Affine {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value, "kdist::nn: float or double");

 public:
  using value_type = T;
  using memory_space = Mem;
  using execution_space = typename Mem::execution_space;
  using Preconditioner = kfac::Preconditioner<T, Mem>;

  const Tensor2<T, Mem>& weight() const noexcept { return W_; }
  /// Empty when the layer has no bias.
  const Tensor1<T, Mem>& bias() const noexcept { return b_; }
  const Tensor2<T, Mem>& weight_gradient() const noexcept { return dW_; }
  const Tensor1<T, Mem>& bias_gradient() const noexcept { return db_; }
  /// Views of dW and db, to hand to kfac::Preconditioner::step (preconditioned in place).
  typename Preconditioner::Gradient gradient() const { return {dW_, db_}; }
  /// (weight, dW) and, with a bias, (bias, db), for nn::SGD.
  std::vector<Parameter<T, Mem>> parameters() const {
    constexpr const char* func = "kdist::nn::parameters";
    std::vector<Parameter<T, Mem>> p{{layer_.describe() + ".weight", flat(func, W_), flat(func, dW_)}};
    if (layer_.bias()) p.push_back({layer_.describe() + ".bias", b_, db_});
    return p;
  }
  /// Elements of parameters(): the weights, plus the biases.
  std::size_t parameter_count() const noexcept { return W_.size() + b_.size(); }
  /// From now on dW and db live in `storage`, dW's entries then db's (the order of parameters()),
  /// memory the caller owns and keeps alive: e.g. one block for all layers that a fused
  /// all-reduce reduces in place (comm::FusedAllreducer::use_storage). The gradients' values are
  /// copied over; views taken before (gradient(), parameters()) keep the old storage. A storage of
  /// another size than parameter_count() is an InvalidArgument, and nothing changes.
  void use_gradient_storage(const execution_space& exec, const Tensor1<T, Mem>& storage) {
    impl::require_extents("kdist::nn::use_gradient_storage", storage, {parameter_count()},
                          "(weights + biases) for " + describe());
    const Tensor2<T, Mem> dW(storage.data(), dW_.extent(0), dW_.extent(1));
    const Tensor1<T, Mem> db(storage.data() + dW.size(), db_.extent(0));
    Kokkos::deep_copy(exec, dW, dW_);
    if (layer_.bias()) Kokkos::deep_copy(exec, db, db_);
    exec.fence();  // the copies read the old gradients, released here
    dW_ = dW;
    if (layer_.bias()) db_ = db;
  }
  /// From now on forward and backward call kfac's hooks for layer `index` first (nullptr: stop).
  void attach(Preconditioner* kfac, int index) noexcept {
    kfac_ = kfac;
    index_ = index;
  }
  Preconditioner* attached() const noexcept { return kfac_; }
  /// "Dense(784, 256, bias)": the name errors use.
  std::string describe() const { return layer_.describe(); }

 protected:
  /// `layer` gives the parameter shapes: outputs x inputs (+ outputs with a bias).
  explicit Affine(const kfac::Layer& layer)
      : layer_(layer),
        W_("kdist::nn::" + layer.describe() + ".weight", layer.outputs(), layer.inputs()),
        dW_("kdist::nn::" + layer.describe() + ".weight_gradient", layer.outputs(), layer.inputs()) {
    if (layer.bias()) {
      b_ = Tensor1<T, Mem>("kdist::nn::" + layer.describe() + ".bias", layer.outputs());
      db_ = Tensor1<T, Mem>("kdist::nn::" + layer.describe() + ".bias_gradient", layer.outputs());
    }
  }
  /// Builds the kfac::Layer, turning its size check into an error naming the nn layer.
  template <class Make>
  static kfac::Layer checked(const char* func, Make make) {
    try {
      return make();
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string(func) + ": " + e.what());
    }
  }
  template <class XView>
  void hook_forward(const execution_space& exec, const XView& x) {
    if (kfac_) kfac_->on_forward(exec, index_, x);
  }
  /// A Conv2d's forward hands kfac its im2col patches, so factor A reuses them, or its input x
  /// where factor A is cheaper from x (kfac::conv2d_a_factor_prefers_input).
  template <class PView, class XView>
  void hook_forward_conv(const execution_space& exec, const Conv2dGeometry& g, const PView& patches, const XView& x) {
    if (hook_reads_patches(g))
      kfac_->on_forward(exec, index_, g, patches);
    else if (kfac_)
      kfac_->on_forward(exec, index_, x);
  }
  /// Whether hook_forward_conv reads the patch matrix of a batch of geometry g.
  bool hook_reads_patches(const Conv2dGeometry& g) const {
    return kfac_ != nullptr && !kfac::conv2d_a_factor_prefers_input<execution_space>(layer_, g);
  }
  template <class YView>
  void hook_backward(const execution_space& exec, const YView& dy) {
    if (kfac_) kfac_->on_backward(exec, index_, dy);
  }

  kfac::Layer layer_;
  Tensor2<T, Mem> W_, dW_;
  Tensor1<T, Mem> b_, db_;
  Preconditioner* kfac_ = nullptr;
  int index_ = -1;
};

}  // namespace impl
}  // namespace nn
}  // namespace kdist
