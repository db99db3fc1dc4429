// The execution and memory space the unit tests run their kernels on, and the helpers that move
// test data there and back (the pattern of Kokkos Kernels' and Cabana's test headers).
//
// The rule:
//   - A test body is written once, on TestExec / TestMem: every kdist kernel under test is called
//     with TestExec() on views in TestMem. Inputs are built on the host (std::vector, a lambda of
//     the indices) and copied over with device_vector / device_matrix; results are read through
//     host mirrors (to_host, bytes_of). No test touches a TestMem view's elements directly.
//   - On a Serial- or OpenMP-only Kokkos TestExec is a host space and the mirrors are the views
//     themselves (no copies); a CUDA build runs the same bodies on the GPU, through cuSOLVER,
//     cuBLAS and the device kernels.
//   - A test where the host is the point (host LAPACK error paths, raw-pointer host APIs, the
//     clock, the timeline, file I/O) uses HostExec / HostMem and says so in its name or a comment.
#pragma once

#include <kdist/core/compat.hpp>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace kdist_test {

using TestExec = Kokkos::DefaultExecutionSpace;
using TestMem = TestExec::memory_space;
using HostExec = Kokkos::DefaultHostExecutionSpace;
using HostMem = Kokkos::HostSpace;

template <class T>
using TestVector = Kokkos::View<T*, TestMem>;
template <class T, class Layout = Kokkos::LayoutLeft>
using TestMatrix = Kokkos::View<T**, Layout, TestMem>;

/// A TestMem vector holding `values`.
template <class T>
TestVector<T> device_vector(const std::string& label, const std::vector<T>& values) {
  TestVector<T> v(label, values.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i) h(i) = values[i];
  Kokkos::deep_copy(v, h);
  return v;
}

/// A rows x cols TestMem matrix with element (i, j) = f(i, j), computed on the host.
template <class T, class Layout = Kokkos::LayoutLeft, class F>
TestMatrix<T, Layout> device_matrix(const std::string& label, int rows, int cols, F f) {
  TestMatrix<T, Layout> m(label, rows, cols);
  auto h = Kokkos::create_mirror_view(m);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) h(i, j) = static_cast<T>(f(i, j));
  Kokkos::deep_copy(m, h);
  return m;
}

/// An n x n TestMem matrix holding the row-major n x n `a` (a reference's dense matrix).
template <class T>
TestMatrix<T> device_square(const std::vector<double>& a, int n, const std::string& label) {
  return device_matrix<T>(label, n, n, [&](int i, int j) { return a[static_cast<std::size_t>(i) * n + j]; });
}

/// A B x C x H x W TestMem tensor (NCHW) holding the row-major flat vector `values`.
template <class T, class Layout = Kokkos::LayoutRight>
Kokkos::View<T****, Layout, TestMem> device_nchw(const std::string& label, int B, int C, int H, int W,
                                                 const std::vector<double>& values) {
  Kokkos::View<T****, Layout, TestMem> v(label, B, C, H, W);
  auto h = Kokkos::create_mirror_view(v);
  std::size_t k = 0;
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c)
      for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) h(b, c, y, x) = static_cast<T>(values.at(k++));
  Kokkos::deep_copy(v, h);
  return v;
}

/// Fills an existing view (any rank-1 or rank-2 view in TestMem, e.g. an unmanaged one) from f.
template <class V, class F>
void fill(const V& v, F f) {
  auto h = Kokkos::create_mirror_view(v);
  if constexpr (kdist::compat::view_rank<V>() == 1) {
    for (std::size_t i = 0; i < v.extent(0); ++i) h(i) = static_cast<typename V::value_type>(f(i));
  } else {
    for (std::size_t i = 0; i < v.extent(0); ++i)
      for (std::size_t j = 0; j < v.extent(1); ++j) h(i, j) = static_cast<typename V::value_type>(f(i, j));
  }
  Kokkos::deep_copy(v, h);
}

/// A host copy of any view, to read results (create_mirror_view + deep_copy).
template <class V>
auto to_host(const V& v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return h;
}

/// A rank-2 or rank-4 view read back as a row-major flat vector of doubles (last index fastest).
template <class V>
std::vector<double> to_flat(const V& v) {
  const auto h = to_host(v);
  std::vector<double> out;
  out.reserve(v.size());
  if constexpr (kdist::compat::view_rank<V>() == 2) {
    for (std::size_t i = 0; i < h.extent(0); ++i)
      for (std::size_t j = 0; j < h.extent(1); ++j) out.push_back(static_cast<double>(h(i, j)));
  } else {
    static_assert(kdist::compat::view_rank<V>() == 4, "kdist_test::to_flat: rank 2 or 4");
    for (std::size_t b = 0; b < h.extent(0); ++b)
      for (std::size_t c = 0; c < h.extent(1); ++c)
        for (std::size_t y = 0; y < h.extent(2); ++y)
          for (std::size_t x = 0; x < h.extent(3); ++x) out.push_back(static_cast<double>(h(b, c, y, x)));
  }
  return out;
}

/// The bytes a view's storage spans, read back to the host: "left byte-identical" checks.
template <class V>
std::vector<unsigned char> bytes_of(const V& v) {
  const std::size_t n = v.span() * sizeof(typename V::value_type);
  Kokkos::View<const unsigned char*, typename V::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>> raw(
      reinterpret_cast<const unsigned char*>(v.data()), n);
  std::vector<unsigned char> out(n);
  Kokkos::View<unsigned char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(out.data(), n);
  Kokkos::deep_copy(host, raw);
  return out;
}

}  // namespace kdist_test
