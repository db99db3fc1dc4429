#include <kdist/torch/kfac.hpp>
#include <kdist/torch/tensor_view.hpp>

#include <torch/autograd.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <sstream>
#include <type_traits>

namespace kdist {
namespace torch {

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;

template <class M>
auto as_linear(M& m) {
  return dynamic_cast<
      std::conditional_t<std::is_const<M>::value, const ::torch::nn::LinearImpl, ::torch::nn::LinearImpl>*>(&m);
}
template <class M>
auto as_conv(M& m) {
  return dynamic_cast<
      std::conditional_t<std::is_const<M>::value, const ::torch::nn::Conv2dImpl, ::torch::nn::Conv2dImpl>*>(&m);
}

/// Conv2d's K-FAC layer, or the reason kdist cannot precondition it.
kfac::Layer conv_layer(const ::torch::nn::Conv2dImpl& c, const std::string& name) {
  const auto& o = c.options;
  const auto kernel = *o.kernel_size(), stride = *o.stride(), dilation = *o.dilation();
  int padding[2] = {0, 0};
  if (const auto* p = c10::get_if<::torch::ExpandingArray<2>>(&o.padding()))
    padding[0] = static_cast<int>((**p)[0]), padding[1] = static_cast<int>((**p)[1]);
  else if (!c10::get_if<::torch::enumtype::kValid>(&o.padding()))
    kdist::impl::throw_invalid("kdist::torch::KFAC", name + ": Conv2d with padding 'same' is not supported");
  std::string why;
  if (stride[0] != stride[1] || padding[0] != padding[1]) why = "different strides or paddings in H and W";
  if (dilation[0] != 1 || dilation[1] != 1) why = "dilation";
  if (o.groups() != 1) why = "groups";
  if (!c10::get_if<::torch::enumtype::kZeros>(&o.padding_mode())) why = "a padding mode other than zeros";
  if (!why.empty())
    kdist::impl::throw_invalid("kdist::torch::KFAC", name + ": Conv2d with " + why + " is not supported");
  return kfac::Conv2d(static_cast<int>(o.in_channels()), static_cast<int>(o.out_channels()),
                      static_cast<int>(kernel[0]), static_cast<int>(kernel[1]), static_cast<int>(stride[0]), padding[0],
                      o.bias());
}

}  // namespace

KFAC::KFAC(::torch::nn::Module& model, comm::Engine& engine, kfac::Options options) : engine_(engine) {
  std::vector<kfac::Layer> layers;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    ::torch::nn::Module& m = *item.value();
    const std::string name = item.key().empty() ? model.name() : item.key();
    if (auto* l = as_linear(m)) {
      layers.push_back(kfac::Dense(static_cast<int>(l->options.in_features()),
                                   static_cast<int>(l->options.out_features()), l->options.bias()));
      weights_.push_back(l->weight);
      biases_.push_back(l->bias);
    } else if (auto* c = as_conv(m)) {
      layers.push_back(conv_layer(*c, name));
      weights_.push_back(c->weight);
      biases_.push_back(c->bias);
    } else {
      continue;
    }
    names_.push_back(name);
    modules_.push_back(item.value());
  }
  if (layers.empty())
    kdist::impl::throw_invalid("kdist::torch::KFAC",
                               "the model (" + model.name() + ") has no torch::nn::Linear or torch::nn::Conv2d module");
  kfac_ = std::make_unique<Preconditioner>(engine_, std::move(layers), std::move(options));
}

void KFAC::refuse(const std::string& message) {
  const InvalidArgument error(message);
  engine_.fail(error);
  throw error;
}

int KFAC::layer_of(const ::torch::nn::Module& module, const char* operation) {
  for (std::size_t l = 0; l < modules_.size(); ++l)
    if (modules_[l].get() == &module) return static_cast<int>(l);
  const bool known = as_linear(module) || as_conv(module);
  refuse(std::string("kdist::torch::KFAC::") + operation + ": " + module.name() +
         (known ? " is not one of this model's layers" : " is not a kind of layer K-FAC knows (Linear, Conv2d)") +
         " (rank " + std::to_string(engine_.rank()) + ")");
}

