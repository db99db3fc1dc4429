// K-FAC Kronecker factors of one layer from its activations and output gradients, in the KFC
// normalisation (docs/architecture.md §3), on the caller's execution-space instance:
//   Dense, n rows:  A = āᵀā / n with ā = [X 1] when the layer has a bias (a_dim = in (+1));
//                   G = ĝᵀĝ / n = n·dYᵀdY, with dY the gradient of the MEAN loss, so ĝ = n·dY is
//                   the per-sample gradient.
//   Conv2d, batch B, S = out_h·out_w locations: ā = im2col(X) (B·S rows, kdist/core/im2col.hpp)
//                   with a ones column when biased, A = āᵀā / (B·S) (averaged over all rows);
//                   conv2d_a_factor_from_patches takes patches a forward pass already formed;
//                   G = B·Σ_{b,s} dY_{b,s} dY_{b,s}ᵀ (ĝ = B·dY summed per location, averaged
//                   over the batch), so the layer block is A⊗G as in Grosse & Martens.
// Views: X / dY of a Dense layer rank 2 (rows x inputs / rows x outputs), LayoutLeft or
// LayoutRight, read in place; of a Conv2d layer NCHW rank 4, any layout. A and G are LayoutLeft,
// a_dim² / g_dim², written in full (symmetric), or with FactorUpdate::running_average(keep) (the
// last argument) only their upper triangle blended as keep·old + (1 - keep)·new. Every product
// goes through factor_product.
// Errors: a layer of the other kind, extents that do not fit the layer, an empty batch or a
// factor sharing storage with its input throw InvalidArgument naming the operation, the layer
// (Layer::describe), the view's label and extents and the expected ones; the factor is untouched.
// FactorWorkspace<T, MemorySpace> holds the conv scratch (im2col or row patches, gradient rows)
// and grows it on demand: a call of a size not larger than one before allocates nothing. One
// workspace serves one call at a time; calls on different instances must be ordered by the caller.
#pragma once

#include <kdist/core/im2col.hpp>
#include <kdist/core/phase.hpp>
#include <kdist/core/products.hpp>
#include <kdist/core/views.hpp>
#include <kdist/kfac/impl/conv_shifts.hpp>
#include <kdist/kfac/layers.hpp>

#include <Kokkos_Core.hpp>
#include <array>
#include <climits>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

namespace kdist {
namespace kfac {

template <class T, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class FactorWorkspace {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "kdist::kfac::FactorWorkspace: float or double only");
  static_assert(Kokkos::is_memory_space<MemorySpace>::value, "kdist::kfac::FactorWorkspace: not a memory space");

 public:
  using value_type = T;
  using memory_space = MemorySpace;
  // Column-major: im2col and the NCHW copy write it along rows, syrk reads it in place.
  using matrix_type = Kokkos::View<T**, Kokkos::LayoutLeft, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  explicit FactorWorkspace(std::string label = "kdist::kfac::FactorWorkspace") : label_(std::move(label)) {}
  FactorWorkspace(const FactorWorkspace&) = delete;
  FactorWorkspace& operator=(const FactorWorkspace&) = delete;
  FactorWorkspace(FactorWorkspace&&) = default;
  FactorWorkspace& operator=(FactorWorkspace&&) = default;

  const std::string& label() const noexcept { return label_; }
  /// Number of buffer (re)allocations so far.
  std::size_t allocations() const noexcept { return allocations_; }
  /// Bytes held now in MemorySpace.
  std::size_t bytes() const noexcept { return buffer_.extent(0) * sizeof(T); }
  /// Frees the buffer (the next call allocates again).
  void release() { buffer_ = Kokkos::View<T*, MemorySpace>(); }

  /// A rows x cols column-major scratch matrix (interface of the factor functions, not for users).
  template <class ExecSpace>
  matrix_type impl_rows(const ExecSpace& exec, int rows, int cols) {
    const std::size_t need = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
    if (need > buffer_.extent(0)) {
      buffer_ = Kokkos::View<T*, MemorySpace>();  // free first: peak memory is the new size only
      buffer_ = Kokkos::View<T*, MemorySpace>(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, label_), need);
      ++allocations_;
    }
    return matrix_type(buffer_.data(), rows, cols);
  }

