#include <kdist/adasum/host_kernels.hpp>
#include <kdist/adasum/operator.hpp>
#include <kdist/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define KDIST_ADASUM_AVX2 1
// GCC 12 reports its own AVX-512 intrinsics as maybe used uninitialized once they are inlined here
// (their _mm512_undefined_pd() sources; a false positive). The warning is placed on the header's
// lines, so it is switched off before the include: for this file only, with g++ or under nvcc.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#else
#define KDIST_ADASUM_AVX2 0
#endif

namespace kdist {
namespace adasum {
namespace impl {

namespace {

template <class T>
void apply_scalar(T* out, const T* a, const T* b, std::size_t n, double ca, double cb, T* also) {
  for (std::size_t i = 0; i < n; ++i) {
    const T r = apply_one(ca, a[i], cb, b[i]);
    out[i] = r;
    if (also) also[i] = r;
  }
}

#if KDIST_ADASUM_AVX2
// Four doubles from four elements.
__attribute__((target("avx2"))) inline __m256d load4(const float* p) {
  return _mm256_cvtps_pd(_mm_loadu_ps(p));
}
__attribute__((target("avx2"))) inline __m256d load4(const double* p) {
  return _mm256_loadu_pd(p);
}
__attribute__((target("avx2"))) inline void store4(float* p, __m256d x) {
  _mm_storeu_ps(p, _mm256_cvtpd_ps(x));
}
__attribute__((target("avx2"))) inline void store4(double* p, __m256d x) {
  _mm256_storeu_pd(p, x);
}

// [(d0 + d1) + (d2 + d3), the same of p, of q, 0]: add_block's last combination, in registers
// (a round trip through memory per block cost 10-15 % of the pass).
__attribute__((target("avx2"))) inline __m256d combine_lanes(__m256d d, __m256d p, __m256d q) {
  const __m256d dp = _mm256_hadd_pd(d, p);  // d0 + d1, p0 + p1, d2 + d3, p2 + p3
  const __m256d qq = _mm256_hadd_pd(q, q);  // q0 + q1, q0 + q1, q2 + q3, q2 + q3
  const __m128d sums = _mm_add_pd(_mm256_castpd256_pd128(dp), _mm256_extractf128_pd(dp, 1));
  const __m128d qsum = _mm_add_sd(_mm256_castpd256_pd128(qq), _mm256_extractf128_pd(qq, 1));
  return _mm256_insertf128_pd(_mm256_castpd128_pd256(sums), _mm_move_sd(_mm_setzero_pd(), qsum), 1);
}

// add_block over a block that ends early (the tail goes to lane 0 after lanes j and j + 4 met):
// rare (the last block of a piece), so through memory.
template <class T>
__attribute__((target("avx2,fma"))) void add_tail_block(__m256d d, __m256d p, __m256d q, const T* a, const T* b,
                                                        std::size_t i, std::size_t end, double* v) {
  alignas(32) double dl[4], pl[4], ql[4];
  _mm256_store_pd(dl, d);
  _mm256_store_pd(pl, p);
  _mm256_store_pd(ql, q);
  for (; i < end; ++i) {
    const double x = a[i], y = b[i];
    dl[0] = std::fma(x, y, dl[0]);
    pl[0] = std::fma(x, x, pl[0]);
    ql[0] = std::fma(y, y, ql[0]);
  }
  v[0] += (dl[0] + dl[1]) + (dl[2] + dl[3]);
  v[1] += (pl[0] + pl[1]) + (pl[2] + pl[3]);
  v[2] += (ql[0] + ql[1]) + (ql[2] + ql[3]);
}

// The groups of eight of [i, end) with lanes 0-3 in one vector and lanes 4-7 in another; returns
// lanes j + (j + 4). i advances past the last whole group.
template <class T>
__attribute__((target("avx2,fma"))) inline void groups_avx2(const T* a, const T* b, std::size_t& i, std::size_t end,
                                                            __m256d* dpq) {
  __m256d d = _mm256_setzero_pd(), p = d, q = d, d4 = d, p4 = d, q4 = d;
  for (; i + 8 <= end; i += 8) {
    const __m256d x = load4(a + i), y = load4(b + i), x4 = load4(a + i + 4), y4 = load4(b + i + 4);
    d = _mm256_fmadd_pd(x, y, d);
    p = _mm256_fmadd_pd(x, x, p);
    q = _mm256_fmadd_pd(y, y, q);
    d4 = _mm256_fmadd_pd(x4, y4, d4);
    p4 = _mm256_fmadd_pd(x4, x4, p4);
    q4 = _mm256_fmadd_pd(y4, y4, q4);
  }
  dpq[0] = _mm256_add_pd(d, d4);
  dpq[1] = _mm256_add_pd(p, p4);
  dpq[2] = _mm256_add_pd(q, q4);
}

template <class T>
__attribute__((target("avx2,fma"))) void add_blocks_avx2(const T* a, const T* b, std::size_t begin, std::size_t end,
                                                         double* v) {
  alignas(32) double acc_mem[4] = {v[0], v[1], v[2], 0.0};
  __m256d acc = _mm256_load_pd(acc_mem), dpq[3];
  std::size_t s = begin;
  for (; s + kBlock <= end; s += kBlock) {
    std::size_t i = s;
    groups_avx2(a, b, i, s + kBlock, dpq);
    acc = _mm256_add_pd(acc, combine_lanes(dpq[0], dpq[1], dpq[2]));
  }
  _mm256_store_pd(acc_mem, acc);
  std::copy(acc_mem, acc_mem + 3, v);
  if (s == end) return;
  std::size_t i = s;
  groups_avx2(a, b, i, end, dpq);
  add_tail_block(dpq[0], dpq[1], dpq[2], a, b, i, end, v);
}

template <class T>
__attribute__((target("avx2,fma"))) void apply_avx2(T* out, const T* a, const T* b, std::size_t n, double ca, double cb,
                                                    T* also) {
  const __m256d va = _mm256_set1_pd(ca), vb = _mm256_set1_pd(cb);
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d r = _mm256_fmadd_pd(va, load4(a + i), _mm256_mul_pd(vb, load4(b + i)));
    store4(out + i, r);
    if (also) store4(also + i, r);
  }
  apply_scalar(out + i, a + i, b + i, n - i, ca, cb, also ? also + i : nullptr);
}

// ---- AVX-512: add_block's eight lanes are one vector ------------------------------------------
__attribute__((target("avx512f"))) inline __m512d load8(const float* p) {
  return _mm512_cvtps_pd(_mm256_loadu_ps(p));
}
__attribute__((target("avx512f"))) inline __m512d load8(const double* p) {
  return _mm512_loadu_pd(p);
}
__attribute__((target("avx512f"))) inline void store8(float* p, __m512d x) {
  _mm256_storeu_ps(p, _mm512_cvtpd_ps(x));
}
__attribute__((target("avx512f"))) inline void store8(double* p, __m512d x) {
  _mm512_storeu_pd(p, x);
}
// Lanes j + (j + 4).
__attribute__((target("avx512f"))) inline __m256d fold_lanes(__m512d x) {
  return _mm256_add_pd(_mm512_castpd512_pd256(x), _mm512_extractf64x4_pd(x, 1));
}

template <class T>
__attribute__((target("avx512f,avx2,fma"))) inline void groups_avx512(const T* a, const T* b, std::size_t& i,
                                                                      std::size_t end, __m256d* dpq) {
  __m512d d = _mm512_setzero_pd(), p = d, q = d;
  for (; i + 8 <= end; i += 8) {
    const __m512d x = load8(a + i), y = load8(b + i);
    d = _mm512_fmadd_pd(x, y, d);
    p = _mm512_fmadd_pd(x, x, p);
    q = _mm512_fmadd_pd(y, y, q);
  }
  dpq[0] = fold_lanes(d);
  dpq[1] = fold_lanes(p);
  dpq[2] = fold_lanes(q);
}

// Four blocks' sums of one quantity from their lane vectors, each formed as combine_lanes forms
// it, ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)), but across the four vectors at once:
// seven shuffles for four blocks where one block alone takes about nine. Blocks 0-3 land in
// lanes 0, 4, 1, 5.
__attribute__((target("avx512f"))) inline __m512d block_sums4(__m512d b0, __m512d b1, __m512d b2, __m512d b3) {
  const __m512d s01 = _mm512_add_pd(_mm512_shuffle_f64x2(b0, b1, 0x44), _mm512_shuffle_f64x2(b0, b1, 0xEE));
  const __m512d s23 = _mm512_add_pd(_mm512_shuffle_f64x2(b2, b3, 0x44), _mm512_shuffle_f64x2(b2, b3, 0xEE));
  // [b0 (s0 + s1), b2 (s0 + s1), b0 (s2 + s3), b2 (s2 + s3), then the same of b1, b3]
  const __m512d h = _mm512_add_pd(_mm512_unpacklo_pd(s01, s23), _mm512_unpackhi_pd(s01, s23));
  return _mm512_add_pd(h, _mm512_shuffle_f64x2(h, h, 0xB1));
}

// Four whole blocks from s, their FMA chains interleaved, each block's sums added to v in order.
// In cache the pass is bound by the FMA pipes, which a per-block combination's shuffles share:
// this is 10-18 % faster from L2 and L3. From DRAM it is 15-30 % slower: the interleaved blocks
// are four read streams per array (perf/bench_host_kernels, both columns). Hence Locality.
template <class T>
__attribute__((target("avx512f,avx2,fma"))) inline void four_blocks_avx512(const T* a, const T* b, std::size_t s,
                                                                           double* v) {
  __m512d d[4], p[4], q[4];
  for (int k = 0; k < 4; ++k) d[k] = p[k] = q[k] = _mm512_setzero_pd();
  for (std::size_t i = 0; i < kBlock; i += 8)
    for (int k = 0; k < 4; ++k) {
      const std::size_t o = s + static_cast<std::size_t>(k) * kBlock + i;
      const __m512d x = load8(a + o), y = load8(b + o);
      d[k] = _mm512_fmadd_pd(x, y, d[k]);
      p[k] = _mm512_fmadd_pd(x, x, p[k]);
      q[k] = _mm512_fmadd_pd(y, y, q[k]);
    }
  alignas(64) double sums[3][8];
  _mm512_store_pd(sums[0], block_sums4(d[0], d[1], d[2], d[3]));
  _mm512_store_pd(sums[1], block_sums4(p[0], p[1], p[2], p[3]));
  _mm512_store_pd(sums[2], block_sums4(q[0], q[1], q[2], q[3]));
  for (int j = 0; j < 3; ++j) v[j] = (((v[j] + sums[j][0]) + sums[j][4]) + sums[j][1]) + sums[j][5];
}

template <class T>
__attribute__((target("avx512f,avx2,fma"))) void add_blocks_avx512(const T* a, const T* b, std::size_t begin,
                                                                   std::size_t end, double* v, Locality where) {
  std::size_t s = begin;
  if (where == Locality::cache)
    for (; s + 4 * kBlock <= end; s += 4 * kBlock) four_blocks_avx512(a, b, s, v);
  alignas(32) double acc_mem[4] = {v[0], v[1], v[2], 0.0};
  __m256d acc = _mm256_load_pd(acc_mem), dpq[3];
  for (; s + kBlock <= end; s += kBlock) {
    std::size_t i = s;
    groups_avx512(a, b, i, s + kBlock, dpq);
    acc = _mm256_add_pd(acc, combine_lanes(dpq[0], dpq[1], dpq[2]));
  }
  _mm256_store_pd(acc_mem, acc);
  std::copy(acc_mem, acc_mem + 3, v);
  if (s == end) return;
  std::size_t i = s;
  groups_avx512(a, b, i, end, dpq);
  add_tail_block(dpq[0], dpq[1], dpq[2], a, b, i, end, v);
}

template <class T>
__attribute__((target("avx512f,avx2,fma"))) void apply_avx512(T* out, const T* a, const T* b, std::size_t n, double ca,
                                                              double cb, T* also) {
  const __m512d va = _mm512_set1_pd(ca), vb = _mm512_set1_pd(cb);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d r = _mm512_fmadd_pd(va, load8(a + i), _mm512_mul_pd(vb, load8(b + i)));
    store8(out + i, r);
    if (also) store8(also + i, r);
  }
  apply_scalar(out + i, a + i, b + i, n - i, ca, cb, also ? also + i : nullptr);
}

const bool g_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
const Isa g_isa = g_fma && __builtin_cpu_supports("avx512f") ? Isa::avx512 : g_fma ? Isa::avx2 : Isa::scalar;
#else
const Isa g_isa = Isa::scalar;
#endif

void check_isa(const char* func, Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(g_isa))
    kdist::impl::throw_invalid(
        func, std::string("this CPU does not run ") + to_string(isa) + ", only up to " + to_string(g_isa));
}

}  // namespace

