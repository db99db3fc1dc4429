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

inline double max_abs(const Dense& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::abs(x));
  return m;
}

}  // namespace kdist_test