at::Tensor KFAC::forward(::torch::nn::Module& module, const at::Tensor& x) {
  const int l = layer_of(module, "forward");
  auto* linear = as_linear(module);
  const bool training = module.is_training() && ::torch::GradMode::is_enabled();
  const std::string& name = names_[static_cast<std::size_t>(l)];
  if (training) {
    try {
      // The input, then the module's own parameters: torch's forward would refuse those with its
      // own error after this rank had recorded factor A, the others waiting for its factor G.
      const auto check_parameters = [&] {
        flat_view_of<float, Mem>(weights_[static_cast<std::size_t>(l)], name + ".weight");
        if (biases_[static_cast<std::size_t>(l)].defined())
          flat_view_of<float, Mem>(biases_[static_cast<std::size_t>(l)], name + ".bias");
      };
      if (linear) {
        const auto input = view_of<float**, Mem>(x, name + " input");
        check_parameters();
        kfac_->on_forward(Exec(), l, input);
      } else {
        const auto input = view_of<float****, Mem>(x, name + " input");
        check_parameters();
        kfac_->on_forward(Exec(), l, input);
      }
    } catch (const comm::RemoteError&) {
      throw;
    } catch (const InvalidArgument& e) {
      if (!engine_.healthy()) throw;  // the preconditioner has told the peers already
      refuse(std::string(e.what()) + " (kdist::torch::KFAC::forward)");
    }
  }
  at::Tensor y;
  try {
    y = linear ? linear->forward(x) : as_conv(module)->forward(x);
  } catch (const c10::Error& e) {
    if (!training) throw;  // nothing recorded, no peer waits on this rank
    refuse("kdist::torch::KFAC::forward: " + name + " refused its input: " + e.what_without_backtrace() + " (rank " +
           std::to_string(engine_.rank()) + ")");
  }
  // The hook holds the KFAC weakly: one destroyed between forward and backward records nothing.
  if (training && y.requires_grad())
    y.register_hook([self = std::weak_ptr<KFAC*>(self_), l](const at::Tensor& dy) {
      if (const auto kfac = self.lock()) (*kfac)->on_output_gradient(l, dy);
    });
  return y;
}

void KFAC::on_output_gradient(int l, const at::Tensor& dy) {
  const std::string what = names_[static_cast<std::size_t>(l)] + " output gradient";
  try {
    const at::Tensor g = dy.contiguous();  // autograd's own tensor: a copy only when it is strided
    if (as_linear(*modules_[static_cast<std::size_t>(l)]))
      kfac_->on_backward(Exec(), l, view_of<float**, Mem>(g, what));
    else
      kfac_->on_backward(Exec(), l, view_of<float****, Mem>(g, what));
  } catch (const comm::RemoteError&) {
    throw;
  } catch (const InvalidArgument& e) {
    if (!engine_.healthy()) throw;
    refuse(std::string(e.what()) + " (kdist::torch::KFAC, backward)");
  }
}

void KFAC::step() {
  std::vector<Preconditioner::Gradient> grads;
  for (std::size_t l = 0; l < modules_.size(); ++l) {
    const std::string& name = names_[l];
    const at::Tensor& weight = weights_[l];
    const at::Tensor& bias = biases_[l];
    if (!weight.grad().defined())
      refuse("kdist::torch::KFAC::step: " + name + ".weight has no gradient: call backward() first (rank " +
             std::to_string(engine_.rank()) + ")");
    Preconditioner::Gradient g;
    try {
      if (!weight.grad().is_contiguous())
        impl::refuse("KFAC::step", name + ".weight gradient", "not contiguous", weight.grad());
      g.weight = view_of<float**, Mem>(weight.grad().view({weight.size(0), -1}), name + ".weight gradient");
      if (bias.defined()) g.bias = view_of<float*, Mem>(bias.grad(), name + ".bias gradient");
    } catch (const InvalidArgument& e) {
      refuse(e.what());
    }
    grads.push_back(g);
  }
  kfac_->step(Exec(), grads);
}

std::string KFAC::describe() const {
  std::ostringstream os;
  os << "kdist::torch::KFAC over " << modules_.size() << " layer(s):";
  for (std::size_t l = 0; l < modules_.size(); ++l) os << (l ? ", " : " ") << names_[l];
  os << "\n" << kfac_->describe();
  return os.str();
}

}  // namespace torch
}  // namespace kdist
