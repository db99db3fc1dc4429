// Serial Adasum references in double, straight from docs/architecture.md §3 (naive loops).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

namespace kdist_test {

using Vec = std::vector<double>;

/// Adasum(a, b) tensor by tensor (bounds = tensor offsets).
inline Vec adasum_pair(const Vec& a, const Vec& b, const std::vector<std::size_t>& bounds) {
  Vec out(a.size());
  for (std::size_t t = 0; t + 1 < bounds.size(); ++t) {
    double d = 0, na = 0, nb = 0;
    for (std::size_t i = bounds[t]; i < bounds[t + 1]; ++i) {
      d += a[i] * b[i];
      na += a[i] * a[i];
      nb += b[i] * b[i];
    }
    const double g = std::sqrt(DBL_MIN);
    const double ca = na >= g ? 1 - d / (2 * na) : 1, cb = nb >= g ? 1 - d / (2 * nb) : 1;
    for (std::size_t i = bounds[t]; i < bounds[t + 1]; ++i) out[i] = ca * a[i] + cb * b[i];
  }
  return out;
}

/// The documented tree over P inputs: fold 2i+1 into 2i for i < q (P = 2^k + q), then a
/// balanced binary tree over the 2^k survivors in virtual-rank order.
inline Vec adasum_tree(std::vector<Vec> x, const std::vector<std::size_t>& bounds) {
  const int P = static_cast<int>(x.size());
  int Pp = 1;
  while (Pp * 2 <= P) Pp *= 2;
  const int q = P - Pp;
  std::vector<Vec> level;
  for (int v = 0; v < Pp; ++v) {
    if (v < q)
      level.push_back(adasum_pair(x[2 * v], x[2 * v + 1], bounds));
    else
      level.push_back(x[v + q]);
  }
  while (level.size() > 1) {
    std::vector<Vec> next;
    for (std::size_t i = 0; i < level.size(); i += 2) next.push_back(adasum_pair(level[i], level[i + 1], bounds));
    level = next;
  }
  return level[0];
}

/// ||got - ref|| / ||ref||, scaled by max |ref| first so huge inputs do not overflow.
inline double rel_l2(const Vec& got, const Vec& ref) {
  double scale = 0;
  for (double r : ref) scale = std::max(scale, std::abs(r));
  if (scale == 0) scale = 1;
  double e = 0, r = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = (got[i] - ref[i]) / scale, x = ref[i] / scale;
    e += d * d;
    r += x * x;
  }
  return r > 0 ? std::sqrt(e / r) : std::sqrt(e);
}

}  // namespace kdist_test
