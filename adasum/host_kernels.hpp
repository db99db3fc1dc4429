// The two passes of the Adasum all-reduce over host memory, vectorised for the CPU they run on:
// AVX-512 where the CPU has it, else AVX2 with FMA, else the scalar kernels of operator.hpp
// (checked at run time, so the binary stays portable). Each lane does the same fused
// multiply-adds, multiplies and adds in the same order as the scalar code (add_block's eight
// lanes are one AVX-512 vector or two AVX2 ones), so every path gives the same bits, and ranks on
// different CPUs still agree (the all-reduce runs these on host memory, device buffers staged). The arithmetic, not memory,
// bounds the partial sums: for 128 Ki float pairs in L2 a plain read takes 9-11 us, and the
// partial sums took 25 us with four unfused lanes, 18-21 us with eight fused AVX2 ones, 13-15 us
// in AVX-512 on a Zen 5 core (perf/bench_host_kernels measures each path against the read). The
// conversions and three FMAs per pair alone run at read speed; the rest is each block's
// combination (shuffles and adds that share the FMA pipes), which the fixed order requires. A
// block's lanes and the running total are combined in registers. The scalar fallback's ::fma is
// a libm call on x86 builds without FMA code: exact, but slower.
#pragma once

#include <cstddef>

namespace kdist {
namespace adasum {
namespace impl {

/// Where a pass expects its inputs: `cache` lets the AVX-512 partial sums interleave four blocks
/// (faster from L2 and L3, slower from DRAM, where that makes four read streams per array),
/// `memory` keeps one block at a time. The bits are the same either way.
enum class Locality { memory, cache };
/// This core's L2 cache in bytes (sysconf, asked once); 0 when unknown.
std::size_t l2_cache_bytes();
/// `cache` for a pass whose inputs total at most the L2 size (1 MiB when unknown), else `memory`.
Locality locality_of(std::size_t input_bytes);

/// v[0..2] += [a.b, a.a, b.b] over [begin, end), block by block (kBlock elements from begin),
/// each block as add_block sums it, the blocks added in order.
template <class T>
void add_blocks_host(const T* a, const T* b, std::size_t begin, std::size_t end, double* v,
                     Locality where = Locality::memory);

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
void add_blocks_isa(Isa isa, const T* a, const T* b, std::size_t begin, std::size_t end, double* v,
                    Locality where = Locality::memory);
template <class T>
void apply_isa(Isa isa, T* out, const T* a, const T* b, std::size_t n, double ca, double cb, T* also = nullptr);

}  // namespace impl
}  // namespace adasum
}  // namespace kdist
