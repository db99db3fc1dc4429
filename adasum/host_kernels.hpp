// The two passes of the Adasum all-reduce over host memory, vectorised for the CPU they run on:
// AVX2 when the CPU has it (checked at run time, so the binary stays portable), else the scalar
// kernels of operator.hpp. Each lane does the same multiplies and adds in the same order as the
// scalar code (no fused multiply-add), so every path gives the same bits, and ranks on different
// CPUs still agree. On two cores the scalar loops, not memory, bounded these passes (about 1 ns
// per element pair for the partial sums).
#pragma once

#include <cstddef>

namespace kdist {
namespace adasum {
namespace impl {

/// v[0..2] += [a.b, a.a, b.b] over [begin, end), block by block (kBlock elements from begin),
/// each block as add_block sums it, the blocks added in order.
template <class T>
void add_blocks_host(const T* a, const T* b, std::size_t begin, std::size_t end, double* v);

/// out[i] := ca a[i] + cb b[i] in double, rounded once to T, for i < n (out may alias a or b).
template <class T>
void apply_host(T* out, const T* a, const T* b, std::size_t n, double ca, double cb);

/// True when the AVX2 kernels run on this CPU.
bool host_kernels_vectorised();

}  // namespace impl
}  // namespace adasum
}  // namespace kdist