const char* to_string(Isa isa) {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "AVX2";
    case Isa::avx512:
      return "AVX-512";
  }
  return "unknown";
}

Isa host_isa() {
  return g_isa;
}

std::size_t l2_cache_bytes() {
  // Once per process: glibc answers by executing cpuid each call (a trap in a virtual machine).
  static const std::size_t bytes = [] {
    long l2 = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
    l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return l2 > 0 ? static_cast<std::size_t>(l2) : std::size_t(0);
  }();
  return bytes;
}

Locality locality_of(std::size_t input_bytes) {
  const std::size_t l2 = l2_cache_bytes();
  return input_bytes <= (l2 ? l2 : std::size_t(1) << 20) ? Locality::cache : Locality::memory;
}

namespace {

// The kernels of one instruction set the CPU runs (unchecked: the host entry points pass their
// own g_isa; the *_isa ones check a caller's choice first).
template <class T>
void add_blocks_on(Isa isa, const T* a, const T* b, std::size_t begin, std::size_t end, double* v, Locality where) {
#if KDIST_ADASUM_AVX2
  if (isa == Isa::avx512) return add_blocks_avx512(a, b, begin, end, v, where);
  if (isa == Isa::avx2) return add_blocks_avx2(a, b, begin, end, v);
#endif
  for (std::size_t s = begin; s < end; s += kBlock) add_block(a, b, s, std::min(s + kBlock, end), v);
}

template <class T>
void apply_on(Isa isa, T* out, const T* a, const T* b, std::size_t n, double ca, double cb, T* also) {
#if KDIST_ADASUM_AVX2
  if (isa == Isa::avx512) return apply_avx512(out, a, b, n, ca, cb, also);
  if (isa == Isa::avx2) return apply_avx2(out, a, b, n, ca, cb, also);
#endif
  apply_scalar(out, a, b, n, ca, cb, also);
}

}  // namespace