 private:
  std::string label_;
  std::size_t allocations_ = 0;
  Kokkos::View<T*, MemorySpace> buffer_;
};

namespace impl {

inline void require_kind(const char* func, const Layer& layer, LayerKind kind) {
  if (layer.kind() != kind)
    kdist::impl::throw_invalid(
        func, "layer " + layer.describe() + " is not a " + (kind == LayerKind::dense ? "Dense" : "Conv2d") + " layer");
}

/// Layer kind, the extent of the input's dimension 1 (Dense columns or NCHW channels; the other
/// extents are the caller's, but none may be 0 and the whole must be int-indexable) and the
/// square factor of dimension `dim`, disjoint from the input.
template <class ExecSpace, class V, class F>
void check_layer_views(const char* func, const Layer& layer, LayerKind kind, const V& v, int channels,
                       const char* shape, const F& factor, int dim) {
  kdist::impl::static_check_view<ExecSpace, V>();
  kdist::impl::static_check_view<ExecSpace, F>();
  require_kind(func, layer, kind);
  std::array<std::size_t, compat::view_rank<V>()> want;
  for (int r = 0; r < compat::view_rank<V>(); ++r) want[r] = v.extent(r);
  want[1] = static_cast<std::size_t>(channels);
  const std::string why = std::string("(") + shape + ") for " + layer.describe();
  kdist::impl::require_extents(func, v, want, why);
  if (v.size() == 0 || v.size() > static_cast<std::size_t>(INT_MAX))
    kdist::impl::throw_invalid(func,
                               "view " + kdist::impl::describe(v) + " must be non-empty and int-indexable " + why);
  kdist::impl::require_extents(func, factor, {std::size_t(dim), std::size_t(dim)},
                               std::string("(the factor) for ") + layer.describe());
  kdist::impl::require_disjoint(func, v, factor);
}

/// Entries of the vector v that are not exactly 1.
template <class ExecSpace, class V>
int count_not_one(const ExecSpace& exec, const V& v) {
  using T = typename V::non_const_value_type;
  int count = 0;
  Kokkos::parallel_reduce(
      "kdist::kfac::count_not_one", Kokkos::RangePolicy<ExecSpace>(exec, 0, v.extent(0)),
      KOKKOS_LAMBDA(const int i, int& n) { n += v(i) == T(1) ? 0 : 1; }, count);
  return count;
}

template <class AView, class T, class MemorySpace, class ExecSpace>
constexpr void static_check_workspace() {
  static_assert(std::is_same<typename AView::non_const_value_type, T>::value,
                "kdist::kfac: workspace and factor value types differ");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, MemorySpace>::accessible,
                "kdist::kfac: workspace memory is not accessible from the execution space");
}

}  // namespace impl

/// A = āᵀā / n for the n x inputs activations X of a Dense layer (ā = [X 1] with a bias).
template <class ExecSpace, class XView, class AView>
void dense_a_factor(const ExecSpace& exec, const Layer& layer, const XView& X, const AView& A,
                    const FactorUpdate& update = FactorUpdate::replace()) {
  constexpr const char* func = "kdist::kfac::dense_a_factor";
  static_assert(compat::view_rank<XView>() == 2, "kdist::kfac::dense_a_factor: X must be rank 2");
  impl::check_layer_views<ExecSpace>(func, layer, LayerKind::dense, X, layer.inputs(), "rows x inputs", A,
                                     layer.a_dim());
  Phase phase(func);
  using T = typename AView::non_const_value_type;
  factor_product(exec, X, A, static_cast<T>(1.0 / static_cast<double>(X.extent(0))), layer.bias(), update);
}

