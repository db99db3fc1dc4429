#include <kdist/kfac/impl/low_rank.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace kdist {
namespace kfac {
namespace impl {

bool low_rank_cheaper(int a, int g, long long rows, int sharing) {
  const double A = a, G = g, R = static_cast<double>(rows);
  return R * (A * A + G * G + A * G) < A * G * (A + G) / std::max(1, sharing);
}

// The given gradient went through the layer's backward product (rows terms per entry), the
// ranks' all-reduce and a scaling; the projection adds a terms. Rounding errors of such sums grow
// like the square root of their length for all but adversarial data, so the tolerance is that,
// 16 times over, against the sums of magnitudes: a weight decay term of 1e-4 of the gradient's
// scale is found where a bound linear in the length (rows + a) eps would hide it.
SketchMatch match_sketch(const double* given, const double* sums, int g, int a, int ranks, double rows, double eps) {
  const double scale_eps = 16.0 * std::sqrt(rows + a + ranks) * eps;
  SketchMatch worst;
  double worst_ratio = -1;
  for (const BatchWeights w : {BatchWeights::ranks, BatchWeights::rows}) {
    const bool by_rows = w == BatchWeights::rows;
    const double scale = by_rows ? 1.0 / rows : 1.0 / ranks;
    const double* s = sums + (by_rows ? 2 * g : 0);
    bool all = true;
    for (int i = 0; i < g; ++i) {
      const double formed = scale * s[i], magnitude = scale * s[g + i];
      const double tolerance = scale_eps * magnitude + DBL_MIN;
      const double ratio = std::abs(given[i] - formed) / tolerance;
      if (ratio <= 1) continue;
      all = false;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        worst = SketchMatch{BatchWeights::none, i, given[i], formed, tolerance};
      }
    }
    if (all) return SketchMatch{w, 0, 0, 0, 0};
  }
  return worst;
}

const char* to_string(BatchWeights w) {
  switch (w) {
    case BatchWeights::ranks:
      return "ranks' mean";
    case BatchWeights::rows:
      return "rows' mean";
    case BatchWeights::none:
      break;
  }
  return "none";
}

}  // namespace impl
}  // namespace kfac
}  // namespace kdist
