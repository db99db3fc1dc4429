// The pairwise Adasum operator on fused buffers (docs/architecture.md §3). For each tensor of a buffer
// (boundaries given as element offsets), with d = a.b, na = a.a, nb = b.b accumulated in double:
//   ca = na >= sqrt(DBL_MIN) ? 1 - d / (2 na) : 1,   cb likewise,   result = ca a + cb b
// computed in double as fma(ca, a, cb b) and rounded once to the storage type. Coefficients are
// per tensor, never per buffer.
//
// The operator is split in two so that the distributed algorithm can sum the partials of a
// tensor over every rank that holds a piece of it before applying them:
//   partials(): [d, na, nb] of each tensor over a slice of the buffer;
//   apply():    ca a + cb b over that slice, from summed partials.
// Both run as Kokkos kernels on the caller's execution space.
#pragma once

#include <kdist/core/impl/entries.hpp>
#include <kdist/core/views.hpp>

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace kdist {
namespace adasum {

/// Values per tensor in a partials array: dot, squared norm of a, squared norm of b.
constexpr int kPartials = 3;

/// Adasum coefficient of one side from the summed partials.
inline double coefficient(double dot, double norm_sq) {
  static const double guard = std::sqrt(DBL_MIN);
  return norm_sq >= guard ? 1.0 - dot / (2.0 * norm_sq) : 1.0;
}

namespace impl {

/// Width of the blocks the host forms partial sums in (elements, counted from the start of each
/// tensor's piece); the blocks' sums are added to the total in block order.
constexpr std::size_t kBlock = 64;

/// v[0..2] += [a.b, a.a, b.b] over elements [begin, end) (at most kBlock), in double by fused
/// multiply-add (one rounding per element, as an FMA unit computes it): element j of each group
/// of eight goes to lane j; lanes j and j + 4 are then added, the tail after the last group goes
/// to that sum's lane 0 in order, and the four are combined as (s0 + s1) + (s2 + s3). Eight lanes
/// are two AVX2 vectors per sum (host_kernels.cpp), so each sum has two independent chains of
/// fused adds; the fixed order keeps the result deterministic on every path.
/// Raw pointers (host or device). ::fma: exact on every path; a call into libm on a host build
/// without FMA code, which is why the host runs host_kernels' add_blocks_host instead.
template <class T>
KOKKOS_INLINE_FUNCTION void add_block(const T* a, const T* b, std::size_t begin, std::size_t end, double* v) {
  double d[8] = {}, p[8] = {}, q[8] = {};
  std::size_t i = begin;
  for (; i + 8 <= end; i += 8)
    for (int j = 0; j < 8; ++j) {
      const double x = a[i + j], y = b[i + j];
      d[j] = ::fma(x, y, d[j]);
      p[j] = ::fma(x, x, p[j]);
      q[j] = ::fma(y, y, q[j]);
    }
  for (int j = 0; j < 4; ++j) d[j] += d[j + 4], p[j] += p[j + 4], q[j] += q[j + 4];
  for (; i < end; ++i) {
    const double x = a[i], y = b[i];
    d[0] = ::fma(x, y, d[0]);
    p[0] = ::fma(x, x, p[0]);
    q[0] = ::fma(y, y, q[0]);
  }
  v[0] += (d[0] + d[1]) + (d[2] + d[3]);
  v[1] += (p[0] + p[1]) + (p[2] + p[3]);
  v[2] += (q[0] + q[1]) + (q[2] + q[3]);
}

/// ca a + cb b in double, rounded once to T: fma(ca, a, cb b) on every path.
template <class T>
KOKKOS_INLINE_FUNCTION T apply_one(double ca, T a, double cb, T b) {
  return static_cast<T>(::fma(ca, static_cast<double>(a), cb * static_cast<double>(b)));
}

/// The reduction both forms of the partial sums share: [a.b, a.a, b.b], joined by adding.
struct PartialsReducer {
  using value_type = double[];
  using size_type = std::size_t;
  const size_type value_count = kPartials;
  KOKKOS_INLINE_FUNCTION void init(value_type v) const { v[0] = v[1] = v[2] = 0.0; }
  KOKKOS_INLINE_FUNCTION void join(value_type dst, const value_type src) const {
    for (int k = 0; k < kPartials; ++k) dst[k] += src[k];
  }
  KOKKOS_INLINE_FUNCTION void join(volatile value_type dst, const volatile value_type src) const {
    for (int k = 0; k < kPartials; ++k) dst[k] += src[k];
  }
};

/// Partial sums of one piece as a Kokkos reduction over its kBlock-element blocks (host spaces:
/// a serial space adds the blocks in order, the host kernels' bits).
template <class T>
struct PartialSums : PartialsReducer {
  const T* a;
  const T* b;
  std::size_t n;
  PartialSums(const T* pa, const T* pb, std::size_t len) : a(pa), b(pb), n(len) {}
  std::size_t items() const { return (n + kBlock - 1) / kBlock; }
  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t c, value_type v) const {
    const std::size_t begin = c * kBlock, end = begin + kBlock < n ? begin + kBlock : n;
    add_block(a, b, begin, end, v);
  }
};

/// The device form: thread t sums elements t + r m (r < copies_per_thread, m the thread count),
/// all loaded before the first multiply-add, so each of a warp's loads is to neighbouring
/// elements (a block of kBlock a thread puts them kBlock elements apart) and a thread keeps
/// several in flight; its sums run in registers and reach the reduction's value once. The
/// threads' sums are joined in Kokkos' reduction order: deterministic for a launch, not the
/// blocks' bits.
template <class T>
struct StridedPartialSums : PartialsReducer {
  static constexpr int per_thread = kdist::impl::copies_per_thread;
  const T* a;
  const T* b;
  std::size_t n, threads;
  StridedPartialSums(const T* pa, const T* pb, std::size_t len)
      : a(pa), b(pb), n(len), threads((len + per_thread - 1) / per_thread) {}
  std::size_t items() const { return threads; }
  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t t, value_type v) const {
    double x[per_thread] = {}, y[per_thread] = {};
    for (int r = 0; r < per_thread; ++r)
      if (t + r * threads < n) {
        x[r] = a[t + r * threads];
        y[r] = b[t + r * threads];
      }
    double dot = 0, aa = 0, bb = 0;
    for (int r = 0; r < per_thread; ++r)
      if (t + r * threads < n) {
        dot = ::fma(x[r], y[r], dot);
        aa = ::fma(x[r], x[r], aa);
        bb = ::fma(y[r], y[r], bb);
      }
    v[0] += dot;
    v[1] += aa;
    v[2] += bb;
  }
};

/// out[0..2] := the partial sums of a, b over [0, n) with `Sums`' form of the reduction. out is
/// host memory: the call returns with the sums.
template <class Sums, class ExecSpace, class T>
void reduce_partials(const ExecSpace& exec, const T* a, const T* b, std::size_t n, double* out) {
  const Sums f(a, b, n);
  // An array-valued reduction lands in a View of its length: Kokkos 4.0 removed the raw
  // pointer result (3.4 accepts both).
  const Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> result(out, kPartials);
  Kokkos::parallel_reduce("kdist::adasum::partials", Kokkos::RangePolicy<ExecSpace>(exec, 0, f.items()), f, result);
}

/// partials' device body for one piece: StridedPartialSums.
template <class ExecSpace, class T>
void partials_strided(const ExecSpace& exec, const T* a, const T* b, std::size_t n, double* out) {
  reduce_partials<StridedPartialSums<T>>(exec, a, b, n, out);
}

/// Tensor t's part of the slice [begin, begin + len) of the global buffer, relative to begin.
inline bool overlap(const std::vector<std::size_t>& bounds, std::size_t t, std::size_t begin, std::size_t len,
                    std::size_t* lo, std::size_t* hi) {
  const std::size_t s = bounds[t] > begin ? bounds[t] : begin;
  const std::size_t e = bounds[t + 1] < begin + len ? bounds[t + 1] : begin + len;
  if (s >= e) return false;
  *lo = s - begin;
  *hi = e - begin;
  return true;
}

/// Checks that bounds are offsets 0 = b_0 <= b_1 <= ... = n.
void check_bounds(const char* func, const std::vector<std::size_t>& bounds, std::size_t n);

/// apply's kernel on a device space, out[i] := ca a[i] + cb b[i] for i in [lo, hi): a few elements
/// a thread, all loaded before any is stored (for_copies). out may alias a or b: one thread reads
/// and writes each element.
template <class ExecSpace, class T>
void apply_entries(const ExecSpace& exec, T* out, const T* a, const T* b, std::size_t lo, std::size_t hi, double ca,
                   double cb) {
  kdist::impl::for_copies(
      "kdist::adasum::apply", exec, static_cast<std::int64_t>(hi - lo),
      KOKKOS_LAMBDA(const std::int64_t e) { return lo + static_cast<std::size_t>(e); },
      KOKKOS_LAMBDA(const std::size_t i)->T { return apply_one(ca, a[i], cb, b[i]); },
      KOKKOS_LAMBDA(const std::size_t i, const T v) { out[i] = v; });
}

}  // namespace impl