template <class T>
void add_blocks_isa(Isa isa, const T* a, const T* b, std::size_t begin, std::size_t end, double* v, Locality where) {
  check_isa("kdist::adasum::impl::add_blocks_isa", isa);
  add_blocks_on(isa, a, b, begin, end, v, where);
}

template <class T>
void apply_isa(Isa isa, T* out, const T* a, const T* b, std::size_t n, double ca, double cb, T* also) {
  check_isa("kdist::adasum::impl::apply_isa", isa);
  apply_on(isa, out, a, b, n, ca, cb, also);
}

template <class T>
void add_blocks_host(const T* a, const T* b, std::size_t begin, std::size_t end, double* v, Locality where) {
  add_blocks_on(g_isa, a, b, begin, end, v, where);
}

template <class T>
void apply_host(T* out, const T* a, const T* b, std::size_t n, double ca, double cb, T* also) {
  apply_on(g_isa, out, a, b, n, ca, cb, also);
}

template void add_blocks_host<float>(const float*, const float*, std::size_t, std::size_t, double*, Locality);
template void add_blocks_host<double>(const double*, const double*, std::size_t, std::size_t, double*, Locality);
template void apply_host<float>(float*, const float*, const float*, std::size_t, double, double, float*);
template void apply_host<double>(double*, const double*, const double*, std::size_t, double, double, double*);
template void add_blocks_isa<float>(Isa, const float*, const float*, std::size_t, std::size_t, double*, Locality);
template void add_blocks_isa<double>(Isa, const double*, const double*, std::size_t, std::size_t, double*, Locality);
template void apply_isa<float>(Isa, float*, const float*, const float*, std::size_t, double, double, float*);
template void apply_isa<double>(Isa, double*, const double*, const double*, std::size_t, double, double, double*);

}  // namespace impl
}  // namespace adasum
}  // namespace kdist
