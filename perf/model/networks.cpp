// Layer lists of ResNet-50/152, DenseNet-201 and Inception-v4 (contract in networks.hpp).
//
// Each network is written as the forward pass of its reference implementation, walking an
// activation (channels x h x w) through a Builder that records every conv/linear and checks that
// no conv or pool output is empty. Pools are walked but not recorded: they change the sizes of
// what follows, and PyTorch's floor formula for them is the same as for a conv.
#include "networks.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace kdist_perf {
namespace {

// Floor division for b > 0: a too-small input gives a negative numerator, which C++'s truncation
// would round up to an output of 1 instead of the empty output PyTorch rejects.
int floor_div(int a, int b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

int window_out(int in, int k, int stride, int pad) {
  return floor_div(in + 2 * pad - k, stride) + 1;
}

/// An activation between layers: channels and spatial size.
struct Act {
  int c = 0, h = 0, w = 0;
};

/// Kernel, stride and padding of a conv or pool (kernels may be 1x7, 7x1, ...).
struct Window {
  int k_h = 1, k_w = 1, stride = 1, pad_h = 0, pad_w = 0;
};

Window square(int k, int stride = 1, int pad = 0) {
  return {k, k, stride, pad, pad};
}

class Builder {
 public:
  Builder(std::string net, int width, int side) : net_(std::move(net)), width_(width), side_(side) {}

  /// A channel count of the full-width network at this width.
  int ch(int full) const { return std::max(1, full / width_); }

  Act conv(const std::string& label, const Act& in, int c_out, const Window& win) {
    LayerShape l;
    l.label = label;
    l.c_in = in.c;
    l.c_out = c_out;
    l.k_h = win.k_h;
    l.k_w = win.k_w;
    l.stride = win.stride;
    l.pad_h = win.pad_h;
    l.pad_w = win.pad_w;
    l.in_h = in.h;
    l.in_w = in.w;
    Act out{c_out, l.out_h(), l.out_w()};
    check(label, out);
    layers_.push_back(std::move(l));
    return out;
  }

  /// A max or average pool: channels unchanged, no weights, so nothing recorded.
  Act pool(const std::string& label, const Act& in, const Window& win) const {
    Act out{in.c, window_out(in.h, win.k_h, win.stride, win.pad_h), window_out(in.w, win.k_w, win.stride, win.pad_w)};
    check(label, out);
    return out;
  }

  void linear(const std::string& label, int c_in, int c_out) {
    LayerShape l;
    l.label = label;
    l.dense = true;
    l.c_in = c_in;
    l.c_out = c_out;
    l.bias = true;
    layers_.push_back(std::move(l));
  }

  std::vector<LayerShape> take() { return std::move(layers_); }

 private:
  void check(const std::string& label, const Act& out) const {
    if (out.h >= 1 && out.w >= 1) return;
    std::ostringstream msg;
    msg << "network_layers: side " << side_ << " is too small for " << net_ << ": " << label << " would output "
        << out.h << "x" << out.w;
    throw std::invalid_argument(msg.str());
  }

  std::string net_;
  int width_, side_;
  std::vector<LayerShape> layers_;
};

constexpr int kImageChannels = 3;
constexpr int kClasses = 1000;

// ---- ResNet (torchvision v1.5 Bottleneck) ----------------------------------------------------

// One bottleneck; the stride sits on the 3x3 (v1.5). The downsample is listed after conv3, the
// order the scale model relies on. It exists on the first block of each stage, as in the
// full-width network, so the layer count does not depend on width.
Act bottleneck(Builder& b, const std::string& prefix, const Act& in, int planes, int stride, bool downsample) {
  Act y = b.conv(prefix + "conv1", in, b.ch(planes), square(1));
  y = b.conv(prefix + "conv2", y, b.ch(planes), square(3, stride, 1));
  y = b.conv(prefix + "conv3", y, b.ch(4 * planes), square(1));
  if (downsample) b.conv(prefix + "downsample", in, b.ch(4 * planes), square(1, stride));
  return y;
}

std::vector<LayerShape> resnet(Builder& b, int side, const std::vector<int>& blocks) {
  Act x{kImageChannels, side, side};
  x = b.conv("conv1", x, b.ch(64), square(7, 2, 3));
  x = b.pool("maxpool", x, square(3, 2, 1));
  for (int stage = 0; stage < static_cast<int>(blocks.size()); ++stage) {
    const int planes = 64 << stage;
    for (int j = 0; j < blocks[stage]; ++j) {
      const std::string prefix = "layer" + std::to_string(stage + 1) + "." + std::to_string(j) + ".";
      const int stride = (j == 0 && stage > 0) ? 2 : 1;
      x = bottleneck(b, prefix, x, planes, stride, j == 0);
    }
  }
  b.linear("fc", x.c, kClasses);  // after the adaptive average pool, which any size survives
  return b.take();
}

// ---- DenseNet-201 (torchvision) ----------------------------------------------------------------

// Growth 32, bottleneck bn_size * growth = 128, 64 initial features, blocks (6, 12, 48, 32);
// each transition halves the channels (1x1 conv) and the size (2x2 average pool, stride 2).
std::vector<LayerShape> densenet201(Builder& b, int side) {
  const std::vector<int> blocks = {6, 12, 48, 32};
  const int growth = b.ch(32), bottleneck_channels = b.ch(4 * 32);
  Act x{kImageChannels, side, side};
  x = b.conv("features.conv0", x, b.ch(64), square(7, 2, 3));
  x = b.pool("features.pool0", x, square(3, 2, 1));
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::string block = "features.denseblock" + std::to_string(i + 1) + ".denselayer";
    for (int l = 1; l <= blocks[i]; ++l) {
      const std::string prefix = block + std::to_string(l) + ".";
      const Act y = b.conv(prefix + "conv1", x, bottleneck_channels, square(1));
      b.conv(prefix + "conv2", y, growth, square(3, 1, 1));
      x.c += growth;  // the new features are concatenated to the layer's input
    }
    if (i + 1 == blocks.size()) break;
    const std::string transition = "features.transition" + std::to_string(i + 1);
    x = b.conv(transition + ".conv", x, std::max(1, x.c / 2), square(1));
    x = b.pool(transition + ".pool", x, square(2, 2));
  }
  b.linear("classifier", x.c, kClasses);
  return b.take();
}

// ---- Inception-v4 (Szegedy et al. 2016; Cadene's pretrainedmodels inceptionv4.py) --------------

// Every conv is a BasicConv2d (conv without bias + BatchNorm + ReLU), whose Conv2d is the child
// "conv" of the module path given here. Branches run in order, each branch's convs in sequence.
struct Inception {
  Builder& b;