/// partials[3t + k] := [a.b, a.a, b.b] of tensor t over the slice [begin, begin + len) of the
/// global buffer that a and b (host or device pointers of `len` elements) hold. Tensors not in
/// the slice get zeros. `partials` is host memory of 3 * tensors doubles. If given,
/// nonfinite_a[t] / nonfinite_b[t] are set when tensor t's piece of a / b holds a NaN or Inf:
/// exactly when its squared norm sum is not finite (it cannot overflow for float storage; for
/// double storage, magnitudes above ~1e154, where the coefficients overflow too, also count).
/// Host spaces sum in kBlock-element blocks, device spaces a few strided elements a thread
/// (impl::StridedPartialSums): the same sums up to rounding, not the same bits.
template <class ExecSpace, class T>
void partials(const ExecSpace& exec, const T* a, const T* b, std::size_t begin, std::size_t len,
              const std::vector<std::size_t>& bounds, double* partials, std::vector<char>* nonfinite_a = nullptr,
              std::vector<char>* nonfinite_b = nullptr) {
  const std::size_t tensors = bounds.size() - 1;
  if (nonfinite_a) nonfinite_a->assign(tensors, 0);
  if (nonfinite_b) nonfinite_b->assign(tensors, 0);
  for (std::size_t t = 0; t < tensors; ++t) {
    double* out = partials + kPartials * t;
    out[0] = out[1] = out[2] = 0.0;
    std::size_t lo = 0, hi = 0;
    if (!impl::overlap(bounds, t, begin, len, &lo, &hi)) continue;
    if constexpr (!kdist::impl::runs_on_host<ExecSpace>())
      impl::partials_strided(exec, a + lo, b + lo, hi - lo, out);
    else
      impl::reduce_partials<impl::PartialSums<T>>(exec, a + lo, b + lo, hi - lo, out);
    if (nonfinite_a) (*nonfinite_a)[t] = !std::isfinite(out[1]);
    if (nonfinite_b) (*nonfinite_b)[t] = !std::isfinite(out[2]);
  }
}

