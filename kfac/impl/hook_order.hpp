// The order of the K-FAC hooks within one step, checked without templates: on_forward for layers
// 0..L-1, then on_backward for L-1..0, then step(). Each check returns an empty string when the
// call is in order, or the message (naming the hook, the layer, what was expected and the rank)
// that the Preconditioner raises on this rank and sends to the others. State changes only through
// the advance_* calls, made once a hook has done its work, so a failed hook can be retried.
#pragma once

#include <string>

namespace kdist {
namespace kfac {
namespace impl {

class HookOrder {
 public:
  HookOrder(int layers, int rank) : layers_(layers), rank_(rank) {}

  /// `layer` is not one of the layers.
  std::string check_layer(const char* hook, int layer) const;
  std::string check_forward(int layer) const;
  std::string check_backward(int layer) const;
  /// step(): every layer's hooks ran.
  std::string check_step() const;
  /// save()/load(): between step() and the next on_forward.
  std::string check_between_steps(const char* operation) const;

  void advance_forward();
  void advance_backward() { --next_backward_; }
  void start_step() { next_forward_ = 0, next_backward_ = -1; }

 private:
  std::string out_of_order(const char* hook, int layer, int expected) const;
  int layers_, rank_;
  int next_forward_ = 0, next_backward_ = -1;
};

}  // namespace impl
}  // namespace kfac
}  // namespace kdist
