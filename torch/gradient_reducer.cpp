#include <kdist/torch/gradient_reducer.hpp>
#include <kdist/torch/tensor_view.hpp>

namespace kdist {
namespace torch {

namespace {
using Exec = Kokkos::DefaultExecutionSpace;
}

GradientReducer::GradientReducer(::torch::nn::Module& model, comm::Engine& engine, Reduce reduce)
    : engine_(engine), reduce_(reduce) {
  std::vector<typename comm::FusedAllreducer<float, Mem>::Tensor> tensors;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    names_.push_back(item.key());
    params_.push_back(item.value());
    tensors.push_back({item.key(), static_cast<std::size_t>(item.value().numel()), false});
  }
  if (params_.empty())
    kdist::impl::throw_invalid("kdist::torch::GradientReducer",
                               "the model (" + model.name() + ") has no parameter that requires a gradient");
  if (reduce_ == Reduce::average) {
    // Every gradient is ready once backward returns, so nothing is gained by sending early:
    // groups of up to 64 MiB, Horovod's default fusion threshold.
    fused_ = std::make_unique<comm::FusedAllreducer<float, Mem>>(engine_, tensors);
    fused_->set_plan(comm::plan_threshold(fused_->measured(), comm::kDefaultFusionBytes));
  } else {
    adasum_ = std::make_unique<adasum::DeltaOptimizer<float, Mem>>(engine_, parameter_views(), nullptr, names_);
  }
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::refuse(const std::string& message) {
  const InvalidArgument error(message);
  engine_.fail(error);
  throw error;
}

std::vector<Kokkos::View<float*, GradientReducer::Mem>> GradientReducer::gradients(const char* operation) {
  std::vector<Kokkos::View<float*, Mem>> grads;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor g = params_[i].grad();
    if (!g.defined())
      refuse(std::string("kdist::torch::GradientReducer::") + operation + ": " + names_[i] +
             " has no gradient: call backward() first, and use every parameter (rank " +
             std::to_string(engine_.rank()) + ")");
    try {
      grads.push_back(flat_view_of<float, Mem>(g, names_[i] + " gradient"));
    } catch (const InvalidArgument& e) {
      refuse(e.what());
    }
  }
  return grads;
}

void GradientReducer::allreduce() {
  if (!fused_) refuse("kdist::torch::GradientReducer::allreduce: this reducer combines by Adasum: call step()");
  const auto grads = gradients("allreduce");
  if (!bucket_.defined()) make_bucket();
  Exec exec;
  fused_->begin();
  for (std::size_t i = 0; i < grads.size(); ++i) fused_->ready(exec, static_cast<int>(i), grads[i]);
  fused_->wait(exec);
  attach_gradients();
}

// The gradients as pieces of one bucket that is also the fusion buffer (PyTorch DDP's
// gradient_as_bucket_view): backward accumulates into it in place (LibTorch 1.13's
// Optimizer::zero_grad zeroes a gradient without replacing it), so allreduce() reduces it where it
// lies, no copy in or out. The bucket is torch's storage, so a gradient outlives the reducer.
void GradientReducer::make_bucket() {
  std::int64_t total = 0;
  for (const auto& p : params_) total += p.numel();
  bucket_ = ::torch::zeros({total}, params_.front().grad().options());
  fused_->use_storage(FusedBuffer(bucket_.data_ptr<float>(), static_cast<std::size_t>(total)));
}

// A gradient not in its slot (the first step, or one replaced since: zero_grad(true), an
// assignment) was copied in and its result out; from now on it is the slot itself, which holds
// the same result. Each shares the bucket's storage rather than being a view of it, because
// zero_grad detaches gradients in place, which torch refuses on a view. One on another GPU than
// the bucket's stays where it is.
void GradientReducer::attach_gradients() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor grad = params_[i].grad();
    const float* slot = fused_->slot_data(static_cast<int>(i));
    if (grad.data_ptr() != slot && grad.device() == bucket_.device()) {
      at::Tensor g = ::torch::empty({0}, bucket_.options());
      g.set_(bucket_.storage(), slot - bucket_.data_ptr<float>(), grad.sizes());
      params_[i].mutable_grad() = g;
    }
  }
}

// Views of the parameters' storage as it is now: torch::load and Module::to give a parameter new
// storage (Tensor::set_), and the delta optimizer must snapshot and write the live one.
std::vector<Kokkos::View<float*, GradientReducer::Mem>> GradientReducer::parameter_views() const {
  std::vector<Kokkos::View<float*, Mem>> values;
  for (std::size_t i = 0; i < params_.size(); ++i) values.push_back(flat_view_of<float, Mem>(params_[i], names_[i]));
  return values;
}

void GradientReducer::step(const std::function<void()>& local_step) {
  if (!adasum_) refuse("kdist::torch::GradientReducer::step: this reducer averages: call allreduce()");
  const auto grads = gradients("step");
  try {
    adasum_->rebind(parameter_views());
  } catch (const InvalidArgument& e) {
    refuse(e.what());
  }
  adasum_->step(Exec(), grads, local_step);
}

}  // namespace torch
}  // namespace kdist