/// out := ca a + cb b over the slice, coefficients from the summed partials of each tensor.
/// `out` may alias a or b.
template <class ExecSpace, class T>
void apply(const ExecSpace& exec, T* out, const T* a, const T* b, std::size_t begin, std::size_t len,
           const std::vector<std::size_t>& bounds, const double* summed) {
  const std::size_t tensors = bounds.size() - 1;
  for (std::size_t t = 0; t < tensors; ++t) {
    std::size_t lo = 0, hi = 0;
    if (!impl::overlap(bounds, t, begin, len, &lo, &hi)) continue;
    const double* p = summed + kPartials * t;
    const double ca = coefficient(p[0], p[1]), cb = coefficient(p[0], p[2]);
    if constexpr (!kdist::impl::runs_on_host<ExecSpace>()) {
      impl::apply_entries(exec, out, a, b, lo, hi, ca, cb);
    } else {
      Kokkos::parallel_for(
          "kdist::adasum::apply", Kokkos::RangePolicy<ExecSpace>(exec, lo, hi),
          KOKKOS_LAMBDA(const std::size_t i) { out[i] = impl::apply_one(ca, a[i], cb, b[i]); });
    }
  }
  compat::fence(exec, "kdist::adasum::apply");
}

/// a := Adasum(a, b), tensor by tensor, for two whole fused buffers (rank-1 views).
template <class ExecSpace, class VA, class VB>
void combine(const ExecSpace& exec, const VA& a, const VB& b, const std::vector<std::size_t>& bounds) {
  kdist::impl::static_check_view<ExecSpace, VA>();
  kdist::impl::static_check_view<ExecSpace, VB>();
  static_assert(compat::view_rank<VA>() == 1 && compat::view_rank<VB>() == 1, "kdist::adasum: rank-1 views");
  static_assert(std::is_same<typename VA::non_const_value_type, typename VB::non_const_value_type>::value,
                "kdist::adasum: value types differ");
  if (a.extent(0) != b.extent(0))
    kdist::impl::throw_invalid("kdist::adasum::combine", "buffers " + kdist::impl::describe(a) + " and " +
                                                             kdist::impl::describe(b) + " differ in size");
  impl::check_bounds("kdist::adasum::combine", bounds, a.extent(0));
  std::vector<double> sums(kPartials * (bounds.size() - 1));
  partials(exec, a.data(), b.data(), 0, a.extent(0), bounds, sums.data());
  apply(exec, a.data(), a.data(), b.data(), 0, a.extent(0), bounds, sums.data());
}

}  // namespace adasum
}  // namespace kdist
