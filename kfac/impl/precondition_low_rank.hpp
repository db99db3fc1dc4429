// Preconditioner, continued: Options::low_rank_dense (kfac/impl/low_rank.hpp for the algebra and
// the check): the hooks' copies of each step's batch, the choice of the layers that go low rank
// with the check of their gradients, and the product. Included by kfac/preconditioner.hpp only.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace kdist {
namespace kfac {

// The batch's copies for Options::low_rank_dense, on every step: x as [x 1]ᵀ (a_dim x rows) and dy as
// dyᵀ (g_dim x rows), column-major, which the preconditioning multiplies (and solves) in place.
template <class T, class M>
template <class XView>
void Preconditioner<T, M>::keep_batch_inputs(const execution_space& exec, int l, const XView& x) {
  LayerSlot& slot = layer_slot(l);
  keep_batch(exec, l, x, "on_forward: activations", slot.layer.inputs(), -1, slot.layer.a_dim(), slot.batch_x);
  slot.batch_rows = static_cast<int>(x.extent(0));
}

template <class T, class M>
template <class YView>
void Preconditioner<T, M>::keep_batch_gradients(const execution_space& exec, int l, const YView& dy) {
  LayerSlot& slot = layer_slot(l);
  keep_batch(exec, l, dy, "on_backward: output gradients", slot.layer.outputs(), slot.batch_rows, slot.layer.g_dim(),
             slot.batch_dy);
}

template <class T, class M>
template <class View>
void Preconditioner<T, M>::keep_batch(const execution_space& exec, int l, const View& v, const char* what, int features,
                                      int rows, int dim, Matrix& into) {
  std::string bad;
  if constexpr (compat::view_rank<View>() != 2) {
    bad = " are not rows x features (rank 2)";
  } else if (static_cast<int>(v.extent(1)) != features || (rows >= 0 && static_cast<int>(v.extent(0)) != rows)) {
    bad = " do not have " + (rows >= 0 ? std::to_string(rows) + " rows and " : std::string()) +
          std::to_string(features) + " columns";
  }
  if (!bad.empty())
    raise(InvalidArgument(std::string("kdist::kfac::") + what + " " + kdist::impl::describe(v) + bad + " (layer " +
                          std::to_string(l) + " " + layer(l).describe() + ", rank " + std::to_string(engine_.rank()) +
                          ")"));
  if constexpr (compat::view_rank<View>() == 2) {
    try {
      impl::fit_columns(into, dim, static_cast<int>(v.extent(0)), "kdist::kfac::batch");
      impl::keep_batch_columns(exec, v, into);
    } catch (...) {
      fail_and_rethrow();
    }
  }
}

// The sums buffer holds, per Dense layer, [rows, s (g), b (g), rows s, rows b] (impl::batch_sketch),
// all-reduced at once; the given gradients' projections are every rank's alike. A layer goes low
// rank where low_rank_cheaper says so for the ranks' mean rows (the same verdict everywhere: it
// reads reduced values only), and only then is its gradient checked.
template <class T, class M>
void Preconditioner<T, M>::choose_low_rank(const execution_space& exec) {
  for (LayerSlot& slot : layer_slots_) slot.from_batch = false;
  if (!options_.low_rank_dense) return;
  std::vector<int> dense, at, given_at;
  int sums = 0, given = 0, rows = 0;
  for (int l = 0; l < layers(); ++l)
    if (keeps_batch(l)) {
      dense.push_back(l);
      at.push_back(sums);
      given_at.push_back(given);
      sums += 1 + 4 * layer(l).g_dim();
      given += layer(l).g_dim();
      rows = std::max(rows, layer_slot(l).batch_rows);
    }
  if (dense.empty()) return;
  if (static_cast<int>(sketch_sums_.extent(0)) != sums) {
    sketch_sums_ = decltype(sketch_sums_)("kdist::kfac::sketch_sums", sums);
    sketch_given_ = Vector("kdist::kfac::sketch_given", given);
    int a = 0;
    for (const int l : dense) a = std::max(a, layer(l).a_dim());
    sketch_u_ = Vector("kdist::kfac::sketch_u", a);
    impl::fill_sketch_vector(exec, sketch_u_);
  }
  if (static_cast<int>(sketch_rows_.extent(0)) < 2 * rows)
    sketch_rows_ = decltype(sketch_rows_)("kdist::kfac::sketch_rows", 2 * rows);
  for (std::size_t i = 0; i < dense.size(); ++i) {
    const LayerSlot& slot = layer_slot(dense[i]);
    const int a = slot.layer.a_dim(), g = slot.layer.g_dim();
    impl::batch_sketch(exec, slot.batch_x, slot.batch_dy, sketch_u_, sketch_rows_, sketch_sums_, at[i]);
    gemm(exec, "T", "N", T(1), slot.gradient, Matrix(sketch_u_.data(), a, 1), T(0),
         Matrix(sketch_given_.data() + given_at[i], g, 1));
  }
  const bool summed = options_.gradients == Gradients::averaged && engine_.size() > 1;
  if (summed) engine_.allreduce(exec, sketch_sums_, comm::ReduceOp::sum, "kfac low-rank check").wait();
  const auto h_sums = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sketch_sums_);
  const auto h_given = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sketch_given_);
  const int P = summed ? engine_.size() : 1;
  for (std::size_t i = 0; i < dense.size(); ++i) {
    LayerSlot& slot = layer_slot(dense[i]);
    const int a = slot.layer.a_dim(), g = slot.layer.g_dim();
    const double total = h_sums(at[i]);
    const long long mean_rows = static_cast<long long>(std::ceil(total / P));
    if (total <= 0 || !impl::low_rank_cheaper(a, g, mean_rows, split() ? engine_.size() : 1)) continue;
    const std::vector<double> projected(h_given.data() + given_at[i], h_given.data() + given_at[i] + g);
    const impl::SketchMatch m =
        impl::match_sketch(projected.data(), &h_sums(at[i] + 1), g, a, P, total, std::numeric_limits<T>::epsilon());
    if (m.weights == impl::BatchWeights::none)
      raise(InvalidArgument(
          "kdist::kfac::step: with low_rank_dense, the gradient of layer " + std::to_string(dense[i]) + " " +
          slot.layer.describe() + " is not its batch's (the " + std::to_string(static_cast<long long>(total)) +
          " rows its hooks saw, the ranks' or the rows' mean): projected on output " + std::to_string(m.output) +
          " it gives " + std::to_string(m.given) + ", the batch " + std::to_string(m.formed) + " (tolerance " +
          std::to_string(m.tolerance) + "). Weight decay, an L2 term, clipping or accumulation in the gradient " +
          "would be lost: apply them after step(), or turn low_rank_dense off (rank " + std::to_string(engine_.rank()) +
          ")"));
    slot.from_batch = true;
    slot.batch_weight = m.weights == impl::BatchWeights::ranks ? 1.0 / P : slot.batch_rows / total;
  }
}

