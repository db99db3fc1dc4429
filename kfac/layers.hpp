// Layer descriptions for K-FAC: what the preconditioner must know about a layer to build its
// Kronecker factors and precondition its gradient. No parameters live here; the caller owns them.
//
//   Dense(in, out, bias)        activations rows x in, output gradients rows x out,
//                               weight gradient out x in (row-major), bias gradient out.
//   Conv2d(c_in, c_out, kh, kw, stride, padding, bias)
//                               activations NCHW (B, c_in, H, W), output gradients NCHW
//                               (B, c_out, OH, OW), weight gradient c_out x (c_in*kh*kw) with the
//                               column index (c*kh + i)*kw + j (PyTorch's weight.view(c_out, -1)).
//
// Factor dimensions: A is a_dim() = inputs (+1 with bias), G is g_dim() = outputs. The bias is
// the last column of the preconditioned gradient [dW | db], and the last row/column of A.
// Normalisation (KFC, docs/architecture.md §3) is stated in kfac/factors.hpp.
// Constructors throw InvalidArgument on non-positive sizes or a negative padding.
#pragma once

#include <string>

namespace kdist {
namespace kfac {

enum class LayerKind { dense, conv2d };

class Layer {
 public:
  LayerKind kind() const noexcept { return kind_; }
  bool bias() const noexcept { return bias_; }
  /// Columns of the weight gradient without the bias: in, or c_in*kh*kw.
  int inputs() const noexcept { return kind_ == LayerKind::dense ? in_ : in_ * kh_ * kw_; }
  int outputs() const noexcept { return out_; }
  int a_dim() const noexcept { return inputs() + (bias_ ? 1 : 0); }
  int g_dim() const noexcept { return out_; }
  // Conv2d geometry (in_ is c_in for both kinds).
  int in_channels() const noexcept { return in_; }
  int kernel_h() const noexcept { return kh_; }
  int kernel_w() const noexcept { return kw_; }
  int stride() const noexcept { return stride_; }
  int padding() const noexcept { return padding_; }
  /// Output height/width for an input of height/width h, w (Conv2d); InvalidArgument if the
  /// kernel does not fit.
  int out_h(int h) const;
  int out_w(int w) const;
  /// "Dense(784, 256, bias)" or "Conv2d(1, 32, 5x5, stride 1, padding 2, bias)".
  std::string describe() const;

 protected:
  Layer(LayerKind kind, int in, int out, int kh, int kw, int stride, int padding, bool bias);

 private:
  LayerKind kind_;
  int in_, out_, kh_, kw_, stride_, padding_;
  bool bias_;
};

struct Dense : Layer {
  Dense(int in, int out, bool bias = true) : Layer(LayerKind::dense, in, out, 1, 1, 1, 0, bias) {}
};

struct Conv2d : Layer {
  Conv2d(int c_in, int c_out, int kh, int kw, int stride = 1, int padding = 0, bool bias = true)
      : Layer(LayerKind::conv2d, c_in, c_out, kh, kw, stride, padding, bias) {}
};

}  // namespace kfac
}  // namespace kdist
