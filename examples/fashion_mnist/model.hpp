// The two Fashion-MNIST models of the main job, built from nn/ reference layers, for images of
// rows x cols pixels and `classes` classes (the data set's: 28 x 28 and 10):
//   mlp: (rows*cols)-256-128-classes with ReLU (the dataset benchmark's MLP 256-128-100 row)
//   cnn: Conv2d(1,16,5x5,pad 2) ReLU MaxPool2 -> Conv2d(16,32,5x5,pad 2) ReLU MaxPool2 ->
//        Flatten -> Dense(32*(rows/4)*(cols/4),128) ReLU -> Dense(128,classes)   (its "2 Conv +
//        pooling" row; 1568-128 at 28 x 28). Each stage runs its ReLU after the pool, on a
//        quarter of the values: max(·, 0) is monotone, so the pool's maximum and its position
//        are the same either way (the first of the window when none is positive, where the
//        gradient is 0 in both orders), and outputs and gradients are equal bit for bit.
// The layer widths are written here once; every other size (inputs(), classes(), the tensors
// between layers) follows from them and the image shape. forward() takes a batch of normalised
// images (B x inputs()) and returns the logits (B x classes()); backward() takes the loss gradient.
// attach() hands every weight layer its K-FAC index, so the layers call the preconditioner's hooks
// themselves. The layers' gradients live in one block, in parameters() order (gradient_storage()),
// which the gradient all-reduce reduces in place. Intermediate tensors are reallocated only when
// the batch size changes (the last, partial batch of an epoch).
#pragma once

#include <kdist/core/error.hpp>
#include <kdist/nn/activations.hpp>
#include <kdist/nn/conv2d.hpp>
#include <kdist/nn/dense.hpp>
#include <kdist/nn/init.hpp>
#include <kdist/nn/sgd.hpp>

#include <string>
#include <vector>

namespace fmnist {

using namespace kdist;

enum class ModelKind { mlp, cnn };

template <class T, class Mem>
class Model {
 public:
  using execution_space = typename Mem::execution_space;
  using T2 = nn::Tensor2<T, Mem>;
  using T4 = nn::Tensor4<T, Mem>;
  using C2 = nn::ConstTensor2<T, Mem>;
  using C4 = nn::ConstTensor4<T, Mem>;
  using Gradient = typename kfac::Preconditioner<T, Mem>::Gradient;

  Model(ModelKind kind, int rows, int cols, int classes, std::uint64_t seed)
      : cnn_(kind == ModelKind::cnn), rows_(rows), cols_(cols) {
    int features = rows * cols;
    if (cnn_) {
      int channels = 1, height = rows, width = cols;
      for (const int out : {16, 32}) {  // 5x5, pad 2: the image size stays; the 2x2 pool halves it
        conv_.emplace_back(channels, out, 5, 5, 1, 2, true);
        stages_.push_back({out, height, width});
        channels = out, height /= 2, width /= 2;
      }
      features = channels * height * width;
    }
    for (const int width : cnn_ ? std::vector<int>{128} : std::vector<int>{256, 128}) {
      dense_.emplace_back(features, width, true);
      features = width;
    }
    dense_.emplace_back(features, classes, true);
    execution_space exec;
    std::uint64_t s = seed;
    for (auto& c : conv_) nn::he_normal(exec, c.weight(), c.kfac_layer().inputs(), s++);
    for (auto& d : dense_) nn::he_normal(exec, d.weight(), d.inputs(), s++);
    relu_.resize(conv_.size() + dense_.size() - 1);
    pool_.assign(conv_.size(), nn::MaxPool2d<T, Mem>(2));
    gather_gradients(exec);
  }

  int inputs() const { return rows_ * cols_; }
  int classes() const { return dense_.back().outputs(); }

  std::vector<kfac::Layer> kfac_layers() const {
    std::vector<kfac::Layer> l;
    for (const auto& c : conv_) l.push_back(c.kfac_layer());
    for (const auto& d : dense_) l.push_back(d.kfac_layer());
    return l;
  }
  /// Every layer's gradients, consecutive in parameters() order: one block, which the gradient
  /// all-reduce reduces where backward wrote it (comm::FusedAllreducer::use_storage).
  const nn::Tensor1<T, Mem>& gradient_storage() const noexcept { return gradients_; }

  void attach(kfac::Preconditioner<T, Mem>* kfac) {
    int i = 0;
    for (auto& c : conv_) c.attach(kfac, i++);
    for (auto& d : dense_) d.attach(kfac, i++);
  }
  std::vector<nn::Parameter<T, Mem>> parameters() const {
    std::vector<nn::Parameter<T, Mem>> p;
    for (const auto& c : conv_) append(p, c.parameters());
    for (const auto& d : dense_) append(p, d.parameters());
    return p;
  }
  std::vector<Gradient> gradients() const {
    std::vector<Gradient> g;
    for (const auto& c : conv_) g.push_back(c.gradient());
    for (const auto& d : dense_) g.push_back(d.gradient());
    return g;
  }

