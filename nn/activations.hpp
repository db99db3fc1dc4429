// The parameter-free reference layers: ReLU, MaxPool2d and Flatten (namespace kdist::nn).
//
//   ReLU<T, Mem> relu;        relu.forward(exec, x, y)    y := max(x, 0), x and y B x N or NCHW
//                             relu.backward(exec, dy, dx) dx := dy where x > 0, else 0
//   MaxPool2d<T, Mem> pool(k) pool.forward(exec, x, y)    x (B, C, H, W) -> y (B, C, H/k, W/k)
//                             (kernel = stride = k, no padding; rows/columns past the last whole
//                             window are dropped, like PyTorch); the first maximum of a window wins
//                             pool.backward(exec, dy, dx) dx := dy at each window's maximum, else 0
//   Flatten<T, Mem> flatten   flatten.forward(exec, x) -> x as B x (C·H·W)
//                             flatten.backward(exec, dy) -> dy as (B, C, H, W) of the last forward
//                             Both return views of the argument's LayoutRight storage (no copy,
//                             not owning it: keep the argument alive); an argument that is not
//                             contiguous is copied into the layer's own buffer first.
//
// ReLU keeps a reference to x (x must stay unchanged until backward); MaxPool2d keeps the argmax
// of each window. Outputs must not share storage with inputs. Views are LayoutRight in Mem,
// T float or double; every kernel runs on `exec`. Errors (InvalidArgument
// "kdist::nn::<Layer>::<method>: ... "): extents that do not fit, k < 1 or a window larger than
// the input, overlapping views, backward before forward, with the sizes in the message.
#pragma once

#include <kdist/core/im2col.hpp>
#include <kdist/nn/tensor.hpp>

#include <Kokkos_Core.hpp>
#include <string>
#include <type_traits>

namespace kdist {
namespace nn {
namespace impl {

/// y := max(x, 0) elementwise (x, y rank-1).
template <class ExecSpace, class XV, class YV>
void relu_forward(const ExecSpace& exec, const XV& x, const YV& y) {
  using T = typename YV::non_const_value_type;
  // Raw pointers (both views are contiguous, see flat()) so that the loop vectorises.
  const T* const xp = x.data();
  T* const yp = y.data();
  for_blocks(
      "kdist::nn::ReLU::forward", exec, y.extent(0), KOKKOS_LAMBDA(const std::size_t begin, const std::size_t end) {
        const T* const in = xp;
        T* const out = yp;
        for (std::size_t i = begin; i < end; ++i) out[i] = in[i] > T(0) ? in[i] : T(0);
      });
}

/// dx := dy where x > 0, else 0 (all rank-1).
template <class ExecSpace, class XV, class DYV, class DXV>
void relu_backward(const ExecSpace& exec, const XV& x, const DYV& dy, const DXV& dx) {
  using T = typename DXV::non_const_value_type;
  const T *const xp = x.data(), *const dyp = dy.data();
  T* const dxp = dx.data();
  for_blocks(
      "kdist::nn::ReLU::backward", exec, dx.extent(0), KOKKOS_LAMBDA(const std::size_t begin, const std::size_t end) {
        const T *const in = xp, *const grad = dyp;
        T* const out = dxp;
        // Both loads unconditional: a select, not a branch on the sign, so the loop vectorises.
        for (std::size_t i = begin; i < end; ++i) {
          const T x = in[i], g = grad[i];
          out[i] = x > T(0) ? g : T(0);
        }
      });
}

/// MaxPool2d's forward on a device space: a thread per output element (b, c, i, j), j fastest (a
/// thread per output row leaves neighbouring threads a row apart): the first maximum of its
/// K x K window, read row by row as the host kernel does, and its place p·K + q in argmax.
template <class ExecSpace, class XV, class YV, class AV>
void max_pool_forward_entries(const ExecSpace& exec, const XV& x, const YV& y, const AV& argmax, int K) {
  using T = typename YV::non_const_value_type;
  kdist::impl::for_each_nchw_entry(
      "kdist::nn::MaxPool2d::forward", exec, int(y.extent(0)), int(y.extent(1)), int(y.extent(2)), int(y.extent(3)),
      KOKKOS_LAMBDA(const int b, const int c, const int i, const int j) {
        int best = 0;
        T m = x(b, c, i * K, j * K);
        for (int p = 0; p < K; ++p)
          for (int q = 0; q < K; ++q) {
            const T v = x(b, c, i * K + p, j * K + q);
            const bool more = v > m;
            m = more ? v : m;
            best = more ? p * K + q : best;
          }
        y(b, c, i, j) = m;
        argmax(b, c, i, j) = best;
      });
}

/// MaxPool2d's backward on a device space: a thread per input element (b, c, h, w), w fastest:
/// its window's gradient where it is the window's argmax, else 0 (as past the last whole window).
template <class ExecSpace, class DYV, class AV, class DXV>
void max_pool_backward_entries(const ExecSpace& exec, const DYV& dy, const AV& argmax, const DXV& dx, int K) {
  using T = typename DXV::non_const_value_type;
  const int OH = static_cast<int>(dy.extent(2)), OW = static_cast<int>(dy.extent(3));
  kdist::impl::for_each_nchw_entry(
      "kdist::nn::MaxPool2d::backward", exec, int(dx.extent(0)), int(dx.extent(1)), int(dx.extent(2)),
      int(dx.extent(3)), KOKKOS_LAMBDA(const int b, const int c, const int h, const int w) {
        const int i = h / K, j = w / K;
        const bool routed = i < OH && j < OW && argmax(b, c, i, j) == (h - i * K) * K + (w - j * K);
        dx(b, c, h, w) = routed ? dy(b, c, i, j) : T(0);
      });
}

}  // namespace impl

/// max(x, 0) on rank-2 (B x N) or rank-4 (NCHW) tensors.
template <class T, class Mem = Kokkos::DefaultExecutionSpace::memory_space>
class ReLU {
 public:
  using execution_space = typename Mem::execution_space;

