// He (Kaiming normal, fan_in) initialisation of the reference layers' parameters, reproducible
// from a seed.
//
//   he_normal(exec, weight, fan_in, seed);  // weight's elements, in storage order, drawn from
//                                           //   N(0, 2 / fan_in) by std::mt19937_64(seed) and
//                                           //   std::normal_distribution<double> on the host,
//                                           //   rounded to T and deep-copied to weight
//   he_init(exec, layer, seed);             // nn::Dense / nn::Conv2d: he_normal of the weight with
//                                           //   fan_in = the layer's inputs (in, or c_in·kh·kw,
//                                           //   PyTorch's fan_in), bias := 0
//
// The same seed gives the same values on every rank and every backend (the draw is on the host;
// std::normal_distribution is libstdc++'s, so another standard library may give other values).
// Both wait for `exec` before returning (the host buffer is freed then). Errors: fan_in < 1 or a
// weight that is not contiguous (InvalidArgument "kdist::nn::he_normal: ..." with the sizes).
#pragma once

#include <kdist/core/compat.hpp>
#include <kdist/nn/tensor.hpp>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

namespace kdist {
namespace nn {

template <class ExecSpace, class V>
void he_normal(const ExecSpace& exec, const V& weight, int fan_in, std::uint64_t seed) {
  constexpr const char* func = "kdist::nn::he_normal";
  static_assert(Kokkos::is_view<V>::value, "kdist::nn::he_normal: the weight must be a Kokkos::View");
  if (fan_in < 1) impl::throw_invalid(func, "fan_in " + std::to_string(fan_in) + " must be >= 1");
  impl::require_contiguous(func, weight);
  auto host = Kokkos::create_mirror_view(weight);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, std::sqrt(2.0 / fan_in));
  for (std::size_t i = 0; i < host.size(); ++i) host.data()[i] = static_cast<typename V::value_type>(normal(rng));
  Kokkos::deep_copy(exec, weight, host);
  compat::fence(exec, "kdist::nn::he_normal");
}

template <class Layer>
void he_init(const typename Layer::execution_space& exec, Layer& layer, std::uint64_t seed) {
  he_normal(exec, layer.weight(), layer.kfac_layer().inputs(), seed);
  if (layer.bias().extent(0) > 0) Kokkos::deep_copy(exec, layer.bias(), typename Layer::value_type(0));
  compat::fence(exec, "kdist::nn::he_init");
}

// ---- the same on the default instance of the view's execution space ----
template <class V>
void he_normal(const V& weight, int fan_in, std::uint64_t seed) {
  he_normal(typename V::execution_space{}, weight, fan_in, seed);
}
template <class Layer>
void he_init(Layer& layer, std::uint64_t seed) {
  he_init(typename Layer::execution_space{}, layer, seed);
}

}  // namespace nn
}  // namespace kdist