  C2 forward(const execution_space& exec, const C2& x) {
    const int B = static_cast<int>(x.extent(0));
    if (x.extent(1) != static_cast<std::size_t>(inputs()))
      throw InvalidArgument("fmnist::Model::forward: " + std::to_string(x.extent(1)) +
                            " features per image, the model takes " + std::to_string(inputs()));
    // The CNN reads x's storage as NCHW images: rows with a stride between them would be misread.
    if (cnn_ && !x.span_is_contiguous())
      throw InvalidArgument("fmnist::Model::forward: the CNN takes contiguous images; this batch of " +
                            std::to_string(B) + " has rows " + std::to_string(x.stride(0)) + " elements apart");
    if (B != batch_) allocate(B);
    C2 h = x;
    if (cnn_) h = conv_forward(exec, C4(x.data(), B, 1, rows_, cols_));
    for (std::size_t k = 0; k < dense_.size(); ++k) {
      dense_[k].forward(exec, h, z_[k]);
      if (k + 1 == dense_.size()) return z_[k];
      relu_[conv_.size() + k].forward(exec, C2(z_[k]), a_[k]);
      h = a_[k];
    }
    return h;
  }

  void backward(const execution_space& exec, const T2& dlogits) {
    T2 dy = dlogits;
    for (std::size_t k = dense_.size(); k-- > 0;) {
      if (k == 0 && !cnn_) {
        dense_[k].backward(exec, dy);
        return;
      }
      dense_[k].backward(exec, dy, k == 0 ? dflat_ : da_[k - 1]);
      if (k > 0) {
        relu_[conv_.size() + k - 1].backward(exec, da_[k - 1], dz_[k - 1]);
        dy = dz_[k - 1];
      }
    }
    conv_backward(exec);
  }

 private:
  static void append(std::vector<nn::Parameter<T, Mem>>& to, const std::vector<nn::Parameter<T, Mem>>& from) {
    to.insert(to.end(), from.begin(), from.end());
  }

  /// Moves every layer's gradients into gradients_, in parameters() order.
  void gather_gradients(const execution_space& exec) {
    std::size_t total = 0;
    for (const auto& c : conv_) total += c.parameter_count();
    for (const auto& d : dense_) total += d.parameter_count();
    gradients_ = nn::Tensor1<T, Mem>("fmnist::gradients", total);
    std::size_t at = 0;
    const auto move = [&](auto& layer) {
      layer.use_gradient_storage(exec, nn::Tensor1<T, Mem>(gradients_.data() + at, layer.parameter_count()));
      at += layer.parameter_count();
    };
    for (auto& c : conv_) move(c);
    for (auto& d : dense_) move(d);
  }

  void allocate(int B) {
    batch_ = B;
    z_.clear();
    a_.clear();
    dz_.clear();
    da_.clear();
    for (std::size_t k = 0; k < dense_.size(); ++k) {
      z_.emplace_back("z", B, dense_[k].outputs());
      a_.emplace_back("a", B, dense_[k].outputs());
      dz_.emplace_back("dz", B, dense_[k].outputs());
      da_.emplace_back("da", B, dense_[k].outputs());
    }
    if (!cnn_) return;
    for (auto* v : {&cz_, &ca_, &cp_, &dcz_, &dca_, &dcp_}) v->clear();
    for (std::size_t k = 0; k < stages_.size(); ++k) {
      const Stage& g = stages_[k];  // the convolution at the stage's size, the pool and ReLU at half of it
      const std::string n = std::to_string(k + 1);
      const int h = g.height / 2, w = g.width / 2;
      cz_.emplace_back("c" + n, B, g.channels, g.height, g.width);
      cp_.emplace_back("p" + n, B, g.channels, h, w);
      ca_.emplace_back("r" + n, B, g.channels, h, w);
      dcz_.emplace_back("dc" + n, B, g.channels, g.height, g.width);
      dcp_.emplace_back("dp" + n, B, g.channels, h, w);
      dca_.emplace_back("dr" + n, B, g.channels, h, w);
    }
    dflat_ = T2("dflat", B, dense_.front().inputs());
  }

  C2 conv_forward(const execution_space& exec, const C4& x) {
    C4 h = x;
    for (std::size_t k = 0; k < conv_.size(); ++k) {
      conv_[k].forward(exec, h, cz_[k]);
      pool_[k].forward(exec, cz_[k], cp_[k]);
      relu_[k].forward(exec, C4(cp_[k]), ca_[k]);
      h = ca_[k];
    }
    return flatten_.forward(exec, h);
  }

  void conv_backward(const execution_space& exec) {
    C4 dy = flatten_.backward(exec, dflat_);
    for (std::size_t k = conv_.size(); k-- > 0;) {
      relu_[k].backward(exec, dy, dcp_[k]);
      pool_[k].backward(exec, dcp_[k], dcz_[k]);
      if (k == 0) {
        conv_[k].backward(exec, dcz_[k]);
      } else {
        conv_[k].backward(exec, dcz_[k], dca_[k - 1]);
        dy = dca_[k - 1];
      }
    }
  }

  struct Stage {
    int channels, height, width;  // a convolution's output
  };

  bool cnn_;
  int rows_, cols_;
  int batch_ = -1;
  std::vector<Stage> stages_;
  std::vector<nn::Conv2d<T, Mem>> conv_;
  std::vector<nn::Dense<T, Mem>> dense_;
  nn::Tensor1<T, Mem> gradients_;  // every layer's dW and db (gather_gradients)
  std::vector<nn::ReLU<T, Mem>> relu_;
  std::vector<nn::MaxPool2d<T, Mem>> pool_;
  nn::Flatten<T, Mem> flatten_;
  std::vector<T2> z_, a_, dz_, da_;
  std::vector<T4> cz_, cp_, ca_, dcz_, dcp_, dca_;  // per stage: convolution, pool, ReLU outputs; their gradients
  T2 dflat_;
};

}  // namespace fmnist
