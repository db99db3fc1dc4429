// InverseWorkspace<T, MemorySpace>: the scratch of spd_inverse and symmetric_eigen, kept between
// calls so that repeated inverses (K-FAC inverts every factor every few steps) allocate nothing.
//
// Contract:
//   - It holds, in MemorySpace: the LAPACK / cuSOLVER work buffer, the eigenvector and scaled
//     eigenvector matrices and the eigenvalues of the eigen method, and a few status words
//     (NaN/Inf count, the backends' info values) that one copy brings back to the host.
//   - Every buffer grows on demand to the largest call seen and never shrinks (release() frees
//     all); a call of a smaller or equal size allocates nothing. allocations() counts the
//     (re)allocations since construction, bytes() what is held now.
//   - A call through a workspace synchronises its execution space instance once (reading the
//     status back) and leaves no kernel using the scratch when it returns, so one workspace may
//     serve calls on different instances one after another; it must not serve two calls at once
//     (one workspace per thread).
//   - Not copyable (it owns its buffers); movable. Labels: "<label>::<buffer>", so Kokkos Tools
//     show who holds the memory.
//   - The impl_* members are the interface of core/inverse.hpp, not for users.
//   kdist::InverseWorkspace<double, Kokkos::HostSpace> ws;
//   for (auto& f : factors) kdist::spd_inverse(exec, f.A, damping, f.inv, ws);
#pragma once

#include <kdist/core/compat.hpp>
#include <kdist/core/views.hpp>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

namespace kdist {
namespace impl {

/// What one call needs to know on the host after its kernels ran.
struct SolverStatus {
  long long nonfinite = 0;  ///< NaN/Inf entries found in the input
  int info[2] = {0, 0};     ///< backend info of stage 1 (potrf or syevd) and stage 2 (potri)
  double lowest = 0.0;      ///< smallest eigenvalue + damping (eigen method)
  double highest = 0.0;     ///< largest eigenvalue + damping (eigen method)
};

}  // namespace impl

template <class T, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class InverseWorkspace {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "kdist::InverseWorkspace: float or double only");
  static_assert(Kokkos::is_memory_space<MemorySpace>::value, "kdist::InverseWorkspace: not a memory space");

 public:
  using value_type = T;
  using memory_space = MemorySpace;
  using matrix_type = Kokkos::View<T**, Kokkos::LayoutLeft, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using vector_type = Kokkos::View<T*, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using count_type = Kokkos::View<long long, MemorySpace>;
  using info_type = Kokkos::View<int*, MemorySpace>;

  explicit InverseWorkspace(std::string label = "kdist::InverseWorkspace") : label_(std::move(label)) {}
  InverseWorkspace(const InverseWorkspace&) = delete;
  InverseWorkspace& operator=(const InverseWorkspace&) = delete;
  InverseWorkspace(InverseWorkspace&&) = default;
  InverseWorkspace& operator=(InverseWorkspace&&) = default;

  const std::string& label() const noexcept { return label_; }
  /// Number of buffer (re)allocations so far.
  std::size_t allocations() const noexcept { return allocations_; }
  /// Bytes held now in MemorySpace.
  std::size_t bytes() const noexcept {
    return held(solver_) + held(matrices_[0]) + held(matrices_[1]) + held(eigenvalues_) + held(nonfinite_) +
           held(info_) + held(status_);
  }
  /// Frees every buffer (the next call allocates again).
  void release() {
    solver_ = decltype(solver_)();
    matrices_[0] = matrices_[1] = eigenvalues_ = Kokkos::View<T*, MemorySpace>();
    nonfinite_ = count_type();
    info_ = info_type();
    status_ = decltype(status_)();
    status_host_ = decltype(status_host_)();
  }

  // ---- interface of core/inverse.hpp ----------------------------------------------------------

