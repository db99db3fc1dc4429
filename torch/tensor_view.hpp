// LibTorch tensors seen as Kokkos views, without a copy: the view aliases the tensor's storage,
// so a kernel that writes the view writes the tensor.
//
//   at::Tensor w = linear->weight.grad();                      // [out, in], float, contiguous
//   auto v = kdist::torch::view_of<float**>(w, "fc1 weight grad");  // Kokkos::View<float**, LayoutRight>
//   auto g = kdist::torch::flat_view_of<float>(w, "fc1 weight grad");  // all of it, rank 1
//
// Contract. The tensor must be defined, strided (not sparse or MKL-DNN), of the view's element type
// (float: torch::kFloat32, double: torch::kFloat64), of the view's rank (flat_view_of: any rank),
// contiguous (row-major, so the view is LayoutRight), and on the view's memory space's device: the
// CPU for HostSpace, a CUDA device for CudaSpace (CUDA builds). Anything else is a
// kdist::InvalidArgument naming the operation, `what`, the tensor's sizes, dtype, device and
// strides, and the MPI rank: no silent copy. The view does not own the storage: keep the tensor
// alive while it is used, and do not let torch resize it.
#pragma once

#include <kdist/core/error.hpp>

#include <ATen/ATen.h>
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <type_traits>

namespace kdist {
namespace torch {

namespace impl {
/// "sizes [2, 3], Float, cpu, strides [1, 2]" for messages (torch's dtype names).
std::string describe(const at::Tensor& t);
/// Throws InvalidArgument "kdist::torch::<operation>: <what>: <problem>: <describe(t)> (rank r)".
[[noreturn]] void refuse(const char* operation, const std::string& what, const std::string& problem,
                         const at::Tensor& t);
/// The tensor is defined, of `dtype`, contiguous and on `device_type`, with `rank` dims (-1: any).
void check_tensor(const char* operation, const std::string& what, const at::Tensor& t, at::ScalarType dtype, int rank,
                  c10::DeviceType device_type);

template <class T>
constexpr at::ScalarType scalar_type() {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value, "kdist::torch: float or double");
  return std::is_same<T, float>::value ? at::kFloat : at::kDouble;
}
/// The device a tensor must be on for views in MemorySpace.
template <class MemorySpace>
constexpr c10::DeviceType device_type() {
#if defined(KOKKOS_ENABLE_CUDA)
  if (!std::is_same<MemorySpace, Kokkos::HostSpace>::value) return c10::DeviceType::CUDA;
#endif
  return c10::DeviceType::CPU;
}
}  // namespace impl

/// The tensor as a LayoutRight view of DataType (T*, T**, T***, T****), no copy.
template <class DataType, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
Kokkos::View<DataType, Kokkos::LayoutRight, MemorySpace> view_of(const at::Tensor& t, const std::string& what) {
  using View = Kokkos::View<DataType, Kokkos::LayoutRight, MemorySpace>;
  using T = typename View::value_type;
  constexpr int rank = static_cast<int>(View::rank);
  impl::check_tensor("view_of", what, t, impl::scalar_type<T>(), rank, impl::device_type<MemorySpace>());
  T* data = t.data_ptr<T>();
  const auto n = [&](int d) { return d < rank ? static_cast<std::size_t>(t.size(d)) : KOKKOS_INVALID_INDEX; };
  return View(data, n(0), n(1), n(2), n(3));
}

/// Every element of the tensor, in storage order, as a rank-1 view (any tensor rank), no copy.
template <class T, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
Kokkos::View<T*, MemorySpace> flat_view_of(const at::Tensor& t, const std::string& what) {
  impl::check_tensor("flat_view_of", what, t, impl::scalar_type<T>(), -1, impl::device_type<MemorySpace>());
  return Kokkos::View<T*, MemorySpace>(t.data_ptr<T>(), static_cast<std::size_t>(t.numel()));
}

}  // namespace torch
}  // namespace kdist
