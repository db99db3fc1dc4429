// kdist::Conv2dGeometry: the shape of a 2-D convolution as im2col, col2im (kdist/core/im2col.hpp),
// nn::Conv2d and the K-FAC factors of a Conv2d layer take it.
//
//   Conv2dGeometry{batch, channels, height, width, kernel_h, kernel_w, stride, padding}: one
//     stride and one padding for both dimensions; out_h(), out_w(), patch() (channels·kh·kw) and
//     rows() (batch·out_h·out_w) are plain arithmetic, meaningful once valid.
//   validate(func, context) throws InvalidArgument naming every size (and the caller's context)
//     unless all are positive (padding >= 0), the kernel fits the padded input and the index
//     ranges the kernels use fit an int.
#pragma once

#include <kdist/core/error.hpp>

#include <Kokkos_Core.hpp>
#include <climits>
#include <string>

namespace kdist {

struct Conv2dGeometry {
  int batch, channels, height, width, kernel_h, kernel_w, stride, padding;

  KOKKOS_INLINE_FUNCTION int out_h() const { return (height + 2 * padding - kernel_h) / stride + 1; }
  KOKKOS_INLINE_FUNCTION int out_w() const { return (width + 2 * padding - kernel_w) / stride + 1; }
  /// Columns of the patch matrix: channels * kernel_h * kernel_w.
  KOKKOS_INLINE_FUNCTION int patch() const { return channels * kernel_h * kernel_w; }
  /// Rows of the patch matrix: batch * out_h * out_w.
  KOKKOS_INLINE_FUNCTION int rows() const { return batch * out_h() * out_w(); }

  /// "batch 2, channels 3, input 5x5, kernel 3x2, stride 1, padding 0".
  std::string describe() const {
    return "batch " + std::to_string(batch) + ", channels " + std::to_string(channels) + ", input " +
           std::to_string(height) + "x" + std::to_string(width) + ", kernel " + std::to_string(kernel_h) + "x" +
           std::to_string(kernel_w) + ", stride " + std::to_string(stride) + ", padding " + std::to_string(padding);
  }

  /// Throws InvalidArgument("<func>: ... <sizes><context>") unless the geometry is usable.
  void validate(const char* func, const std::string& context = "") const {
    if (batch < 1 || channels < 1 || height < 1 || width < 1 || kernel_h < 1 || kernel_w < 1 || stride < 1 ||
        padding < 0)
      impl::throw_invalid(func, "sizes must be positive and padding >= 0, got " + describe() + context);
    if (height + 2 * static_cast<long long>(padding) < kernel_h ||
        width + 2 * static_cast<long long>(padding) < kernel_w)
      impl::throw_invalid(func, "the kernel does not fit the padded input: " + describe() + context);
    // Kernels index rows, patch columns and input elements with int; out_h() and out_w() add the
    // padding in int.
    if (height + 2 * static_cast<long long>(padding) > INT_MAX || width + 2 * static_cast<long long>(padding) > INT_MAX)
      impl::throw_invalid(func, "the padded input exceeds int: " + describe() + context);
    const long long rows_ll = static_cast<long long>(batch) * out_h() * out_w();
    const long long input_ll = static_cast<long long>(batch) * channels * height * width;
    const long long patch_ll = static_cast<long long>(channels) * kernel_h * kernel_w;
    // The device im2col runs one team per (patch column, image).
    if (rows_ll > INT_MAX || input_ll > INT_MAX || patch_ll > INT_MAX || patch_ll * batch > INT_MAX)
      impl::throw_invalid(func, "index range exceeds int: " + describe() + context);
  }
};

}  // namespace kdist