  /// At least `bytes` bytes of backend work space (nullptr for none).
  template <class ExecSpace>
  void* impl_solver_scratch(const ExecSpace& exec, std::size_t bytes) {
    if (bytes > solver_.extent(0)) grow(exec, solver_, "solver_scratch", bytes);
    return bytes ? static_cast<void*>(solver_.data()) : nullptr;
  }
  /// An n x n contiguous matrix (lda = n); slot 0 and 1 are distinct buffers.
  template <class ExecSpace>
  matrix_type impl_matrix(const ExecSpace& exec, int slot, int n) {
    static const char* const names[2] = {"Q", "Q_scaled"};
    const std::size_t need = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
    if (need > matrices_[slot].extent(0)) grow(exec, matrices_[slot], names[slot], need);
    return matrix_type(matrices_[slot].data(), n, n);
  }
  template <class ExecSpace>
  vector_type impl_eigenvalues(const ExecSpace& exec, int n) {
    if (static_cast<std::size_t>(n) > eigenvalues_.extent(0))
      grow(exec, eigenvalues_, "eigenvalues", static_cast<std::size_t>(n));
    return vector_type(eigenvalues_.data(), n);
  }
  /// Reduction target for the NaN/Inf count and the backends' two info words.
  template <class ExecSpace>
  count_type impl_nonfinite(const ExecSpace& exec) {
    ensure_status(exec);
    return nonfinite_;
  }
  template <class ExecSpace>
  info_type impl_info(const ExecSpace& exec) {
    ensure_status(exec);
    return info_;
  }

  /// Gathers the count, the infos and, when `w` is not empty, w(0) + gamma and w(last) + gamma
  /// (eigenvalues ascending) into one small view and copies it back: the one synchronisation.
  template <class ExecSpace, class WV>
  impl::SolverStatus impl_read_status(const ExecSpace& exec, const WV& w, T gamma) {
    ensure_status(exec);
    const auto count = nonfinite_;
    const auto info = info_;
    const auto status = status_;
    const int m = static_cast<int>(w.extent(0));
    Kokkos::parallel_for(
        "kdist::InverseWorkspace::gather_status", Kokkos::RangePolicy<ExecSpace>(exec, 0, 1), KOKKOS_LAMBDA(const int) {
          status(0) = static_cast<double>(count());
          status(1) = static_cast<double>(info(0));
          status(2) = static_cast<double>(info(1));
          status(3) = m > 0 ? static_cast<double>(w(0) + gamma) : 0.0;
          status(4) = m > 0 ? static_cast<double>(w(m - 1) + gamma) : 0.0;
        });
    Kokkos::deep_copy(exec, status_host_, status);
    compat::fence(exec, "kdist::InverseWorkspace: status read-back");
    impl::SolverStatus s;
    s.nonfinite = static_cast<long long>(status_host_(0));
    s.info[0] = static_cast<int>(status_host_(1));
    s.info[1] = static_cast<int>(status_host_(2));
    s.lowest = status_host_(3);
    s.highest = status_host_(4);
    return s;
  }
  template <class ExecSpace>
  impl::SolverStatus impl_read_status(const ExecSpace& exec) {
    return impl_read_status(exec, vector_type(), T(0));
  }

 private:
  template <class V>
  static std::size_t held(const V& v) noexcept {  // a default rank-0 view has span 1 and no data
    return v.data() ? v.span() * sizeof(typename V::value_type) : 0;
  }
  template <class ExecSpace, class V>
  void grow(const ExecSpace& exec, V& view, const char* name, std::size_t n) {
    view = V();  // free the old buffer first: peak memory is the new size, not both
    view = V(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, label_ + "::" + name), n);
    ++allocations_;
  }
  template <class ExecSpace>
  void ensure_status(const ExecSpace& exec) {
    if (status_.extent(0) != 0) return;
    nonfinite_ = count_type(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, label_ + "::nonfinite"));
    info_ = info_type(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, label_ + "::info"), 2);
    status_ = Kokkos::View<double*, MemorySpace>(
        Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, label_ + "::status"), 5);
    status_host_ = Kokkos::create_mirror_view(status_);
    allocations_ += 3;
  }

  std::string label_;
  std::size_t allocations_ = 0;
  Kokkos::View<char*, MemorySpace> solver_;
  Kokkos::View<T*, MemorySpace> matrices_[2];
  Kokkos::View<T*, MemorySpace> eigenvalues_;
  count_type nonfinite_;
  info_type info_;
  Kokkos::View<double*, MemorySpace> status_;
  typename Kokkos::View<double*, MemorySpace>::host_mirror_type status_host_;
};

}  // namespace kdist
