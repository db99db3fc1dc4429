// Low-rank preconditioning of Dense layers (Options::low_rank_dense), internal to kfac/.
//
// A Dense layer's gradient on rank r is the product its hooks saw, dW_r = dy_rᵀ [x_r 1] (dy the
// output gradient of the rank's mean loss, rows_r rows), of rank <= rows_r. The averaged gradient is
// a weighted sum over the ranks, sum_r w_r dW_r, so its preconditioned form is
//   Vᵀ = A^-1 [dW | db]ᵀ G^-1 = sum_r w_r (A^-1 [x_r 1]ᵀ)(G^-1 dy_rᵀ)ᵀ,
// each rank's term costing rows_r (a^2 + g^2 + a g) multiply-adds against a g (a + g) for the
// full product (over the ranks sharing it, when split): the MLP's 785 x 256 layer at 64 rows per
// rank, 56 M against 105 M at 2 ranks. The terms are summed by one all-reduce of Vᵀ, which takes
// the place of the split's all-gather.
//
// The gradient handed to step() is still what the caller says it is; the preconditioner checks that
// it is that sum by a projection onto a fixed vector u (sketch_weight): the given gradient's
// [dW | db] u against sum_r w_r dy_rᵀ ([x_r 1] u), for w_r = 1/P (the ranks' mean, as DDP averages)
// and w_r = rows_r / sum rows (the global batch's mean loss), one all-reduce of 4 g doubles a layer.
// A gradient that is neither (weight decay or an L2 term added, clipping, accumulation) is refused.
#pragma once

#include <kdist/core/compat.hpp>
#include <kdist/core/impl/entries.hpp>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <string>

namespace kdist {
namespace kfac {
namespace impl {

/// u_j: a fixed pseudo-random vector of magnitudes in [0.5, 1.5) and random signs, the same on
/// every rank and space (an integer hash of j; 24 significant bits, exact in float).
KOKKOS_INLINE_FUNCTION double sketch_weight(int j) {
  unsigned h = static_cast<unsigned>(j) * 2654435761u + 0x9E3779B9u;
  h ^= h >> 15;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  const double magnitude = 0.5 + static_cast<double>(h >> 8) / 16777216.0;
  return (h & 1u) ? -magnitude : magnitude;
}

/// u(j) := sketch_weight(j).
template <class Exec, class UV>
void fill_sketch_vector(const Exec& exec, const UV& u) {
  using T = typename UV::non_const_value_type;
  Kokkos::parallel_for(
      "kdist::kfac::sketch_vector", Kokkos::RangePolicy<Exec>(exec, 0, u.extent(0)),
      KOKKOS_LAMBDA(const int j) { u(j) = static_cast<T>(sketch_weight(j)); });
}

/// M := a dim x cols matrix (contents unspecified) unless it is one already.
template <class MV>
void fit_columns(MV& M, int dim, int cols, const char* label) {
  if (static_cast<int>(M.extent(0)) != dim || static_cast<int>(M.extent(1)) != cols)
    M = MV(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), dim, cols);
}

/// D := Sᵀ, with a last row of ones where D has one row more than S has columns (a bias): S is the
/// hook's rows x features view (any layout), D column-major, one column per sample.
template <class Exec, class SV, class DV>
void keep_batch_columns(const Exec& exec, const SV& S, const DV& D) {
  using T = typename DV::non_const_value_type;
  const int features = static_cast<int>(S.extent(1));
  Kokkos::parallel_for(
      "kdist::kfac::keep_batch",
      kdist::impl::entries<Kokkos::LayoutLeft>(exec, static_cast<int>(D.extent(0)), static_cast<int>(D.extent(1))),
      KOKKOS_LAMBDA(const int j, const int k) { D(j, k) = j < features ? static_cast<T>(S(k, j)) : T(1); });
}

/// The batch gradient's projection, this rank's term, from out(at): the rows, then with
/// z_k = [x_k 1] . u and |z|_k = |[x_k 1]| . |u|, s_i = sum_k dy(i, k) z_k and b_i = sum_k |dy(i, k)| |z|_k
/// (g each), then rows s and rows b (for the rows-weighted sum). X is a x rows, DY g x rows,
/// column-major; u holds sketch_weight (at least a entries); z is a scratch of at least 2 rows doubles.
template <class Exec, class MV, class UV, class DV>
void batch_sketch(const Exec& exec, const MV& X, const MV& DY, const UV& u, const DV& z, const DV& out, int at) {
  const int a = static_cast<int>(X.extent(0)), rows = static_cast<int>(X.extent(1)), g = static_cast<int>(DY.extent(0));
  Kokkos::parallel_for(
      "kdist::kfac::batch_sketch_rows", Kokkos::RangePolicy<Exec>(exec, 0, rows), KOKKOS_LAMBDA(const int k) {
        // Four partial sums each: independent chains of additions (and fabs, not a branch on the sign).
        double s[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};
        int j = 0;
        for (; j + 4 <= a; j += 4)
          for (int q = 0; q < 4; ++q) {
            const double w = static_cast<double>(u(j + q)), x = static_cast<double>(X(j + q, k));
            s[q] += x * w;
            b[q] += ::fabs(x) * ::fabs(w);
          }
        for (; j < a; ++j) {
          const double w = static_cast<double>(u(j)), x = static_cast<double>(X(j, k));
          s[0] += x * w;
          b[0] += ::fabs(x) * ::fabs(w);
        }
        z(k) = (s[0] + s[1]) + (s[2] + s[3]);
        z(rows + k) = (b[0] + b[1]) + (b[2] + b[3]);
      });
  Kokkos::parallel_for(
      "kdist::kfac::batch_sketch", Kokkos::RangePolicy<Exec>(exec, 0, g), KOKKOS_LAMBDA(const int i) {
        double s = 0, b = 0;
        for (int k = 0; k < rows; ++k) {
          const double d = static_cast<double>(DY(i, k));
          s += d * z(k);
          b += ::fabs(d) * z(rows + k);
        }
        if (i == 0) out(at) = rows;
        out(at + 1 + i) = s;
        out(at + 1 + g + i) = b;
        out(at + 1 + 2 * g + i) = rows * s;
        out(at + 1 + 3 * g + i) = rows * b;
      });
}

/// Whether the low-rank product costs this rank fewer multiply-adds than its share of the full one:
/// rows (a^2 + g^2 + a g) against a g (a + g) / sharing (sharing: the ranks a split divides it over).
bool low_rank_cheaper(int a, int g, long long rows, int sharing);

/// How the ranks' batch gradients were weighted into the given one.
enum class BatchWeights { none, ranks, rows };

/// The verdict of a layer's projections: the weights that reproduce the given gradient (ranks
/// first), or none, with the output whose deviation over tolerance was largest.
struct SketchMatch {
  BatchWeights weights = BatchWeights::none;
  int output = 0;
  double given = 0, formed = 0, tolerance = 0;
};

/// given: the gradient's projection [dW | db] u (g); sums: the batch sketches after the rows,
/// summed over the ranks (4 g, batch_sketch), ranks P and their rows in all. A weighting matches
/// when every output's deviation is within 16 sqrt(rows + a + P) eps times its batch magnitude
/// (b_i, which bounds the gradient's |[dW | db]| |u| as well): the rounding of the products, of the
/// projection and of the all-reduce, with room (eps: the working precision's).
SketchMatch match_sketch(const double* given, const double* sums, int g, int a, int ranks, double rows, double eps);

/// "ranks' mean", "rows' mean" or "none".
const char* to_string(BatchWeights w);

}  // namespace impl
}  // namespace kfac
}  // namespace kdist
