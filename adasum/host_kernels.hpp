// The two passes of the Adasum all-reduce over host memory, vectorised for the CPU they run on:
// AVX2 with FMA when the CPU has both (checked at run time, so the binary stays portable), else
// the scalar kernels of operator.hpp. Each lane does the same fused multiply-adds, multiplies and
// adds in the same order as the scalar code, so every path gives the same bits, and ranks on
// different CPUs (and a GPU, which fuses natively) still agree. On two cores the arithmetic, not
// memory, bounded these passes: 1 MiB of float pairs in L2 took 25 us for the partial sums with
// four unfused lanes and 18 us with eight fused ones, against 10 us for a plain read of them (the
// adds' ports were the limit). The scalar fallback's ::fma is a libm call on x86 builds without
// FMA code: exact, but slower.
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