/// G = n·dYᵀdY for the n x outputs gradient dY of the mean loss at a Dense layer's output.
template <class ExecSpace, class YView, class GView>
void dense_g_factor(const ExecSpace& exec, const Layer& layer, const YView& dY, const GView& G,
                    const FactorUpdate& update = FactorUpdate::replace()) {
  constexpr const char* func = "kdist::kfac::dense_g_factor";
  static_assert(compat::view_rank<YView>() == 2, "kdist::kfac::dense_g_factor: dY must be rank 2");
  impl::check_layer_views<ExecSpace>(func, layer, LayerKind::dense, dY, layer.outputs(), "rows x outputs", G,
                                     layer.g_dim());
  Phase phase(func);
  using T = typename GView::non_const_value_type;
  factor_product(exec, dY, G, static_cast<T>(dY.extent(0)), false, update);
}

/// A = āᵀā / (B·S) from the patches that kdist::im2col formed for the geometry g of a Conv2d
/// layer's input: g.rows() x g.patch() (any layout; column-major is read in place by syrk), or,
/// for a layer with a bias, g.rows() x (g.patch() + 1) with ones in the last column, ā itself:
/// then the bias row comes out of the one syrk instead of a pass over the patches.
template <class ExecSpace, class PView, class AView>
void conv2d_a_factor_from_patches(const ExecSpace& exec, const Layer& layer, const Conv2dGeometry& g,
                                  const PView& patches, const AView& A,
                                  const FactorUpdate& update = FactorUpdate::replace()) {
  constexpr const char* func = "kdist::kfac::conv2d_a_factor_from_patches";
  static_assert(compat::view_rank<PView>() == 2, "kdist::kfac::conv2d_a_factor_from_patches: patches are rank 2");
  kdist::impl::static_check_view<ExecSpace, PView>();
  kdist::impl::static_check_view<ExecSpace, AView>();
  impl::require_kind(func, layer, LayerKind::conv2d);
  const std::string why = " for " + layer.describe();
  g.validate(func, why);
  if (g.channels != layer.in_channels() || g.kernel_h != layer.kernel_h() || g.kernel_w != layer.kernel_w() ||
      g.stride != layer.stride() || g.padding != layer.padding())
    kdist::impl::throw_invalid(func, "the patches' geometry (" + g.describe() + ") is not the layer's" + why);
  const bool augmented = layer.bias() && patches.extent(1) == std::size_t(g.patch()) + 1;
  kdist::impl::require_extents(func, patches, {std::size_t(g.rows()), std::size_t(g.patch()) + (augmented ? 1 : 0)},
                               std::string("(batch*out_h*out_w x in_channels*kernel_h*kernel_w") +
                                   (layer.bias() ? " (+1: ones)" : "") + ")" + why);
  kdist::impl::require_extents(func, A, {std::size_t(layer.a_dim()), std::size_t(layer.a_dim())}, "(the factor)" + why);
  kdist::impl::require_disjoint(func, patches, A);
  using T = typename AView::non_const_value_type;
  if (augmented) {
    const int not_one = impl::count_not_one(exec, Kokkos::subview(patches, Kokkos::ALL(), g.patch()));
    if (not_one > 0)
      kdist::impl::throw_invalid(func, std::to_string(not_one) + " entries of the patches' last column " +
                                           kdist::impl::describe(patches) + " are not 1" + why);
  }
  factor_product(exec, patches, A, static_cast<T>(1.0 / static_cast<double>(g.rows())), layer.bias() && !augmented,
                 update);
}

