// K-FAC for LibTorch models: the model's torch::nn::Linear and torch::nn::Conv2d modules become
// the layers of a kfac::Preconditioner (SPD-KFAC by default), the way kfac-pytorch's
// KFACPreconditioner wraps a Python model.
//
//   kdist::comm::Engine kfac_engine(world);
//   kdist::torch::KFAC kfac(*model, kfac_engine, options);   // finds fc1, fc2, ... in order
//   // in the model's forward: x = kfac.forward(fc1, x) instead of x = fc1(x)
//   loss.backward();
//   reducer.allreduce();   // the gradients averaged over the ranks (gradient_reducer.hpp)
//   kfac.step();           // every layer's weight.grad() / bias.grad() := preconditioned, in place
//   optimizer.step();
//
// LibTorch C++ modules have no forward hooks, so the model routes its K-FAC layers through
// forward(module, x): it records the input (factor A) and puts a hook on the output's gradient
// (factor G, in backward), then returns module(x). Outside training (module.is_training() false,
// or grad mode off) it is module(x) alone. Layers are the model's Linear and Conv2d modules in
// registration order (model.modules()); each must be run through forward() once per step, in that
// order. Conv2d: zero padding, equal strides and paddings in both directions, no dilation, one
// group. Tensors: float32, contiguous, on the CPU (a CUDA build: on the GPU), inputs B x in
// (Linear) or NCHW (Conv2d). The loss must be the mean over the rank's batch (the G factor's
// normalisation, as in kfac/factors.hpp).
//
// Errors: a module that is not one of the model's layers or of a kind kdist does not know, a
// tensor of another dtype or device, a non-contiguous gradient, layers out of order: an
// InvalidArgument on this rank naming the module and the rank, and the Engine fails, so every
// other rank raises comm::RemoteError with it at its next wait on this Engine (fail the reducer's
// Engine too in your catch block: docs/torch.md). With Adasum (each rank's own gradient), give
// options.gradients = kfac::Gradients::per_rank.
#pragma once

#include <kdist/kfac/preconditioner.hpp>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <memory>
#include <string>
#include <vector>

namespace kdist {
namespace torch {

class KFAC {
 public:
  using Preconditioner = kfac::Preconditioner<float>;

  /// `model` and `engine` are borrowed and must outlive the KFAC. Not copied or moved: the
  /// gradient hooks of a forward in flight find it where it was built.
  KFAC(::torch::nn::Module& model, comm::Engine& engine, kfac::Options options = {});
  KFAC(const KFAC&) = delete;
  KFAC& operator=(const KFAC&) = delete;

  /// module(x), recording what K-FAC needs when training (see above).
  at::Tensor forward(::torch::nn::Module& module, const at::Tensor& x);
  /// The same for a module holder (torch::nn::Linear fc1; kfac.forward(fc1, x)).
  template <class Impl>
  at::Tensor forward(::torch::nn::ModuleHolder<Impl>& holder, const at::Tensor& x) {
    return forward(static_cast<::torch::nn::Module&>(*holder.ptr()), x);
  }

  /// Preconditions every layer's gradient in place (after they are reduced over the ranks).
  void step();

  /// The layers' names, e.g. "fc1, fc2", and the preconditioner's describe() (which lists their
  /// shapes, "Dense(784, 256, bias)", in the same order).
  std::string describe() const;
  Preconditioner& preconditioner() noexcept { return *kfac_; }
  int layers() const noexcept { return static_cast<int>(modules_.size()); }

 private:
  /// InvalidArgument(message) here, the Engine failed so every rank hears it.
  [[noreturn]] void refuse(const std::string& message);
  int layer_of(const ::torch::nn::Module& module, const char* operation);
  void on_output_gradient(int layer, const at::Tensor& dy);

  comm::Engine& engine_;
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<::torch::nn::Module>> modules_;
  std::vector<at::Tensor> weights_, biases_;  // per layer (an undefined bias: none)
  std::unique_ptr<Preconditioner> kfac_;
  std::shared_ptr<KFAC*> self_ = std::make_shared<KFAC*>(this);  // what the hooks hold, weakly
};

}  // namespace torch
}  // namespace kdist
