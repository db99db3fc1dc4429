#include <kdist/core/error.hpp>
#include <kdist/kfac/layers.hpp>

#include <climits>
#include <string>

namespace kdist {
namespace kfac {

Layer::Layer(LayerKind kind, int in, int out, int kh, int kw, int stride, int padding, bool bias)
    : kind_(kind), in_(in), out_(out), kh_(kh), kw_(kw), stride_(stride), padding_(padding), bias_(bias) {
  if (in < 1 || out < 1 || kh < 1 || kw < 1 || stride < 1 || padding < 0)
    impl::throw_invalid("kdist::kfac::Layer", "sizes must be positive and padding >= 0, got " + describe());
  // inputs() and a_dim() are ints (factor dimensions, kernels' indices). Each product of two
  // values up to INT_MAX fits a long long; a factor past INT_MAX stops it.
  long long a_dim = in;
  if (kind == LayerKind::conv2d) {
    a_dim *= kh;
    if (a_dim <= INT_MAX) a_dim *= kw;
  }
  if (a_dim <= INT_MAX) a_dim += bias ? 1 : 0;
  if (a_dim > INT_MAX) impl::throw_invalid("kdist::kfac::Layer", "the A factor's dimension exceeds int: " + describe());
}

namespace {
int conv_out(const Layer& l, int size, int kernel, const char* which) {
  if (size < 1 || size + 2LL * l.padding() < kernel)
    impl::throw_invalid("kdist::kfac::Layer", std::string("input ") + which + " " + std::to_string(size) +
                                                  " is too small for " + l.describe());
  const long long out = (size + 2LL * l.padding() - kernel) / l.stride() + 1;
  if (out > INT_MAX)
    impl::throw_invalid("kdist::kfac::Layer", std::string("output ") + which + " " + std::to_string(out) +
                                                  " exceeds int for input " + std::to_string(size) + " and " +
                                                  l.describe());
  return static_cast<int>(out);
}
}  // namespace

int Layer::out_h(int h) const {
  return kind_ == LayerKind::dense ? 1 : conv_out(*this, h, kh_, "height");
}
int Layer::out_w(int w) const {
  return kind_ == LayerKind::dense ? 1 : conv_out(*this, w, kw_, "width");
}

std::string Layer::describe() const {
  const std::string b = bias_ ? ", bias" : ", no bias";
  if (kind_ == LayerKind::dense) return "Dense(" + std::to_string(in_) + ", " + std::to_string(out_) + b + ")";
  return "Conv2d(" + std::to_string(in_) + ", " + std::to_string(out_) + ", " + std::to_string(kh_) + "x" +
         std::to_string(kw_) + ", stride " + std::to_string(stride_) + ", padding " + std::to_string(padding_) + b +
         ")";
}

}  // namespace kfac
}  // namespace kdist