  Act basic(const std::string& path, const Act& in, int c_out, const Window& win) {
    return b.conv(path + ".conv", in, b.ch(c_out), win);
  }
  static Window k1x7() { return {1, 7, 1, 0, 3}; }
  static Window k7x1() { return {7, 1, 1, 3, 0}; }
  static Window k1x3() { return {1, 3, 1, 0, 1}; }
  static Window k3x1() { return {3, 1, 1, 1, 0}; }

  // Stem up to Mixed_5a (features.0 - features.5): 3 -> 384 channels, 299 -> 35.
  Act stem(Act x) {
    x = basic("features.0", x, 32, square(3, 2));
    x = basic("features.1", x, 32, square(3));
    x = basic("features.2", x, 64, square(3, 1, 1));
    const Act pooled = b.pool("features.3.maxpool", x, square(3, 2));  // Mixed_3a: pool | conv
    const Act conv3a = basic("features.3.conv", x, 96, square(3, 2));
    x = Act{pooled.c + conv3a.c, conv3a.h, conv3a.w};
    Act a = basic("features.4.branch0.0", x, 64, square(1));  // Mixed_4a
    a = basic("features.4.branch0.1", a, 96, square(3));
    Act c = basic("features.4.branch1.0", x, 64, square(1));
    c = basic("features.4.branch1.1", c, 64, k1x7());
    c = basic("features.4.branch1.2", c, 64, k7x1());
    c = basic("features.4.branch1.3", c, 96, square(3));
    x = Act{a.c + c.c, a.h, a.w};
    const Act conv5a = basic("features.5.conv", x, 192, square(3, 2));  // Mixed_5a: conv | pool
    b.pool("features.5.maxpool", x, square(3, 2));
    return Act{conv5a.c + x.c, conv5a.h, conv5a.w};
  }

  // The average-pool branch (3x3, stride 1, pad 1) keeps the size, so its conv reads `x` as is.
  Act inception_a(const std::string& p, const Act& x) {
    const Act b0 = basic(p + ".branch0", x, 96, square(1));
    Act b1 = basic(p + ".branch1.0", x, 64, square(1));
    b1 = basic(p + ".branch1.1", b1, 96, square(3, 1, 1));
    Act b2 = basic(p + ".branch2.0", x, 64, square(1));
    b2 = basic(p + ".branch2.1", b2, 96, square(3, 1, 1));
    b2 = basic(p + ".branch2.2", b2, 96, square(3, 1, 1));
    const Act b3 = basic(p + ".branch3.1", x, 96, square(1));
    return Act{b0.c + b1.c + b2.c + b3.c, x.h, x.w};
  }

  Act reduction_a(const std::string& p, const Act& x) {
    const Act b0 = basic(p + ".branch0", x, 384, square(3, 2));
    Act b1 = basic(p + ".branch1.0", x, 192, square(1));
    b1 = basic(p + ".branch1.1", b1, 224, square(3, 1, 1));
    b1 = basic(p + ".branch1.2", b1, 256, square(3, 2));
    b.pool(p + ".branch2", x, square(3, 2));
    return Act{b0.c + b1.c + x.c, b0.h, b0.w};
  }