  void forward(const execution_space& exec, const ConstTensor2<T, Mem>& x, const Tensor2<T, Mem>& y) {
    forward_any(exec, x, y);
    x2_ = x;
    x4_ = {};
  }
  void forward(const execution_space& exec, const ConstTensor4<T, Mem>& x, const Tensor4<T, Mem>& y) {
    forward_any(exec, x, y);
    x4_ = x;
    x2_ = {};
  }
  void backward(const execution_space& exec, const ConstTensor2<T, Mem>& dy, const Tensor2<T, Mem>& dx) {
    backward_any(exec, x2_, dy, dx);
  }
  void backward(const execution_space& exec, const ConstTensor4<T, Mem>& dy, const Tensor4<T, Mem>& dx) {
    backward_any(exec, x4_, dy, dx);
  }

 private:
  template <class XV, class YV>
  void forward_any(const execution_space& exec, const XV& x, const YV& y) {
    constexpr const char* func = "kdist::nn::ReLU::forward";
    impl::require_extents(func, y, impl::extents_of(x), "(the input's extents " + impl::describe(x) + ")");
    impl::require_disjoint(func, x, y);
    impl::relu_forward(exec, flat(func, x), flat(func, y));
  }
  template <class XV, class DYV, class DXV>
  void backward_any(const execution_space& exec, const XV& x, const DYV& dy, const DXV& dx) {
    constexpr const char* func = "kdist::nn::ReLU::backward";
    if (x.data() == nullptr)
      impl::throw_invalid(func, "called before a forward of rank " + std::to_string(compat::view_rank<XV>()));
    impl::require_extents(func, dy, impl::extents_of(x), "(the extents of forward's input " + impl::describe(x) + ")");
    impl::require_extents(func, dx, impl::extents_of(x), "(the extents of forward's input " + impl::describe(x) + ")");
    impl::require_disjoint(func, dy, dx);
    impl::relu_backward(exec, flat(func, x), flat(func, dy), flat(func, dx));
  }

  ConstTensor2<T, Mem> x2_;  // the input of the last forward, whichever rank it had
  ConstTensor4<T, Mem> x4_;
};

/// Max pooling with kernel = stride = k over NCHW tensors.
template <class T, class Mem = Kokkos::DefaultExecutionSpace::memory_space>
class MaxPool2d {
 public:
  using execution_space = typename Mem::execution_space;

  explicit MaxPool2d(int k) : k_(k) {
    if (k < 1) impl::throw_invalid("kdist::nn::MaxPool2d", "kernel " + std::to_string(k) + " must be >= 1");
  }
  int kernel() const noexcept { return k_; }
  /// "MaxPool2d(2)".
  std::string describe() const { return "MaxPool2d(" + std::to_string(k_) + ")"; }

