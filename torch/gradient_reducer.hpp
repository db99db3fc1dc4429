// Gradient reduction over a LibTorch model's parameters, the way Horovod's DistributedOptimizer
// does it: averaged after backward in fused all-reduces of up to 64 MiB (comm::FusedAllreducer,
// Horovod's default threshold), or Adasum over the optimizer's parameter deltas
// (adasum::DeltaOptimizer, Horovod's op=Adasum; with K-FAC, its Options::gradients = per_rank).
//
//   kdist::comm::Engine engine(world);
//   kdist::torch::GradientReducer reducer(*model, engine);           // average
//   loss.backward(); reducer.allreduce(); optimizer.step();
//
//   kdist::torch::GradientReducer reducer(*model, engine, kdist::torch::Reduce::adasum);
//   loss.backward(); reducer.step([&] { kfac.step(); optimizer.step(); });
//
// The parameters are the model's that require gradients, in named_parameters() order, float32,
// contiguous, on the view's device (tensor_view.hpp). allreduce() averages: each rank's loss must
// be the mean over equal shares of the global batch (weight it otherwise). It leaves every .grad()
// a tensor on the storage of one bucket, the fusion buffer itself (PyTorch DDP's
// gradient_as_bucket_view), so from the second step on, backward accumulates into the bucket and
// the gradients are reduced where they lie, with no copy in or out; a .grad() replaced meanwhile
// (zero_grad(true), LibTorch 2's default, or an assignment) is copied, reduced and attached again.
// Errors (a parameter without a gradient, another dtype or device) are an InvalidArgument naming
// the parameter and the rank; the Engine fails so the other ranks raise comm::RemoteError with it
// at their next wait on it. With a KFAC on another Engine, fail that one too in your catch block
// (docs/torch.md), or peers waiting on it hang. The parameters' storage is read at every step:
// torch::load or Module::to after construction is followed.
#pragma once

#include <kdist/adasum/delta_optimizer.hpp>
#include <kdist/comm/fused_allreducer.hpp>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kdist {
namespace torch {

enum class Reduce { average, adasum };

class GradientReducer {
 public:
  using Mem = Kokkos::DefaultExecutionSpace::memory_space;

  /// `model` (its parameters) and `engine` are borrowed and must outlive the reducer.
  GradientReducer(::torch::nn::Module& model, comm::Engine& engine, Reduce reduce = Reduce::average);
  ~GradientReducer();

  /// Reduce::average: every parameter's .grad() := its mean over the ranks.
  void allreduce();
  /// Reduce::adasum: `local_step` moves this rank's parameters (the optimizer's step); then the
  /// ranks' parameter deltas are combined by Adasum and every rank holds the result.
  void step(const std::function<void()>& local_step);

  Reduce reduce() const noexcept { return reduce_; }
  std::size_t parameters() const noexcept { return params_.size(); }

 private:
  [[noreturn]] void refuse(const std::string& message);
  std::vector<Kokkos::View<float*, Mem>> gradients(const char* operation);
  std::vector<Kokkos::View<float*, Mem>> parameter_views() const;
  using FusedBuffer = typename comm::FusedAllreducer<float, Mem>::Buffer;
  void make_bucket();
  void attach_gradients();

  comm::Engine& engine_;
  Reduce reduce_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;
  // Reduce::average: every gradient's storage from the first allreduce() on, and the fusion
  // buffer (declared before fused_, so it outlives it).
  at::Tensor bucket_;
  std::unique_ptr<comm::FusedAllreducer<float, Mem>> fused_;
  std::unique_ptr<adasum::DeltaOptimizer<float, Mem>> adasum_;
};

}  // namespace torch
}  // namespace kdist
