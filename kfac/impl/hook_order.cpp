// kfac/impl/hook_order.hpp: the messages of out-of-order hooks.
#include <kdist/kfac/impl/hook_order.hpp>

namespace kdist {
namespace kfac {
namespace impl {

std::string HookOrder::check_layer(const char* hook, int l) const {
  if (l >= 0 && l < layers_) return {};
  return std::string("kdist::kfac::") + hook + ": layer " + std::to_string(l) + " is not one of the " +
         std::to_string(layers_) + " layers (rank " + std::to_string(rank_) + ")";
}

std::string HookOrder::out_of_order(const char* hook, int l, int expected) const {
  if (l == expected) return {};
  const std::string what = expected < 0 || expected >= layers_
                               ? "every layer's " + std::string(hook) + " already ran this step"
                               : "expected layer " + std::to_string(expected) + " next";
  return std::string("kdist::kfac::") + hook + "(layer " + std::to_string(l) + "): out of order, " + what +
         " (forward hooks go 0.." + std::to_string(layers_ - 1) + ", then backward hooks the other way; rank " +
         std::to_string(rank_) + ")";
}

std::string HookOrder::check_forward(int l) const {
  return out_of_order("on_forward", l, next_forward_);
}

std::string HookOrder::check_backward(int l) const {
  if (next_forward_ != layers_)
    return "kdist::kfac::on_backward(layer " + std::to_string(l) + "): called before every layer's on_forward (" +
           std::to_string(next_forward_) + " of " + std::to_string(layers_) + " ran; rank " + std::to_string(rank_) +
           ")";
  return out_of_order("on_backward", l, next_backward_);
}

std::string HookOrder::check_step() const {
  if (next_forward_ == layers_ && next_backward_ == -1) return {};
  return "kdist::kfac::step: called before every layer's hooks ran (" + std::to_string(next_forward_) + " of " +
         std::to_string(layers_) + " on_forward, " + std::to_string(layers_ - 1 - next_backward_) + " of " +
         std::to_string(layers_) + " on_backward; rank " + std::to_string(rank_) + ")";
}

std::string HookOrder::check_between_steps(const char* operation) const {
  if (next_forward_ == 0) return {};
  return std::string("kdist::kfac::Preconditioner::") + operation +
         ": called inside a step (after on_forward); call it between step() and the next on_forward (rank " +
         std::to_string(rank_) + ")";
}

void HookOrder::advance_forward() {
  if (++next_forward_ == layers_) next_backward_ = layers_ - 1;
}

}  // namespace impl
}  // namespace kfac
}  // namespace kdist
