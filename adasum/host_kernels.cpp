#include <kdist/adasum/host_kernels.hpp>
#include <kdist/adasum/operator.hpp>

#include <algorithm>
#include <cmath>

#if defined(__x86_64__) && defined(__GNUC__)
#define KDIST_ADASUM_AVX2 1
#include <immintrin.h>
#else
#define KDIST_ADASUM_AVX2 0
#endif

namespace kdist {
namespace adasum {
namespace impl {

namespace {

template <class T>
void apply_scalar(T* out, const T* a, const T* b, std::size_t n, double ca, double cb) {
  for (std::size_t i = 0; i < n; ++i) out[i] = apply_one(ca, a[i], cb, b[i]);
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

// add_block with lanes 0-3 of each group of eight in one vector and lanes 4-7 in another.
template <class T>
__attribute__((target("avx2,fma"))) void add_block_avx2(const T* a, const T* b, std::size_t begin, std::size_t end,
                                                        double* v) {
  __m256d d = _mm256_setzero_pd(), p = d, q = d, d4 = d, p4 = d, q4 = d;
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256d x = load4(a + i), y = load4(b + i), x4 = load4(a + i + 4), y4 = load4(b + i + 4);
    d = _mm256_fmadd_pd(x, y, d);
    p = _mm256_fmadd_pd(x, x, p);
    q = _mm256_fmadd_pd(y, y, q);
    d4 = _mm256_fmadd_pd(x4, y4, d4);
    p4 = _mm256_fmadd_pd(x4, x4, p4);
    q4 = _mm256_fmadd_pd(y4, y4, q4);
  }
  alignas(32) double dl[4], pl[4], ql[4];
  _mm256_store_pd(dl, _mm256_add_pd(d, d4));
  _mm256_store_pd(pl, _mm256_add_pd(p, p4));
  _mm256_store_pd(ql, _mm256_add_pd(q, q4));
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

template <class T>
__attribute__((target("avx2,fma"))) void add_blocks_avx2(const T* a, const T* b, std::size_t begin, std::size_t end,
                                                         double* v) {
  for (std::size_t s = begin; s < end; s += kBlock) add_block_avx2(a, b, s, std::min(s + kBlock, end), v);
}

template <class T>
__attribute__((target("avx2,fma"))) void apply_avx2(T* out, const T* a, const T* b, std::size_t n, double ca,
                                                    double cb) {
  const __m256d va = _mm256_set1_pd(ca), vb = _mm256_set1_pd(cb);
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) store4(out + i, _mm256_fmadd_pd(va, load4(a + i), _mm256_mul_pd(vb, load4(b + i))));
  apply_scalar(out + i, a + i, b + i, n - i, ca, cb);
}

const bool g_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif

}  // namespace

bool host_kernels_vectorised() {
#if KDIST_ADASUM_AVX2
  return g_avx2;
#else
  return false;
#endif
}

template <class T>
void add_blocks_host(const T* a, const T* b, std::size_t begin, std::size_t end, double* v) {
#if KDIST_ADASUM_AVX2
  if (g_avx2) return add_blocks_avx2(a, b, begin, end, v);
#endif
  for (std::size_t s = begin; s < end; s += kBlock) add_block(a, b, s, std::min(s + kBlock, end), v);
}

template <class T>
void apply_host(T* out, const T* a, const T* b, std::size_t n, double ca, double cb) {
#if KDIST_ADASUM_AVX2
  if (g_avx2) return apply_avx2(out, a, b, n, ca, cb);
#endif
  apply_scalar(out, a, b, n, ca, cb);
}

template void add_blocks_host<float>(const float*, const float*, std::size_t, std::size_t, double*);
template void add_blocks_host<double>(const double*, const double*, std::size_t, std::size_t, double*);
template void apply_host<float>(float*, const float*, const float*, std::size_t, double, double);
template void apply_host<double>(double*, const double*, const double*, std::size_t, double, double);

}  // namespace impl
}  // namespace adasum
}  // namespace kdist
