// The two passes of the Adasum all-reduce over host memory, vectorised for the CPU they run on:
// AVX-512 where the CPU has it, else AVX2 with FMA, else the scalar kernels of operator.hpp
// (checked at run time, so the binary stays portable). Each lane does the same fused
// multiply-adds, multiplies and adds in the same order as the scalar code (add_block's eight
// lanes are one AVX-512 vector or two AVX2 ones), so every path gives the same bits, and ranks on
// different CPUs (and a GPU, which fuses natively) still agree. The arithmetic, not memory,
// bounded these passes on two cores: 1 MiB of float pairs in L2 took 25 us for the partial sums
// with four unfused lanes and 18 us with eight fused AVX2 ones, against 10 us for a plain read
// (the FMA ports were the limit), which is why a CPU with 512-bit FMA units gets its own path.
// The scalar fallback's ::fma is a libm call on x86 builds without FMA code: exact, but slower.
#pragma once

#include <cstddef>

namespace kdist {
namespace adasum {
namespace impl {

/// v[0..2] += [a.b, a.a, b.b] over [begin, end), block by block (kBlock elements from begin),
/// each block as add_block sums it, the blocks added in order.
template <class T>
void add_blocks_host(const T* a, const T* b, std::size_t begin, std::size_t end, double* v);

/// out[i] := ca a[i] + cb b[i] in double, rounded once to T, for i < n, and also[i] := the same
/// when also is not null (one pass writing two places; out and also may alias a or b).
template <class T>
void apply_host(T* out, const T* a, const T* b, std::size_t n, double ca, double cb, T* also = nullptr);

/// The instruction sets the kernels above can use, widest last.
enum class Isa { scalar, avx2, avx512 };
const char* to_string(Isa isa);
/// The widest one this CPU runs (the one add_blocks_host and apply_host use).
Isa host_isa();
/// The same kernels on a chosen instruction set (for tests comparing paths); isa <= host_isa().
template <class T>
void add_blocks_isa(Isa isa, const T* a, const T* b, std::size_t begin, std::size_t end, double* v);
template <class T>
void apply_isa(Isa isa, T* out, const T* a, const T* b, std::size_t n, double ca, double cb, T* also = nullptr);

}  // namespace impl
}  // namespace adasum
}  // namespace kdist
