#include <kdist/kfac/impl/conv_shifts.hpp>

#include <algorithm>

namespace kdist {
namespace kfac {
namespace impl {

// With stride 1 and padding P, patch row (b, i, j) at kernel position (p, q) holds
// x(b, c, i + p - P, j + q - P), i in [0, out_h). For kernel rows p and p' = p + d the factor's
// block is
//   Σ_{b, i, j} x(b, c, i + p - P, j + q - P) x(b, c', i + p' - P, j + q' - P)
//     = Σ_{u} Y_uᵀ Y_{u+d}     over input rows u = i + p - P,
// where Y_u holds Y's rows of input row u and a row off the input contributes 0. So u runs over
// window(p, d) = [max(0, p - P), min(H - d, p - P + out_h)): both ends grow with p. Cutting the
// rows at every window's ends gives segments each window holds whole or not at all; the windows
// holding a segment are those with lo(p) <= first (a prefix of p) and hi(p, d) >= last (a
// suffix), so a contiguous range of p.
std::vector<ShiftSegment> shift_segments(const Conv2dGeometry& g) {
  const int kh = g.kernel_h, P = g.padding, H = g.height, OH = g.out_h();
  const auto lo = [&](int p) { return std::max(0, p - P); };
  const auto hi = [&](int p, int d) { return std::min(H - d, p - P + OH); };
  std::vector<ShiftSegment> segments;
  for (int d = 0; d < kh; ++d) {
    std::vector<int> cuts;
    for (int p = 0; p + d < kh; ++p) {
      cuts.push_back(lo(p));
      cuts.push_back(hi(p, d));
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
      const int first = cuts[k], last = cuts[k + 1];
      int p_first = kh - d, p_last = 0;
      for (int p = 0; p + d < kh; ++p)
        if (lo(p) <= first && last <= hi(p, d)) {
          p_first = std::min(p_first, p);
          p_last = std::max(p_last, p + 1);
        }
      if (first < last && p_first < p_last) segments.push_back({d, first, last, p_first, p_last});
    }
  }
  return segments;
}

}  // namespace impl
}  // namespace kfac
}  // namespace kdist