  void forward(const execution_space& exec, const ConstTensor4<T, Mem>& x, const Tensor4<T, Mem>& y) {
    constexpr const char* func = "kdist::nn::MaxPool2d::forward";
    const std::size_t k = static_cast<std::size_t>(k_);
    if (x.size() == 0 || x.extent(2) < k || x.extent(3) < k)
      impl::throw_invalid(func,
                          "input " + impl::describe(x) + " is empty or smaller than the window for " + describe());
    impl::require_extents(func, y, {x.extent(0), x.extent(1), x.extent(2) / k, x.extent(3) / k},
                          "(batch x channels x height/" + std::to_string(k_) + " x width/" + std::to_string(k_) +
                              ") for " + describe() + " of " + impl::describe(x));
    impl::require_disjoint(func, x, y);
    impl::ensure_like(exec, argmax_, "kdist::nn::MaxPool2d::argmax", y);
    const int K = k_;
    const auto argmax = argmax_;
    input_ = impl::extents_of(x);
    if constexpr (!kdist::impl::runs_on_host<execution_space>()) {
      impl::max_pool_forward_entries(exec, x, y, argmax, K);
    } else {
      // Output row by output row (a work item per image and channel), through raw row pointers
      // (LayoutRight); the usual 2 x 2 window has a kernel of its own that vectorises along the row.
      const int OW = static_cast<int>(y.extent(3));
      kdist::impl::for_rows_nchw(
          func, exec, int(y.extent(0)), int(y.extent(1)), int(y.extent(2)),
          KOKKOS_LAMBDA(const int b, const int c, const int i) {
            if (K == 2)
              max_row2(&x(b, c, 2 * i, 0), &x(b, c, 2 * i + 1, 0), &y(b, c, i, 0), &argmax(b, c, i, 0), OW);
            else
              max_row(x, &y(b, c, i, 0), &argmax(b, c, i, 0), b, c, i, OW, K);
          });
    }
  }

  void backward(const execution_space& exec, const ConstTensor4<T, Mem>& dy, const Tensor4<T, Mem>& dx) {
    constexpr const char* func = "kdist::nn::MaxPool2d::backward";
    if (argmax_.data() == nullptr) impl::throw_invalid(func, "called before forward on " + describe());
    impl::require_extents(func, dy, impl::extents_of(argmax_), "(forward's output) for " + describe());
    impl::require_extents(func, dx, input_, "(forward's input) for " + describe());
    impl::require_disjoint(func, dy, dx);
    // A gather over dx: windows do not overlap, so each element has at most one window.
    const int K = k_, OH = static_cast<int>(dy.extent(2)), OW = static_cast<int>(dy.extent(3));
    const auto argmax = argmax_;
    if constexpr (!kdist::impl::runs_on_host<execution_space>()) {
      impl::max_pool_backward_entries(exec, dy, argmax, dx, K);
    } else {
      // Input row by input row h: window row i = h / K, offset p = h % K, once per row.
      const int W = static_cast<int>(dx.extent(3));
      kdist::impl::for_rows_nchw(
          func, exec, int(dx.extent(0)), int(dx.extent(1)), int(dx.extent(2)),
          KOKKOS_LAMBDA(const int b, const int c, const int h) {
            const int i = h / K, p = h - i * K;
            T* const out = &dx(b, c, h, 0);
            int w = 0;
            if (i < OH) {
              const T* const grad = &dy(b, c, i, 0);
              const int* const best_at = &argmax(b, c, i, 0);
              w = K == 2 ? route_row2(grad, best_at, out, p, OW) : route_row(grad, best_at, out, p, OW, K);
            }
            for (; w < W; ++w) out[w] = T(0);
          });
    }
  }

 private:
  // The host kernels. Every select below is written so that GCC if-converts it and vectorises
  // the loop along the row: the maximum as `m < v ? v : m`, its place by arithmetic, a gradient
  // kept or zeroed by assignment. `more ? v : m` with `more ? place : best` beside it stayed a
  // branch, mispredicted on half of the windows of real activations (2 x 2 windows of 64
  // images of 16 x 28 x 28: 2.2 ms, now 0.25 ms; measured in docs/performance.md).

