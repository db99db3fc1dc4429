// Layer lists of four ImageNet CNNs for the K-FAC scale model: every Conv2d and Linear layer (the
// layers K-FAC preconditions), in forward order, with the shapes that fix the cost of its factors,
// inverses and products. BatchNorm, pooling and activations carry no K-FAC factors and are left
// out, but the pools still shrink the spatial sizes the list reports.
//
// Contract of network_layers(name, width, side):
//   name   one of network_names(): torchvision resnet50 / resnet152 (v1.5: stride on the 3x3),
//          torchvision densenet201, and inception_v4 as in Cadene's pretrainedmodels.
//   width  every channel count is divided by it (integer division, at least 1); the 3 image
//          channels and the classifier's 1000 outputs stay. Concatenations and DenseNet's growth
//          add up the divided counts, so c_in of each layer is its real input at that width.
//          The layer structure (and count) does not depend on width.
//   side   a side x side input; sizes follow PyTorch's floor formulas through every conv and pool,
//          so a side other than the natural one (224, 299 for Inception-v4) gives the sizes the
//          real network would run with.
//   Throws std::invalid_argument for an unknown name (listing the known ones), width < 1, or a
//   side so small that some conv or pool output would be empty (message names the value).
// Labels are the torchvision-like module paths, unique within a network.
#pragma once

#include <string>
#include <vector>

namespace kdist_perf {

/// One Conv2d or Linear layer. A Linear is `dense` with c_in inputs, c_out outputs and a 1x1 "image".
struct LayerShape {
  std::string label;
  bool dense = false;
  int c_in = 0, c_out = 0;
  int k_h = 1, k_w = 1, stride = 1, pad_h = 0, pad_w = 0;
  int in_h = 1, in_w = 1;  ///< input spatial size of this layer
  bool bias = false;       ///< the convs of these nets have none (a BatchNorm follows); Linear has one

  int out_h() const;  ///< (in_h + 2 pad_h - k_h) / stride + 1, rounded down
  int out_w() const;
  int a_dim() const;  ///< c_in k_h k_w (+1 with bias): the K-FAC A factor's dimension
  int g_dim() const { return c_out; }
  long long weights() const;        ///< c_out c_in k_h k_w (+ c_out with bias)
  long long macs(int batch) const;  ///< forward multiply-adds: batch out_h out_w c_out c_in k_h k_w
};

/// "resnet50", "resnet152", "densenet201", "inception_v4".
const std::vector<std::string>& network_names();

/// Forward-order K-FAC layers of `name`; see the contract above.
std::vector<LayerShape> network_layers(const std::string& name, int width = 1, int side = 224);

}  // namespace kdist_perf
