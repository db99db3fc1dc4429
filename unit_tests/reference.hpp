// Plain references the tests compare kdist against: naive loops on std::vector, no BLAS, no
// LAPACK, no Kokkos. Row-major n x n unless stated.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace kdist_test {

using Dense = std::vector<double>;  // n x n, row-major

inline Dense matmul(const Dense& a, const Dense& b, int n) {
  Dense c(static_cast<std::size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k) {
      const double aik = a[i * n + k];
      for (int j = 0; j < n; ++j) c[i * n + j] += aik * b[k * n + j];
    }
  return c;
}

/// Random orthogonal matrix: modified Gram-Schmidt on a Gaussian matrix (columns orthonormal).
inline Dense random_orthogonal(int n, std::mt19937_64& rng) {
  std::normal_distribution<double> g;
  Dense q(static_cast<std::size_t>(n) * n);
  for (auto& x : q) x = g(rng);
  for (int j = 0; j < n; ++j) {
    for (int pass = 0; pass < 2; ++pass)  // re-orthogonalise once: keeps Q orthogonal to ~eps
      for (int k = 0; k < j; ++k) {
        double dot = 0;
        for (int i = 0; i < n; ++i) dot += q[i * n + k] * q[i * n + j];
        for (int i = 0; i < n; ++i) q[i * n + j] -= dot * q[i * n + k];
      }
    double nrm = 0;
    for (int i = 0; i < n; ++i) nrm += q[i * n + j] * q[i * n + j];
    nrm = std::sqrt(nrm);
    for (int i = 0; i < n; ++i) q[i * n + j] /= nrm;
  }
  return q;
}

/// A = Q diag(lambda) Q^T with the given spectrum.
inline Dense matrix_with_spectrum(const std::vector<double>& lambda, std::mt19937_64& rng) {
  const int n = static_cast<int>(lambda.size());
  const Dense q = random_orthogonal(n, rng);
  Dense a(static_cast<std::size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k) {
      const double qik = q[i * n + k] * lambda[k];
      for (int j = i; j < n; ++j) a[i * n + j] += qik * q[j * n + k];
    }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < i; ++j) a[i * n + j] = a[j * n + i];
  return a;
}

/// Geometric spectrum from hi down to lo.
inline std::vector<double> geometric_spectrum(int n, double hi, double lo) {
  std::vector<double> l(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) l[i] = n == 1 ? hi : hi * std::pow(lo / hi, double(i) / (n - 1));
  return l;
}

/// max |(A + gamma I) X - I| with A, X row-major n x n.
inline double identity_residual(const Dense& a, double gamma, const Dense& x, int n) {
  double worst = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double s = gamma * x[i * n + j];
      for (int k = 0; k < n; ++k) s += a[i * n + k] * x[k * n + j];
      worst = std::max(worst, std::abs(s - (i == j ? 1.0 : 0.0)));
    }
  return worst;
}

// ---- convolution layouts (NCHW tensors as flat row-major vectors) ------------------------------

/// n values k/8 with |k| <= 16: exact in float, and so are their products and sums of up to
/// 65536 products, so float kernels can be checked against double loops without rounding noise.
inline Dense eighths(std::size_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> k(-16, 16);
  Dense v(n);
  for (auto& x : v) x = k(rng) / 8.0;
  return v;
}

/// NCHW input (batch, channels, height, width) of a convolution with a kh x kw kernel, one stride
/// and one padding for both dimensions.
struct ConvShape {
  int batch, channels, height, width, kh, kw, stride, padding;
  int oh() const { return (height + 2 * padding - kh) / stride + 1; }
  int ow() const { return (width + 2 * padding - kw) / stride + 1; }
  int rows() const { return batch * oh() * ow(); }
  int patch() const { return channels * kh * kw; }
  std::size_t inputs() const { return std::size_t(batch) * channels * height * width; }
};

/// Calls f(row, col, x) for every entry of the patch matrix: row (b*oh + i)*ow + j, column
/// (c*kh + p)*kw + q, x the flat NCHW index it reads, or -1 where the kernel lies on the padding.
template <class F>
void for_each_tap(const ConvShape& s, F f) {
  for (int b = 0; b < s.batch; ++b)
    for (int i = 0; i < s.oh(); ++i)
      for (int j = 0; j < s.ow(); ++j)
        for (int c = 0; c < s.channels; ++c)
          for (int p = 0; p < s.kh; ++p)
            for (int q = 0; q < s.kw; ++q) {
              const int h = i * s.stride - s.padding + p, w = j * s.stride - s.padding + q;
              const bool inside = h >= 0 && h < s.height && w >= 0 && w < s.width;
              f((b * s.oh() + i) * s.ow() + j, (c * s.kh + p) * s.kw + q,
                inside ? (static_cast<long long>(b * s.channels + c) * s.height + h) * s.width + w : -1LL);
            }
}

/// The patch matrix of x (rows() x patch(), row-major), zero on the padding.
inline Dense patches_ref(const Dense& x, const ConvShape& s) {
  Dense out(std::size_t(s.rows()) * s.patch(), 0.0);
  for_each_tap(s, [&](int r, int k, long long at) { out[std::size_t(r) * s.patch() + k] = at >= 0 ? x[at] : 0.0; });
  return out;
}

/// col2im by scattering: every patch entry added to the input element it was read from.
inline Dense col2im_ref(const Dense& patches, const ConvShape& s) {
  Dense dx(s.inputs(), 0.0);
  for_each_tap(s, [&](int r, int k, long long at) {
    if (at >= 0) dx[at] += patches[std::size_t(r) * s.patch() + k];
  });
  return dx;
}

/// y (B, C, H, W) as the (B*H*W) x C row-major matrix with row (b*H + h)*W + w.
inline Dense nchw_to_rows_ref(const Dense& y, int B, int C, int H, int W) {
  Dense rows(y.size());
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c)
      for (int h = 0; h < H; ++h)
        for (int w = 0; w < W; ++w)
          rows[(std::size_t(b * H + h) * W + w) * C + c] = y[((std::size_t(b) * C + c) * H + h) * W + w];
  return rows;
}

inline double max_abs(const Dense& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::abs(x));
  return m;
}

}  // namespace kdist_test
