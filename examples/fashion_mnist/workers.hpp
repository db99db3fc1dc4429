// Several workers on one rank (fashion_mnist_workers --workers-per-rank K, workers_study.cpp): the
// Adasum-against-averaging study at more workers than this machine has cores. P ranks x K
// workers behave as P*K workers: worker w of rank r reads shard r*K + w of every global batch
// (nn::ShardedBatches over P*K shards, so the batches are those of P*K real ranks).
//   average: sum_gradients() leaves on the rank the mean gradient over its K workers' samples,
//            which the usual weighted all-reduce turns into the global batch's mean: synchronous
//            SGD at P*K workers, one momentum.
//   adasum:  adasum_local_step() lets every worker take its own optimizer step from the same
//            start with its own momentum (as each Horovod worker does), then combines the K
//            deltas by pairwise Adasum over adjacent workers at distance 1, 2, 4, ... : the pairs
//            the distance-doubling all-reduce forms among ranks r*K + w. adasum::DeltaOptimizer
//            then combines the ranks' results, so the whole is the P*K-worker Adasum tree (for
//            power-of-two K; other K fold the odd worker in at the level it meets a partner).
// Worker w's forward and backward are the caller's: forward_backward(w) fills the gradients
// and returns its sample count. Kernels run on the caller's instance (free functions: nvcc takes
// no KOKKOS_LAMBDA in a private member).
#pragma once

#include <kdist/adasum/operator.hpp>
#include <kdist/nn/sgd.hpp>

#include <functional>
#include <vector>

namespace fmnist {

namespace impl {
/// to(offset + i) := a(i) - b(offset + i).
template <class Exec, class V, class F>
void subtract_into(const Exec& exec, const F& to, std::size_t offset, const V& a, const F& b) {
  Kokkos::parallel_for(
      "fmnist::workers::subtract", Kokkos::RangePolicy<Exec>(exec, 0, a.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) { to(offset + i) = a(i) - b(offset + i); });
}
/// p(i) := s(offset + i) + d(offset + i).
template <class Exec, class V, class F>
void add_from(const Exec& exec, const V& p, std::size_t offset, const F& s, const F& d) {
  Kokkos::parallel_for(
      "fmnist::workers::add", Kokkos::RangePolicy<Exec>(exec, 0, p.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) { p(i) = s(offset + i) + d(offset + i); });
}
/// acc(offset + i) := weight * g(i) (first), else += weight * g(i).
template <class Exec, class G, class F>
void accumulate(const Exec& exec, const F& acc, std::size_t offset, const G& g, double weight, bool first) {
  Kokkos::parallel_for(
      "fmnist::workers::accumulate", Kokkos::RangePolicy<Exec>(exec, 0, g.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) {
        const auto x = static_cast<typename F::value_type>(weight) * g(i);
        acc(offset + i) = first ? x : acc(offset + i) + x;
      });
}
/// g(i) := scale * acc(offset + i).
template <class Exec, class V, class F>
void scale_into(const Exec& exec, const V& g, std::size_t offset, const F& acc, double scale) {
  Kokkos::parallel_for(
      "fmnist::workers::mean", Kokkos::RangePolicy<Exec>(exec, 0, g.extent(0)),
      KOKKOS_LAMBDA(const std::size_t i) { g(i) = acc(offset + i) * static_cast<typename V::value_type>(scale); });
}
}  // namespace impl

template <class T, class Mem>
class LocalWorkers {
 public:
  using Exec = typename Mem::execution_space;
  using Flat = Kokkos::View<T*, Mem>;
  using ForwardBackward = std::function<int(int worker)>;

  LocalWorkers(int workers, const std::vector<kdist::nn::Parameter<T, Mem>>& params, double lr, double momentum,
               double weight_decay)
      : params_(params), bounds_{0} {
    for (const auto& p : params_) bounds_.push_back(bounds_.back() + p.value.extent(0));
    for (int w = 0; w < workers; ++w) {
      sgd_.emplace_back(params_, lr, momentum, weight_decay);
      deltas_.push_back(Flat("fmnist::workers::delta", bounds_.back()));
    }
    start_ = Flat("fmnist::workers::start", bounds_.back());
    sum_ = Flat("fmnist::workers::gradient_sum", bounds_.back());
  }

  int workers() const { return static_cast<int>(sgd_.size()); }
  void set_learning_rate(double lr) {
    for (auto& s : sgd_) s.set_learning_rate(lr);
  }

  /// Averaging: the rank's gradients := the mean over all its workers' samples; returns their count.
  int sum_gradients(const Exec& exec, const std::vector<Flat>& grads, const ForwardBackward& forward_backward) {
    int samples = 0;
    for (int w = 0; w < workers(); ++w) {
      const int n = forward_backward(w);
      for (std::size_t k = 0; k < grads.size(); ++k) impl::accumulate(exec, sum_, bounds_[k], grads[k], n, w == 0);
      samples += n;
    }
    for (std::size_t k = 0; k < grads.size(); ++k) impl::scale_into(exec, grads[k], bounds_[k], sum_, 1.0 / samples);
    return samples;
  }

  /// Adasum: parameters := start + the Adasum tree of the K workers' deltas.
  void adasum_local_step(const Exec& exec, const ForwardBackward& forward_backward) {
    for (std::size_t k = 0; k < params_.size(); ++k) Kokkos::deep_copy(exec, piece(start_, k), params_[k].value);
    for (int w = 0; w < workers(); ++w) {
      if (w > 0)
        for (std::size_t k = 0; k < params_.size(); ++k) Kokkos::deep_copy(exec, params_[k].value, piece(start_, k));
      forward_backward(w);
      sgd_[w].step(exec);
      for (std::size_t k = 0; k < params_.size(); ++k)
        impl::subtract_into(exec, deltas_[w], bounds_[k], params_[k].value, start_);
    }
    for (int d = 1; d < workers(); d *= 2)
      for (int w = 0; w + d < workers(); w += 2 * d) kdist::adasum::combine(exec, deltas_[w], deltas_[w + d], bounds_);
    for (std::size_t k = 0; k < params_.size(); ++k)
      impl::add_from(exec, params_[k].value, bounds_[k], start_, deltas_[0]);
  }

 private:
  auto piece(const Flat& fused, std::size_t k) const {
    return Kokkos::subview(fused, std::make_pair(bounds_[k], bounds_[k + 1]));
  }

  std::vector<kdist::nn::Parameter<T, Mem>> params_;
  std::vector<std::size_t> bounds_;          // parameter k is [bounds_[k], bounds_[k + 1]) of a fused buffer
  std::vector<kdist::nn::SGD<T, Mem>> sgd_;  // one optimizer state per worker (Adasum)
  std::vector<Flat> deltas_;
  Flat start_;  // Adasum: the parameters before the step
  Flat sum_;    // averaging: the workers' weighted gradient sum
};

}  // namespace fmnist