// Vᵀ_r = w_r (A^-1 [x 1]ᵀ)(G^-1 dyᵀ)ᵀ: the factors kept as R solve the batch's copies in place;
// an inverse multiplies them into batch_work (A) or the scratch (G).
template <class T, class M>
comm::Request Preconditioner<T, M>::precondition_from_batch(const execution_space& exec, int l) {
  LayerSlot& slot = layer_slot(l);
  const FactorSlot &A = factor_slot(a_index(l)), &G = factor_slot(g_index(l));
  const int a = slot.layer.a_dim(), g = slot.layer.g_dim(), rows = slot.batch_rows;
  const Matrix out = preconditioned(l);
  if (rows == 0) {
    Kokkos::deep_copy(exec, out, T(0));
  } else {
    Matrix X = slot.batch_x, Y = slot.batch_dy;
    if (A.cholesky) {
      cholesky_solve_left(exec, A.inverse, X);
    } else {
      impl::fit_columns(slot.batch_work, a, rows, "kdist::kfac::batch_work");
      gemm(exec, "N", "N", T(1), A.inverse, slot.batch_x, T(0), slot.batch_work);
      X = slot.batch_work;
    }
    if (G.cholesky) {
      cholesky_solve_left(exec, G.inverse, Y);
    } else {
      Y = scratch_matrix(g, rows);
      gemm(exec, "N", "N", T(1), G.inverse, slot.batch_dy, T(0), Y);
    }
    gemm(exec, "N", "T", static_cast<T>(slot.batch_weight), X, Y, T(0), out);
  }
  ++stats_.low_rank_products;
  if (options_.gradients == Gradients::per_rank || engine_.size() == 1) return {};
  return engine_.allreduce(exec, Vector(out.data(), out.size()), comm::ReduceOp::sum,
                           "kfac preconditioned layer " + std::to_string(l) + " (low rank)");
}

}  // namespace kfac
}  // namespace kdist
