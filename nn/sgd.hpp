// nn::SGD<T, Mem>: stochastic gradient descent with momentum and weight decay, PyTorch's
// semantics (torch.optim.SGD with dampening 0, not Nesterov), over (parameter, gradient) pairs.
//
//   SGD<T, Mem> sgd(parameters_of(conv, dense), lr, momentum = 0, weight_decay = 0);
//   sgd.step(exec);   // for every element of every parameter, in this order:
//                     //   g := grad + weight_decay · w;  v := momentum · v + g;  w := w - lr · v
//
// The velocity v starts at zero (so the first step's v is g, as in PyTorch) and belongs to the
// optimizer; the gradients are only read. Parameters are nn::Parameter views that do not own
// the storage: the layers must outlive the optimizer. parameters_of(layers...) concatenates the
// layers' parameters() in order. The step is one kernel per parameter on `exec`, asynchronous.
// Errors (InvalidArgument "kdist::nn::SGD: ..."): a negative or non-finite lr, momentum or weight
// decay; a parameter whose gradient has another size (naming it and both sizes).
#pragma once

#include <kdist/nn/tensor.hpp>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace kdist {
namespace nn {

template <class T, class Mem = Kokkos::DefaultExecutionSpace::memory_space>
class SGD {
 public:
  using execution_space = typename Mem::execution_space;

  SGD(std::vector<Parameter<T, Mem>> parameters, double lr, double momentum = 0, double weight_decay = 0)
      : parameters_(std::move(parameters)),
        momentum_(check("momentum", momentum)),
        weight_decay_(check("weight_decay", weight_decay)) {
    set_learning_rate(lr);
    for (const Parameter<T, Mem>& p : parameters_) {
      if (p.value.extent(0) != p.gradient.extent(0))
        impl::throw_invalid("kdist::nn::SGD", "parameter '" + p.name + "' " + impl::describe(p.value) +
                                                  " and its gradient " + impl::describe(p.gradient) +
                                                  " differ in size");
      velocity_.push_back(Tensor1<T, Mem>("kdist::nn::SGD::velocity " + p.name, p.value.extent(0)));
    }
  }

  void set_learning_rate(double lr) { lr_ = check("lr", lr); }
  double learning_rate() const noexcept { return lr_; }
  const std::vector<Parameter<T, Mem>>& parameters() const noexcept { return parameters_; }
  /// The momentum buffers, one per parameter: the optimizer's state, for checkpoints.
  const std::vector<Tensor1<T, Mem>>& velocities() const noexcept { return velocity_; }

  void step(const execution_space& exec) {
    const T lr = static_cast<T>(lr_), mu = static_cast<T>(momentum_), wd = static_cast<T>(weight_decay_);
    for (std::size_t n = 0; n < parameters_.size(); ++n) {
      const auto w = parameters_[n].value;
      const auto g = parameters_[n].gradient;
      const auto v = velocity_[n];
      Kokkos::parallel_for(
          "kdist::nn::SGD::step", Kokkos::RangePolicy<execution_space>(exec, 0, w.extent(0)),
          KOKKOS_LAMBDA(const std::size_t i) {  // a parameter may pass 2^31 entries
            v(i) = mu * v(i) + (g(i) + wd * w(i));
            w(i) -= lr * v(i);
          });
    }
  }
  void step() { step(execution_space{}); }

 private:
  static double check(const char* what, double x) {
    if (!(x >= 0) || !std::isfinite(x))
      impl::throw_invalid("kdist::nn::SGD", std::string(what) + " " + std::to_string(x) + " must be finite and >= 0");
    return x;
  }

  std::vector<Parameter<T, Mem>> parameters_;
  std::vector<Tensor1<T, Mem>> velocity_;
  double lr_ = 0, momentum_, weight_decay_;
};

/// Every layer's parameters(), in the order given.
template <class Layer, class... More>
auto parameters_of(const Layer& layer, const More&... more) {
  auto all = layer.parameters();
  const auto append = [&all](const auto& next) {
    const auto list = next.parameters();
    all.insert(all.end(), list.begin(), list.end());
  };
  (append(more), ...);
  return all;
}

}  // namespace nn
}  // namespace kdist
