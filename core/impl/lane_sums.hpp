// A sum of many values on one host thread, in eight running sums: element k of each run goes to
// sum k mod 8, and total() adds the eight as a balanced tree. One running sum would chain every
// addition on the one before (the compiler may not reorder floating-point additions); eight
// independent ones let the loop vectorise. The order of the additions is fixed by the runs
// given, so the same runs give the same bits.
//
// Used by the kernels that sum long columns on the host: a convolution's bias gradient
// (nn/conv2d.hpp) and the bias row of factor A by shifts (kfac/impl/conv_shifts.hpp). Device
// kernels sum with a team per sum instead (core/impl/entries.hpp, for_team_sums).
#pragma once

#include <Kokkos_Core.hpp>

namespace kdist {
namespace impl {

template <class T>
struct LaneSums {
  static constexpr int lanes = 8;
  T lane[lanes] = {};

  /// Adds x[0], ..., x[n - 1], x[r] to sum r mod 8.
  KOKKOS_INLINE_FUNCTION void add(const T* x, int n) {
    int r = 0;
    for (; r + lanes <= n; r += lanes)
      for (int k = 0; k < lanes; ++k) lane[k] += x[r + k];
    for (int k = 0; r + k < n; ++k) lane[k] += x[r + k];
  }

  KOKKOS_INLINE_FUNCTION T total() const {
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
};

}  // namespace impl
}  // namespace kdist