/// A = āᵀā / (B·S) over the im2col patches of the NCHW input X of a Conv2d layer. On the host a
/// stride-1 layer of 10+ channel x kernel columns takes the patches' overlap instead of forming
/// them (kfac/impl/conv_shifts.hpp; conv2d_a_factor_prefers_input says when).
template <class ExecSpace, class XView, class AView, class T, class MemorySpace>
void conv2d_a_factor(const ExecSpace& exec, const Layer& layer, const XView& X, const AView& A,
                     FactorWorkspace<T, MemorySpace>& workspace, const FactorUpdate& update = FactorUpdate::replace()) {
  constexpr const char* func = "kdist::kfac::conv2d_a_factor";
  static_assert(compat::view_rank<XView>() == 4, "kdist::kfac::conv2d_a_factor: X must be rank 4 (NCHW)");
  impl::static_check_workspace<AView, T, MemorySpace, ExecSpace>();
  impl::check_layer_views<ExecSpace>(func, layer, LayerKind::conv2d, X, layer.in_channels(),
                                     "batch x in_channels x height x width", A, layer.a_dim());
  const int B = static_cast<int>(X.extent(0)), H = static_cast<int>(X.extent(2)), W = static_cast<int>(X.extent(3));
  const Conv2dGeometry g{
      B, layer.in_channels(), H, W, layer.kernel_h(), layer.kernel_w(), layer.stride(), layer.padding()};
  g.validate(func, " for " + layer.describe());
  Phase phase(func);
  if (impl::a_factor_by_shifts<ExecSpace>(layer, g)) {
    const auto m = impl::shift_columns(g);
    const auto scratch = workspace.impl_rows(exec, static_cast<int>(impl::shift_scratch_entries(g) / m), m);
    return impl::conv2d_a_factor_by_shifts(exec, layer, g, X, A, scratch, update);
  }
  const auto patches = workspace.impl_rows(exec, g.rows(), g.patch());
  im2col(exec, g, X, patches);
  conv2d_a_factor_from_patches(exec, layer, g, patches, A, update);
}

/// Whether conv2d_a_factor on ExecSpace computes this layer's A from its input X for geometry g
/// faster than conv2d_a_factor_from_patches from patches already formed: a caller holding both
/// (nn::Conv2d) passes X then.
template <class ExecSpace>
bool conv2d_a_factor_prefers_input(const Layer& layer, const Conv2dGeometry& g) {
  return impl::a_factor_by_shifts<ExecSpace>(layer, g);
}

/// G = B·Σ_{b,s} dY_{b,s} dY_{b,s}ᵀ for the NCHW gradient dY (B, outputs, out_h, out_w) of the
/// mean loss at a Conv2d layer's output.
template <class ExecSpace, class YView, class GView, class T, class MemorySpace>
void conv2d_g_factor(const ExecSpace& exec, const Layer& layer, const YView& dY, const GView& G,
                     FactorWorkspace<T, MemorySpace>& workspace, const FactorUpdate& update = FactorUpdate::replace()) {
  constexpr const char* func = "kdist::kfac::conv2d_g_factor";
  static_assert(compat::view_rank<YView>() == 4, "kdist::kfac::conv2d_g_factor: dY must be rank 4 (NCHW)");
  impl::static_check_workspace<GView, T, MemorySpace, ExecSpace>();
  impl::check_layer_views<ExecSpace>(func, layer, LayerKind::conv2d, dY, layer.outputs(),
                                     "batch x outputs x out_h x out_w", G, layer.g_dim());
  Phase phase(func);
  const int batch = static_cast<int>(dY.extent(0));
  const auto rows = workspace.impl_rows(exec, static_cast<int>(dY.size() / dY.extent(1)), layer.outputs());
  nchw_to_rows(exec, dY, rows);
  factor_product(exec, rows, G, static_cast<T>(batch), false, update);
}

// ---- the same on the factor's default execution space -------------------------------------------

template <class XView, class AView>
void dense_a_factor(const Layer& layer, const XView& X, const AView& A) {
  dense_a_factor(typename AView::execution_space{}, layer, X, A);
}
template <class YView, class GView>
void dense_g_factor(const Layer& layer, const YView& dY, const GView& G) {
  dense_g_factor(typename GView::execution_space{}, layer, dY, G);
}
template <class XView, class AView, class T, class MemorySpace>
void conv2d_a_factor(const Layer& layer, const XView& X, const AView& A, FactorWorkspace<T, MemorySpace>& workspace) {
  conv2d_a_factor(typename AView::execution_space{}, layer, X, A, workspace);
}
template <class YView, class GView, class T, class MemorySpace>
void conv2d_g_factor(const Layer& layer, const YView& dY, const GView& G, FactorWorkspace<T, MemorySpace>& workspace) {
  conv2d_g_factor(typename GView::execution_space{}, layer, dY, G, workspace);
}

}  // namespace kfac
}  // namespace kdist