  Act inception_b(const std::string& p, const Act& x) {
    const Act b0 = basic(p + ".branch0", x, 384, square(1));
    Act b1 = basic(p + ".branch1.0", x, 192, square(1));
    b1 = basic(p + ".branch1.1", b1, 224, k1x7());
    b1 = basic(p + ".branch1.2", b1, 256, k7x1());
    Act b2 = basic(p + ".branch2.0", x, 192, square(1));
    b2 = basic(p + ".branch2.1", b2, 192, k7x1());
    b2 = basic(p + ".branch2.2", b2, 224, k1x7());
    b2 = basic(p + ".branch2.3", b2, 224, k7x1());
    b2 = basic(p + ".branch2.4", b2, 256, k1x7());
    const Act b3 = basic(p + ".branch3.1", x, 128, square(1));
    return Act{b0.c + b1.c + b2.c + b3.c, x.h, x.w};
  }

  Act reduction_b(const std::string& p, const Act& x) {
    Act b0 = basic(p + ".branch0.0", x, 192, square(1));
    b0 = basic(p + ".branch0.1", b0, 192, square(3, 2));
    Act b1 = basic(p + ".branch1.0", x, 256, square(1));
    b1 = basic(p + ".branch1.1", b1, 256, k1x7());
    b1 = basic(p + ".branch1.2", b1, 320, k7x1());
    b1 = basic(p + ".branch1.3", b1, 320, square(3, 2));
    b.pool(p + ".branch2", x, square(3, 2));
    return Act{b0.c + b1.c + x.c, b0.h, b0.w};
  }

  // Branches 1 and 2 each end in a 1x3 and a 3x1 conv side by side, concatenated.
  Act inception_c(const std::string& p, const Act& x) {
    const Act b0 = basic(p + ".branch0", x, 256, square(1));
    const Act b1 = basic(p + ".branch1_0", x, 384, square(1));
    const Act b1a = basic(p + ".branch1_1a", b1, 256, k1x3());
    const Act b1b = basic(p + ".branch1_1b", b1, 256, k3x1());
    Act b2 = basic(p + ".branch2_0", x, 384, square(1));
    b2 = basic(p + ".branch2_1", b2, 448, k3x1());
    b2 = basic(p + ".branch2_2", b2, 512, k1x3());
    const Act b2a = basic(p + ".branch2_3a", b2, 256, k1x3());
    const Act b2b = basic(p + ".branch2_3b", b2, 256, k3x1());
    const Act b3 = basic(p + ".branch3.1", x, 256, square(1));
    return Act{b0.c + b1a.c + b1b.c + b2a.c + b2b.c + b3.c, x.h, x.w};
  }
};

std::string feature(int index) {
  return "features." + std::to_string(index);
}

std::vector<LayerShape> inception_v4(Builder& b, int side) {
  Inception net{b};
  Act x = net.stem(Act{kImageChannels, side, side});
  int index = 6;  // features.0-5 are the stem
  for (int i = 0; i < 4; ++i) x = net.inception_a(feature(index++), x);
  x = net.reduction_a(feature(index++), x);
  for (int i = 0; i < 7; ++i) x = net.inception_b(feature(index++), x);
  x = net.reduction_b(feature(index++), x);
  for (int i = 0; i < 3; ++i) x = net.inception_c(feature(index++), x);
  b.linear("last_linear", x.c, kClasses);  // after a global average pool
  return b.take();
}

std::string known_names() {
  std::string out;
  for (const auto& n : network_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

int LayerShape::out_h() const {
  return window_out(in_h, k_h, stride, pad_h);
}
int LayerShape::out_w() const {
  return window_out(in_w, k_w, stride, pad_w);
}
int LayerShape::a_dim() const {
  return c_in * k_h * k_w + (bias ? 1 : 0);
}

long long LayerShape::weights() const {
  const long long per_output = static_cast<long long>(c_in) * k_h * k_w;
  return c_out * per_output + (bias ? c_out : 0);
}

long long LayerShape::macs(int batch) const {
  return static_cast<long long>(batch) * out_h() * out_w() * c_out * (static_cast<long long>(c_in) * k_h * k_w);
}

const std::vector<std::string>& network_names() {
  static const std::vector<std::string> names = {"resnet50", "resnet152", "densenet201", "inception_v4"};
  return names;
}

std::vector<LayerShape> network_layers(const std::string& name, int width, int side) {
  const auto& names = network_names();
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw std::invalid_argument("network_layers: unknown network '" + name + "' (known: " + known_names() + ")");
  if (width < 1)
    throw std::invalid_argument("network_layers: width " + std::to_string(width) + " for " + name + " must be >= 1");
  if (side < 1)
    throw std::invalid_argument("network_layers: side " + std::to_string(side) + " for " + name + " must be >= 1");
  Builder b(name, width, side);
  if (name == "resnet50") return resnet(b, side, {3, 4, 6, 3});
  if (name == "resnet152") return resnet(b, side, {3, 8, 36, 3});
  if (name == "densenet201") return densenet201(b, side);
  return inception_v4(b, side);
}

}  // namespace kdist_perf
