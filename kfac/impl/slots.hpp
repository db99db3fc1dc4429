// The Preconditioner's state, one object per Kronecker factor and one per layer (instead of
// parallel vectors), and the instantiations kdist_kfac compiles (internal to kfac/).
#pragma once

#include <kdist/kfac/layers.hpp>
#include <kdist/kfac/precondition_split.hpp>

#include <Kokkos_Core.hpp>
#include <string>

namespace kdist {
namespace kfac {
namespace impl {

/// One Kronecker factor, A_l or G_l. The Preconditioner keeps them in reduction order.
template <class T, class MemorySpace>
struct FactorSlot {
  using Matrix = Kokkos::View<T**, Kokkos::LayoutLeft, MemorySpace>;
  using Vector = Kokkos::View<T*, MemorySpace>;
  std::string label;      ///< "A0", "G3": the fusion tensor's and the placement item's label
  Matrix running;         ///< the running average, identical on every rank (identity at start)
  Matrix pending;         ///< this factor step's blend, all-reduced, then swapped with `running`
  Matrix inverse;         ///< (running + damping I)^-1 from the last inverse step, or its Cholesky factor R
  bool cholesky = false;  ///< `inverse` holds R (Options::cholesky_solves), applied by two solves
  Vector packed;          ///< CT: the broadcast's packed upper triangle; NCT: empty
};

/// One layer: its description, the gradient as one matrix and its preconditioned result.
template <class T, class MemorySpace>
struct LayerSlot {
  using Matrix = Kokkos::View<T**, Kokkos::LayoutLeft, MemorySpace>;
  using Vector = Kokkos::View<T*, MemorySpace>;
  Layer layer;
  PreconditionSplit split;  ///< split preconditioning: this layer's axis and block
  Matrix gradient;          ///< [dW | db]ᵀ, a_dim x g_dim
  Matrix result;            ///< Vᵀ; split over outputs: padded to ranks x block columns
  Matrix block;             ///< split: this rank's columns (a_dim x block) or rows (block x g_dim) of Vᵀ
  Vector gathered;          ///< split over inputs: every rank's block of rows, all-gathered
  int rows = 0;             ///< samples (Dense) or images (Conv2d) the last on_forward saw
  int spatial = 0;          ///< Conv2d: output locations (out_h * out_w) the last on_forward saw
  // Options::low_rank_dense (Dense layers), kfac/impl/low_rank.hpp:
  Matrix batch_x;           ///< [x 1]ᵀ of this step's on_forward, a_dim x rows
  Matrix batch_dy;          ///< dyᵀ of this step's on_backward, g_dim x rows
  Matrix batch_work;        ///< A^-1 [x 1]ᵀ where A is an inverse (a_dim x rows)
  int batch_rows = 0;       ///< rows of batch_x
  bool from_batch = false;  ///< this step: preconditioned from the batch (the same on every rank)
  double batch_weight = 0;  ///< this rank's weight in that sum (0 for a rank with no rows)
};

}  // namespace impl
}  // namespace kfac
}  // namespace kdist

/// X(T, MemorySpace) for each Preconditioner that kdist_kfac compiles (kfac/preconditioner.cpp):
/// float and double, on the host space and, in device builds, on the default device space.
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || defined(KOKKOS_ENABLE_SYCL)
#define KDIST_KFAC_FOR_BUILT_SPACES(X) \
  X(float, Kokkos::HostSpace)          \
  X(double, Kokkos::HostSpace)         \
  X(float, Kokkos::DefaultExecutionSpace::memory_space) X(double, Kokkos::DefaultExecutionSpace::memory_space)
#else
#define KDIST_KFAC_FOR_BUILT_SPACES(X) X(float, Kokkos::HostSpace) X(double, Kokkos::HostSpace)
#endif
