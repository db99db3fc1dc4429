// nn::SoftmaxCrossEntropy<T, Mem>: the mean softmax cross-entropy over a batch, its gradient
// and the count of correct predictions.
//
//   SoftmaxCrossEntropy<T, Mem> loss;
//   double l = loss.forward(exec, logits, labels);  // logits B x K, labels B ints in [0, K):
//                                                   //   l = (1/B) Σ_i [log Σ_k exp z_ik - z_i,y_i]
//   loss.backward(exec, dlogits);                   // dlogits B x K := (softmax(z) - onehot(y)) / B
//   int n = loss.correct(exec, logits, labels);     // #{i : argmax_k z_ik == y_i} (first maximum)
//
// Numerically stable: each row is shifted by its maximum before exp, and the exponentials, their
// sum and the loss are accumulated in double whatever T is. forward caches the softmax (its own
// copy) and keeps a reference to labels for backward; the gradient is that of the MEAN loss, what
// kfac::Preconditioner::on_backward expects. forward and correct return to the host, so they wait
// for `exec`; backward does not. Views are LayoutRight in Mem. Errors (InvalidArgument
// "kdist::nn::SoftmaxCrossEntropy::<method>: ..." with the sizes): an empty batch or no classes,
// labels of another length, labels outside [0, K) (counted, forward and correct), a dlogits of
// other extents, backward before forward.
#pragma once

#include <kdist/nn/tensor.hpp>

#include <Kokkos_Core.hpp>
#include <string>

namespace kdist {
namespace nn {

template <class T, class Mem = Kokkos::DefaultExecutionSpace::memory_space>
class SoftmaxCrossEntropy {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value, "kdist::nn: float or double");

 public:
  using execution_space = typename Mem::execution_space;

  double forward(const execution_space& exec, const ConstTensor2<T, Mem>& logits, const Labels<Mem>& labels) {
    check(exec, "kdist::nn::SoftmaxCrossEntropy::forward", logits, labels);
    impl::ensure_like(exec, probs_, "kdist::nn::SoftmaxCrossEntropy::softmax", logits);
    const int K = static_cast<int>(logits.extent(1));
    const auto probs = probs_;
    double sum = 0;
    Kokkos::parallel_reduce(
        "kdist::nn::SoftmaxCrossEntropy::forward", Kokkos::RangePolicy<execution_space>(exec, 0, logits.extent(0)),
        KOKKOS_LAMBDA(const int i, double& acc) {
          double m = logits(i, 0);
          for (int k = 1; k < K; ++k) m = logits(i, k) > m ? double(logits(i, k)) : m;
          double z = 0;
          for (int k = 0; k < K; ++k) z += compat::exp(double(logits(i, k)) - m);
          for (int k = 0; k < K; ++k) probs(i, k) = static_cast<T>(compat::exp(double(logits(i, k)) - m) / z);
          acc += compat::log(z) + (m - double(logits(i, labels(i))));  // (m - z_iy) first: exact for close values
        },
        sum);
    labels_ = labels;
    return sum / static_cast<double>(logits.extent(0));
  }

  void backward(const execution_space& exec, const Tensor2<T, Mem>& dlogits) const {
    constexpr const char* func = "kdist::nn::SoftmaxCrossEntropy::backward";
    if (labels_.data() == nullptr) impl::throw_invalid(func, "called before forward");
    impl::require_extents(func, dlogits, impl::extents_of(probs_), "(batch x classes of forward's logits)");
    const auto probs = probs_;
    const auto labels = labels_;
    const T scale = T(1) / static_cast<T>(probs.extent(0));
    Kokkos::parallel_for(
        func, impl::over(exec, dlogits), KOKKOS_LAMBDA(const int i, const int k) {
          dlogits(i, k) = (probs(i, k) - (k == labels(i) ? T(1) : T(0))) * scale;
        });
  }

  int correct(const execution_space& exec, const ConstTensor2<T, Mem>& logits, const Labels<Mem>& labels) const {
    check(exec, "kdist::nn::SoftmaxCrossEntropy::correct", logits, labels);
    const int K = static_cast<int>(logits.extent(1));
    int count = 0;
    Kokkos::parallel_reduce(
        "kdist::nn::SoftmaxCrossEntropy::correct", Kokkos::RangePolicy<execution_space>(exec, 0, logits.extent(0)),
        KOKKOS_LAMBDA(const int i, int& acc) {
          int best = 0;
          for (int k = 1; k < K; ++k)
            if (logits(i, k) > logits(i, best)) best = k;
          acc += best == labels(i) ? 1 : 0;
        },
        count);
    return count;
  }

  // ---- the same on the default instance of Mem's execution space ----
  double forward(const ConstTensor2<T, Mem>& logits, const Labels<Mem>& labels) {
    return forward(execution_space{}, logits, labels);
  }
  void backward(const Tensor2<T, Mem>& dlogits) const { backward(execution_space{}, dlogits); }
  int correct(const ConstTensor2<T, Mem>& logits, const Labels<Mem>& labels) const {
    return correct(execution_space{}, logits, labels);
  }

  /// Extents, and every label in [0, K) (counted on exec; waits for it).
  static void check(const execution_space& exec, const char* func, const ConstTensor2<T, Mem>& logits,
                    const Labels<Mem>& labels) {
    const std::size_t B = logits.extent(0);
    const int K = static_cast<int>(logits.extent(1));
    if (B == 0 || K == 0) impl::throw_invalid(func, "logits " + impl::describe(logits) + " must be non-empty");
    impl::require_extents(func, labels, {B}, "(one label per row of the logits " + impl::describe(logits) + ")");
    int bad = 0;
    Kokkos::parallel_reduce(
        "kdist::nn::SoftmaxCrossEntropy::check_labels", Kokkos::RangePolicy<execution_space>(exec, 0, B),
        KOKKOS_LAMBDA(const int i, int& acc) { acc += labels(i) < 0 || labels(i) >= K ? 1 : 0; }, bad);
    if (bad > 0)
      impl::throw_invalid(func, std::to_string(bad) + " of the " + std::to_string(B) + " labels in " +
                                    impl::describe(labels) + " are outside [0, " + std::to_string(K) + ")");
  }

 private:
  Tensor2<T, Mem> probs_;  // softmax of the last forward's logits
  Labels<Mem> labels_;
};

}  // namespace nn
}  // namespace kdist