  /// Window row i of image b, channel c: each window's maximum into out[j], its p·K + q into
  /// best_at[j] (the first on ties: a later value must be strictly greater).
  template <class XV>
  KOKKOS_INLINE_FUNCTION static void max_row(const XV& x, T* out, int* best_at, int b, int c, int i, int OW, int K) {
    for (int j = 0; j < OW; ++j) {
      int best = 0;
      T m = x(b, c, i * K, j * K);
      for (int p = 0; p < K; ++p) {
        const T* const in = &x(b, c, i * K + p, j * K);
        for (int q = 0; q < K; ++q) {
          const int more = in[q] > m;
          m = m < in[q] ? in[q] : m;
          best += more * (p * K + q - best);
        }
      }
      out[j] = m;
      best_at[j] = best;
    }
  }
  /// max_row for 2 x 2 windows over input rows r0 = 2i and r1 = 2i + 1, in the same order.
  KOKKOS_INLINE_FUNCTION static void max_row2(const T* KOKKOS_RESTRICT r0, const T* KOKKOS_RESTRICT r1,
                                              T* KOKKOS_RESTRICT out, int* KOKKOS_RESTRICT best_at, int OW) {
    for (int j = 0; j < OW; ++j) {
      const T v[4] = {r0[2 * j], r0[2 * j + 1], r1[2 * j], r1[2 * j + 1]};
      T m = v[0];
      int best = 0;
      for (int k = 1; k < 4; ++k) {
        const int more = v[k] > m;
        m = m < v[k] ? v[k] : m;
        best += more * (k - best);
      }
      out[j] = m;
      best_at[j] = best;
    }
  }
  /// Input row p of window row i: the gradient to each window's maximum, 0 elsewhere; returns
  /// the number of elements written (OW·K).
  KOKKOS_INLINE_FUNCTION static int route_row(const T* grad, const int* best_at, T* out, int p, int OW, int K) {
    int w = 0;
    for (int j = 0; j < OW; ++j) {
      const T g = grad[j];  // loaded unconditionally: a select, not a branch per element
      const int routed = best_at[j] - p * K;
      for (int q = 0; q < K; ++q, ++w) out[w] = routed == q ? g : T(0);
    }
    return w;
  }
  /// route_row for 2 x 2 windows.
  KOKKOS_INLINE_FUNCTION static int route_row2(const T* KOKKOS_RESTRICT grad, const int* KOKKOS_RESTRICT best_at,
                                               T* KOKKOS_RESTRICT out, int p, int OW) {
    for (int j = 0; j < OW; ++j) {
      const int routed = best_at[j] - 2 * p;
      T left = grad[j], right = grad[j];
      if (routed != 0) left = T(0);
      if (routed != 1) right = T(0);
      out[2 * j] = left;
      out[2 * j + 1] = right;
    }
    return 2 * OW;
  }

  int k_;
  Kokkos::View<int****, Kokkos::LayoutRight, Mem> argmax_;  // p·k + q of each window's maximum
  std::array<std::size_t, 4> input_{};
};

/// NCHW <-> B x (C·H·W) on the same storage.
template <class T, class Mem = Kokkos::DefaultExecutionSpace::memory_space>
class Flatten {
 public:
  using execution_space = typename Mem::execution_space;

  ConstTensor2<T, Mem> forward(const execution_space& exec, const ConstTensor4<T, Mem>& x) {
    const T* data = contiguous_data(exec, x, x_copy_, "kdist::nn::Flatten::input");
    input_ = impl::extents_of(x);
    return ConstTensor2<T, Mem>(data, x.extent(0), x.extent(1) * x.extent(2) * x.extent(3));
  }
  ConstTensor4<T, Mem> backward(const execution_space& exec, const ConstTensor2<T, Mem>& dy) {
    constexpr const char* func = "kdist::nn::Flatten::backward";
    if (input_[0] == 0) impl::throw_invalid(func, "called before forward");
    impl::require_extents(func, dy, {input_[0], input_[1] * input_[2] * input_[3]},
                          "(batch x channels*height*width of forward's input)");
    const T* data = contiguous_data(exec, dy, dy_copy_, "kdist::nn::Flatten::gradient");
    return ConstTensor4<T, Mem>(data, input_[0], input_[1], input_[2], input_[3]);
  }

 private:
  /// v's storage when contiguous, else that of v copied into `copy`.
  template <class V, class C>
  static const T* contiguous_data(const execution_space& exec, const V& v, C& copy, const char* label) {
    if (v.span_is_contiguous()) return v.data();
    impl::ensure_like(exec, copy, label, v);
    Kokkos::deep_copy(exec, copy, v);
    return copy.data();
  }

  std::array<std::size_t, 4> input_{};  // forward's input extents (batch 0: none yet)
  Tensor4<T, Mem> x_copy_;
  Tensor2<T, Mem> dy_copy_;
};

}  // namespace nn
}  // namespace kdist
