// The main job's MLP and CNN in LibTorch, shared by examples/torch_fashion_mnist and
// perf/bench/bench_torch_reducer, and the gradient averaging a LibTorch code writes without kdist
// (one blocking MPI_Allreduce per gradient tensor): the baseline both measure kdist against.
#pragma once

#include <kdist/nn/init.hpp>
#include <kdist/torch/kfac.hpp>
#include <kdist/torch/tensor_view.hpp>

#include <mpi.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace examples {

// mlp: 784-256-128-10; cnn: Conv(1,16,5x5,pad 2) ReLU MaxPool2 Conv(16,32,5x5,pad 2) ReLU MaxPool2
// Dense(1568,128) ReLU Dense(128,10) - examples/fashion_mnist/model.hpp's layers.
struct TorchNet : ::torch::nn::Module {
  explicit TorchNet(bool cnn) : cnn_(cnn) {
    if (cnn_) {
      conv1 = register_module("conv1", ::torch::nn::Conv2d(::torch::nn::Conv2dOptions(1, 16, 5).padding(2)));
      conv2 = register_module("conv2", ::torch::nn::Conv2d(::torch::nn::Conv2dOptions(16, 32, 5).padding(2)));
    }
    const int features = cnn_ ? 32 * 7 * 7 : 28 * 28;
    for (const int width : cnn_ ? std::vector<int>{128, 10} : std::vector<int>{256, 128, 10}) {
      dense.push_back(register_module("fc" + std::to_string(dense.size() + 1),
                                      ::torch::nn::Linear(dense.empty() ? features : last_width_, width)));
      last_width_ = width;
    }
  }
  /// examples/fashion_mnist's initialisation, value for value: He normal weights drawn from
  /// (seed, seed + 1, ...) in layer order (nn/init.hpp), zero biases.
  void initialise(std::uint64_t seed) {
    ::torch::NoGradGuard no_grad;
    const auto init = [&](at::Tensor& weight, at::Tensor& bias) {
      const int fan_in = static_cast<int>(weight.numel() / weight.size(0));
      kdist::nn::he_normal(Kokkos::DefaultHostExecutionSpace(),
                           kdist::torch::flat_view_of<float, Kokkos::HostSpace>(weight, "weight"), fan_in, seed++);
      bias.zero_();
    };
    if (cnn_)
      for (auto* c : {&conv1, &conv2}) init((*c)->weight, (*c)->bias);
    for (auto& d : dense) init(d->weight, d->bias);
  }
  /// Logits of x (B x 784); with `kfac` its layers run through kfac.forward.
  at::Tensor forward(at::Tensor x, kdist::torch::KFAC* kfac) {
    const auto run = [&](auto& layer, const at::Tensor& in) { return kfac ? kfac->forward(layer, in) : layer(in); };
    if (cnn_) {
      x = x.view({-1, 1, 28, 28});
      x = ::torch::max_pool2d(::torch::relu(run(conv1, x)), 2);
      x = ::torch::max_pool2d(::torch::relu(run(conv2, x)), 2);
      x = x.flatten(1);
    }
    for (std::size_t k = 0; k < dense.size(); ++k) {
      x = run(dense[k], x);
      if (k + 1 < dense.size()) x = ::torch::relu(x);
    }
    return x;
  }
  bool cnn_;
  int last_width_ = 0;
  ::torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  std::vector<::torch::nn::Linear> dense;
};

/// Every gradient of `model` := its mean over the `ranks` of MPI_COMM_WORLD, one blocking
/// MPI_Allreduce per tensor (float32, contiguous).
inline void mpi_average_gradients(::torch::nn::Module& model, int ranks) {
  for (const auto& p : model.parameters()) {
    at::Tensor g = p.grad();
    MPI_Allreduce(MPI_IN_PLACE, g.data_ptr<float>(), static_cast<int>(g.numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    g.div_(ranks);
  }
}

}  // namespace examples
