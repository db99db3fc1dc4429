// im2col / col2im and the NCHW <-> rows layout change: what a convolution, its backward pass and
// the K-FAC factors of a Conv2d layer need to treat the convolution as one matrix product.
//
// Contract (all kernels run on the caller's execution-space instance, asynchronously):
//   Conv2dGeometry{batch, channels, height, width, kernel_h, kernel_w, stride, padding}: one
//     stride and one padding for both dimensions. validate(func, context) throws InvalidArgument
//     naming every size (and the caller's context) unless all are positive (padding >= 0), the kernel fits the padded
//     input and the index ranges fit an int; the accessors are plain arithmetic, meaningful once valid.
//   im2col(exec, g, x, patches): x is NCHW (batch, channels, height, width), patches is
//     rows() x patch(); patches(r, k) with r = (b*out_h + i)*out_w + j and
//     k = (c*kernel_h + p)*kernel_w + q (PyTorch's weight.view(c_out, -1) order) holds
//     x(b, c, i*stride - padding + p, j*stride - padding + q), zero outside the input.
//   col2im(exec, g, patches, dx): the adjoint, <im2col(x), P> = <x, col2im(P)>: dx (NCHW) is
//     overwritten with the sum of every patch entry that im2col read from that element.
//   nchw_to_rows(exec, y, rows) / rows_to_nchw(exec, rows, y): y is (B, C, H, W), rows is
//     (B*H*W) x C with rows((b*H + h)*W + w, c) = y(b, c, h, w); one is the inverse of the other.
// The patch matrix may have any layout; a LayoutLeft one (each column contiguous over the rows)
// takes kernels that run along input rows and is what a column-major gemm or syrk reads in place.
// On a device space (CUDA) im2col runs a team per patch column and image for a LayoutLeft patch
// matrix, one thread per entry otherwise; col2im gathers over dx's rows; the NCHW <-> rows copies
// run a few elements a thread, w fastest.
// Views: any layout (indexed through operator()), rank and value type checked at compile time;
// extents and overlap of input and output checked first: InvalidArgument naming the function,
// the view's label and extents and the expected ones, nothing written.
#pragma once

#include <kdist/core/impl/entries.hpp>
#include <kdist/core/views.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

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

namespace impl {

template <class ExecSpace, class NV, class PV>
void check_im2col(const char* func, const Conv2dGeometry& g, const NV& nchw, const PV& patches) {
  static_check_view<ExecSpace, NV>();
  static_check_view<ExecSpace, PV>();
  static_assert(compat::view_rank<NV>() == 4, "kdist: the NCHW tensor must be rank 4");
  static_assert(compat::view_rank<PV>() == 2, "kdist: the patch matrix must be rank 2");
  static_assert(std::is_same<typename NV::non_const_value_type, typename PV::non_const_value_type>::value,
                "kdist: NCHW tensor and patch matrix value types differ");
  g.validate(func);
  const std::string geometry = "for " + g.describe();
  require_extents(func, nchw,
                  {std::size_t(g.batch), std::size_t(g.channels), std::size_t(g.height), std::size_t(g.width)},
                  "(batch x channels x height x width) " + geometry);
  require_extents(func, patches, {std::size_t(g.rows()), std::size_t(g.patch())},
                  "(batch*out_h*out_w x channels*kernel_h*kernel_w) " + geometry);
  require_disjoint(func, nchw, patches);
}

/// f(b, c, h, w) along a row, for for_each_nchw's host form (for_rows_nchw's work items). On
/// Kokkos 3.4 Serial a rank-4 MDRangePolicy's per-element tiling cost several times what these
/// kernels compute.
template <class F>
struct AlongRow {
  F f;
  int W;
  KOKKOS_INLINE_FUNCTION void operator()(const int b, const int c, const int h) const {
    for (int w = 0; w < W; ++w) f(b, c, h, w);
  }
};
/// An element of a B x C x H x W box, and the one numbered e in NCHW order (w fastest).
struct NchwPlace {
  int b = 0, c = 0, h = 0, w = 0;
};
struct NchwWhere {
  int C, H, W;
  KOKKOS_INLINE_FUNCTION NchwPlace operator()(const std::int64_t e) const {
    const std::int64_t row = e / W;
    NchwPlace p;
    p.b = static_cast<int>(row / (H * C));
    p.c = static_cast<int>((row / H) % C);
    p.h = static_cast<int>(row % H);
    p.w = static_cast<int>(e % W);
    return p;
  }
};
/// Calls f(b, c, h, w) once per element, one thread each, w fastest (for device spaces, where a
/// thread per row would leave neighbouring threads a row apart in memory).
template <class F>
struct NchwEntries {
  F f;
  int C, H, W;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t t) const {
    const NchwPlace p = NchwWhere{C, H, W}(t);
    f(p.b, p.c, p.h, p.w);
  }
};
/// store(p, load(p)) for every element p of a B x C x H x W box, a few per thread (for_copies),
/// w fastest: the device form of a copy between an NCHW tensor and another layout.
template <class ExecSpace, class Load, class Store>
void copy_over_nchw(const char* name, const ExecSpace& exec, int B, int C, int H, int W, const Load& load,
                    const Store& store) {
  for_copies(name, exec, static_cast<std::int64_t>(B) * C * H * W, NchwWhere{C, H, W}, load, store);
}

/// B * C * H, the rows the row kernels index with int; InvalidArgument naming `name` beyond it
/// (an output tensor's rows are not bounded by Conv2dGeometry::validate, which sees the input).
inline int nchw_row_count(const char* name, int B, int C, int H) {
  const long long rows = static_cast<long long>(B) * C * H;
  if (rows > INT_MAX)
    throw_invalid(name, std::to_string(B) + " x " + std::to_string(C) + " x " + std::to_string(H) +
                            " rows (batch x channels x height) exceed int");
  return static_cast<int>(rows);
}
template <class ExecSpace, class F>
void for_each_nchw_entry(const char* name, const ExecSpace& exec, int B, int C, int H, int W, const F& f) {
  const std::int64_t n = static_cast<std::int64_t>(B) * C * H * W;
  Kokkos::parallel_for(name, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
                       NchwEntries<F>{f, C, H, W});
}
/// Whether B x C planes give every thread of `exec` work: host row kernels then take a plane a
/// work item (one division; a work item per row paid three, as much as a short row's work).
template <class ExecSpace>
bool planes_suffice(const ExecSpace& exec, int B, int C) {
  return runs_on_host<ExecSpace>() && static_cast<long long>(B) * C >= exec.concurrency();
}

/// Calls f(b, c, h) once per row of a B x C x H box (the caller loops along w itself): a work
/// item per (b, c) plane, its rows in turn, where planes_suffice, else a row a work item (a
/// device's threads, or a host with more threads than planes).
template <class F>
struct NchwPlaneRowItems {
  F f;
  int C, H;
  KOKKOS_INLINE_FUNCTION void operator()(const int t) const {
    const int b = t / C, c = t - b * C;
    for (int h = 0; h < H; ++h) f(b, c, h);
  }
};
template <class F>
struct NchwRowItems {
  F f;
  int C, H;
  KOKKOS_INLINE_FUNCTION void operator()(const int t) const {
    const int bc = t / H, h = t - bc * H, b = bc / C;
    f(b, bc - b * C, h);
  }
};
template <class ExecSpace, class F>
void for_rows_nchw(const char* name, const ExecSpace& exec, int B, int C, int H, const F& f) {
  using Policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int>>;
  const int rows = nchw_row_count(name, B, C, H);
  if constexpr (runs_on_host<ExecSpace>()) {
    if (planes_suffice(exec, B, C)) {
      Kokkos::parallel_for(name, Policy(exec, 0, B * C), NchwPlaneRowItems<F>{f, C, H});
      return;
    }
  }
  Kokkos::parallel_for(name, Policy(exec, 0, rows), NchwRowItems<F>{f, C, H});
}

/// Calls f(b, c, h, w) once per element: along rows on host spaces (for_rows_nchw), by elements
/// on device ones.
template <class ExecSpace, class F>
void for_each_nchw(const char* name, const ExecSpace& exec, int B, int C, int H, int W, const F& f) {
  if constexpr (!runs_on_host<ExecSpace>())
    for_each_nchw_entry(name, exec, B, C, H, W, f);
  else
    for_rows_nchw(name, exec, B, C, H, AlongRow<F>{f, W});
}

/// Row (b, c, h) of an NCHW view, indexed by w: a raw pointer when the view is LayoutRight (w
/// contiguous), so that the inner loops over w keep it in a register and vectorise; otherwise the
/// view's own operator().
template <class V>
struct NchwRow {
  V v;
  int b, c, h;
  KOKKOS_INLINE_FUNCTION typename V::reference_type operator[](int w) const { return v(b, c, h, w); }
};
template <class V>
KOKKOS_INLINE_FUNCTION auto nchw_row(const V& v, int b, int c, int h) {
  if constexpr (std::is_same<typename V::array_layout, Kokkos::LayoutRight>::value)
    return &v(b, c, h, 0);
  else
    return NchwRow<V>{v, b, c, h};
}

/// One element of the NCHW <-> rows copy, in either direction (only the instantiated one has to
/// be able to write its destination, so the source may be a const view): `row` is row (b, c, h)
/// of the NCHW view, `column` the rows matrix's column c from row (b, h, 0) on, both indexed by w.
/// source / target: the element an entry copy reads and writes, p of the NCHW view and row r of
/// the rows matrix.
struct ToRows {
  template <class Row, class Column>
  KOKKOS_INLINE_FUNCTION static void move(const Row& row, const Column& column, int w) {
    column[w] = row[w];
  }
  template <class NV, class RV>
  KOKKOS_INLINE_FUNCTION static decltype(auto) source(const NV& nchw, const RV&, const NchwPlace& p, int) {
    return nchw(p.b, p.c, p.h, p.w);
  }
  template <class NV, class RV>
  KOKKOS_INLINE_FUNCTION static decltype(auto) target(const NV&, const RV& rows, const NchwPlace& p, int r) {
    return rows(r, p.c);
  }
};
struct ToNchw {
  template <class Row, class Column>
  KOKKOS_INLINE_FUNCTION static void move(const Row& row, const Column& column, int w) {
    row[w] = column[w];
  }
  template <class NV, class RV>
  KOKKOS_INLINE_FUNCTION static decltype(auto) source(const NV&, const RV& rows, const NchwPlace& p, int r) {
    return rows(r, p.c);
  }
  template <class NV, class RV>
  KOKKOS_INLINE_FUNCTION static decltype(auto) target(const NV& nchw, const RV&, const NchwPlace& p, int) {
    return nchw(p.b, p.c, p.h, p.w);
  }
};

/// Column c of a rows matrix from row r on, indexed by w: a raw pointer when the matrix is
/// LayoutLeft (rows contiguous), otherwise the view's own operator().
template <class V>
struct RowsColumn {
  V v;
  int r, c;
  KOKKOS_INLINE_FUNCTION typename V::reference_type operator[](int w) const { return v(r + w, c); }
};
template <class V>
KOKKOS_INLINE_FUNCTION auto rows_column(const V& v, int r, int c) {
  if constexpr (std::is_same<typename V::array_layout, Kokkos::LayoutLeft>::value)
    return &v(r, c);
  else
    return RowsColumn<V>{v, r, c};
}

/// nchw_rows_copy's device body: a few elements a thread, w fastest, so that neighbouring threads
/// read and write neighbouring addresses of the NCHW view and of a LayoutLeft rows matrix (a thread
/// per row leaves them a row apart; a LayoutRight rows matrix is accessed C elements apart).
template <class Direction, class ExecSpace, class NV, class RV>
void nchw_rows_copy_entries(const ExecSpace& exec, const char* func, const NV& nchw, const RV& rows) {
  using T = typename RV::non_const_value_type;
  const int B = static_cast<int>(nchw.extent(0)), C = static_cast<int>(nchw.extent(1));
  const int H = static_cast<int>(nchw.extent(2)), W = static_cast<int>(nchw.extent(3));
  copy_over_nchw(
      func, exec, B, C, H, W,
      KOKKOS_LAMBDA(const NchwPlace& p)->T { return Direction::source(nchw, rows, p, (p.b * H + p.h) * W + p.w); },
      KOKKOS_LAMBDA(const NchwPlace& p, const T v) {
        Direction::target(nchw, rows, p, (p.b * H + p.h) * W + p.w) = v;
      });
}

template <class Direction, class ExecSpace, class NV, class RV>
void nchw_rows_copy(const ExecSpace& exec, const char* func, const NV& nchw, const RV& rows) {
  static_assert(compat::view_rank<NV>() == 4, "kdist: the NCHW tensor must be rank 4");
  static_assert(compat::view_rank<RV>() == 2, "kdist: the rows matrix must be rank 2");
  static_check_view<ExecSpace, NV>();
  static_check_view<ExecSpace, RV>();
  static_assert(std::is_same<typename NV::non_const_value_type, typename RV::non_const_value_type>::value,
                "kdist: NCHW and rows value types differ");
  const int B = static_cast<int>(nchw.extent(0)), C = static_cast<int>(nchw.extent(1));
  const int H = static_cast<int>(nchw.extent(2)), W = static_cast<int>(nchw.extent(3));
  require_extents(func, rows, {nchw.extent(0) * nchw.extent(2) * nchw.extent(3), nchw.extent(1)},
                  "(batch*height*width x channels) for NCHW " + describe(nchw));
  if (nchw.size() > static_cast<std::size_t>(INT_MAX)) throw_invalid(func, describe(nchw) + " exceeds int indexing");
  require_disjoint(func, nchw, rows);
  if constexpr (!runs_on_host<ExecSpace>()) {
    nchw_rows_copy_entries<Direction>(exec, func, nchw, rows);
  } else {
    for_rows_nchw(
        func, exec, B, C, H, KOKKOS_LAMBDA(const int b, const int c, const int h) {
          const auto row = nchw_row(nchw, b, c, h);
          const auto column = rows_column(rows, (b * H + h) * W, c);
          for (int w = 0; w < W; ++w) Direction::move(row, column, w);
        });
  }
}

}  // namespace impl

namespace impl {

/// The output columns j whose input column j*S - P + q lies in [0, W): [begin, end), clamped to
/// [0, OW]. One pair of divisions, none when the stride is 1.
struct InsideColumns {
  int begin, end;
  KOKKOS_INLINE_FUNCTION InsideColumns(int q, int S, int P, int W, int OW) {
    const int lo = P - q, hi = W + P - q;  // j*S in [lo, hi)
    begin = lo <= 0 ? 0 : (S == 1 ? lo : (lo + S - 1) / S);
    end = hi <= 0 ? 0 : (S == 1 ? hi : (hi + S - 1) / S);
    end = end < OW ? end : OW;
    begin = begin < end ? begin : end;
  }
};

/// Calls f(b, c, pad) once per (image b, channel c) plane on a host space, a team of one whose
/// scratch `pad` holds (H + 2P) x (W + 2P) entries (unset). im2col and col2im keep a zero-padded
/// copy of the plane there, so that a patch column's runs along j (as long as an output row) need
/// no bounds test per entry or per run.
template <class T, class ExecSpace, class F>
void for_padded_planes(const char* func, const ExecSpace& exec, const Conv2dGeometry& g, const F& f) {
  using Scratch = Kokkos::View<T*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  const std::size_t size = std::size_t(g.height + 2 * g.padding) * std::size_t(g.width + 2 * g.padding);
  const int C = g.channels;
  Policy policy(exec, g.batch * C, 1);
  policy.set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(size)));
  Kokkos::parallel_for(
      func, policy, KOKKOS_LAMBDA(const typename Policy::member_type& team) {
        const int b = team.league_rank() / C;
        f(b, team.league_rank() - b * C, Scratch(team.team_scratch(0), size).data());
      });
}

/// Entries of the largest padded plane for_padded_planes takes (256 KiB of floats: the scratch
/// is per thread and stays allocated).
constexpr long long kPaddedPlaneEntries = 1 << 16;
/// Whether im2col and col2im may run through padded planes: the plane fits kPaddedPlaneEntries
/// and there are planes enough for every thread of `exec`.
template <class ExecSpace>
bool padded_planes_fit(const ExecSpace& exec, const Conv2dGeometry& g) {
  const long long entries = (g.height + 2LL * g.padding) * (g.width + 2LL * g.padding);
  return entries <= kPaddedPlaneEntries && planes_suffice(exec, g.batch, g.channels);
}

/// n zeros from `at` on.
template <class T>
KOKKOS_INLINE_FUNCTION void zero_run(T* at, int n) {
  for (int e = 0; e < n; ++e) at[e] = T(0);
}
/// to[j·stride] += from[j] for j < n: one run of a patch column summed into a padded row. `to` and
/// `from` are pointers or nchw_row()'s row of another layout.
template <class To, class From>
KOKKOS_INLINE_FUNCTION void add_run(const To& to, int stride, const From& from, int n) {
  if (stride == 1) {
    for (int j = 0; j < n; ++j) to[j] += from[j];
  } else {
    for (int j = 0; j < n; ++j) to[j * stride] += from[j];
  }
}
/// to[j] := from[j·stride] for j < n.
template <class To, class From>
KOKKOS_INLINE_FUNCTION void gather_run(const To& to, const From& from, int stride, int n) {
  if (stride == 1) {
    for (int j = 0; j < n; ++j) to[j] = from[j];
  } else {
    for (int j = 0; j < n; ++j) to[j] = from[j * stride];
  }
}

/// im2col into a LayoutLeft patch matrix on a host space, a work item per (column k, image b):
/// for each output row i, an input row segment along j (contiguous when the stride is 1) and the
/// padding around it, clipped run by run. For planes too large for scratch, or too few planes for
/// the host's threads.
template <class ExecSpace, class XView, class PView>
void im2col_column_runs(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                        const PView& patches) {
  using T = typename PView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w, B = g.batch;
  const int H = g.height, W = g.width, S = g.stride, P = g.padding;
  Kokkos::parallel_for(
      func, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<int>>(exec, 0, g.patch() * B), KOKKOS_LAMBDA(const int t) {
        const int b = t % B, k = t / B;
        const int q = k % KW, p = (k / KW) % KH, c = k / (KW * KH);
        const InsideColumns inside(q, S, P, W, OW);
        for (int i = 0, r0 = b * OH * OW; i < OH; ++i, r0 += OW) {
          const int h = i * S - P + p;
          const bool row_inside = h >= 0 && h < H;
          const int begin = row_inside ? inside.begin : OW, end = row_inside ? inside.end : OW;
          T* const column = &patches(r0, k);  // LayoutLeft: contiguous over the rows
          for (int j = 0; j < begin; ++j) column[j] = T(0);
          if (row_inside) {
            const auto in = nchw_row(x, b, c, h);
            if (S == 1) {
              for (int j = begin; j < end; ++j) column[j] = T(in[j - P + q]);
            } else {
              for (int j = begin; j < end; ++j) column[j] = T(in[j * S - P + q]);
            }
          }
          for (int j = end; j < OW; ++j) column[j] = T(0);
        }
      });
}

/// im2col into a LayoutLeft patch matrix on a host space: column k is contiguous over the rows
/// (b, i, j). One work item per (image b, channel c) copies the channel into its padded plane,
/// then writes the channel's kh·kw columns, each as out_h runs of out_w entries read from the
/// plane. Faster than per-column work items that clipped every run to the input (2.5 against
/// 3.9 ms a step for the CNN's second convolution; docs/performance.md).
template <class ExecSpace, class XView, class PView>
void im2col_plane_runs(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                       const PView& patches) {
  using T = typename PView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w;
  const int H = g.height, W = g.width, S = g.stride, P = g.padding, PH = H + 2 * P, PW = W + 2 * P;
  for_padded_planes<T>(
      func, exec, g, KOKKOS_LAMBDA(const int b, const int c, T* const pad) {
        zero_run(pad, PH * PW);
        for (int h = 0; h < H; ++h) gather_run(pad + (h + P) * PW + P, nchw_row(x, b, c, h), 1, W);
        for (int p = 0; p < KH; ++p)
          for (int q = 0; q < KW; ++q) {
            T* const column = &patches(b * OH * OW, (c * KH + p) * KW + q);  // LayoutLeft: contiguous
            for (int i = 0; i < OH; ++i) gather_run(column + i * OW, pad + (i * S + p) * PW + q, S, OW);
          }
      });
}

/// im2col into a LayoutLeft patch matrix on a host space: through padded planes where they fit.
template <class ExecSpace, class XView, class PView>
void im2col_columns(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                    const PView& patches) {
  if (padded_planes_fit(exec, g))
    im2col_plane_runs(exec, func, g, x, patches);
  else
    im2col_column_runs(exec, func, g, x, patches);
}

/// im2col on a device space, any layout: one thread per patch entry (r, k), the patch matrix's
/// contiguous index fastest, so neighbouring threads write neighbouring addresses (and, along r
/// at stride 1, read neighbouring inputs).
template <class ExecSpace, class XView, class PView>
void im2col_entries(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                    const PView& patches) {
  using T = typename PView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w;
  const int H = g.height, W = g.width, S = g.stride, P = g.padding;
  const int rows = g.rows(), cols = g.patch();
  constexpr bool rows_fastest = !std::is_same<typename PView::array_layout, Kokkos::LayoutRight>::value;
  const std::int64_t n = static_cast<std::int64_t>(rows) * cols;
  Kokkos::parallel_for(
      func, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
      KOKKOS_LAMBDA(const std::int64_t t) {
        const int r = static_cast<int>(rows_fastest ? t % rows : t / cols);
        const int k = static_cast<int>(rows_fastest ? t / rows : t % cols);
        const int j = r % OW, i = (r / OW) % OH, b = r / (OW * OH);
        const int q = k % KW, p = (k / KW) % KH, c = k / (KW * KH);
        const int h = i * S - P + p, w = j * S - P + q;
        patches(r, k) = h >= 0 && h < H && w >= 0 && w < W ? T(x(b, c, h, w)) : T(0);
      });
}

/// Threads per team of im2col_column_teams for `spatial` output positions: enough for each to copy
/// copies_per_thread of them, in whole 32-thread warps (CUDA's), at most 256, which every CUDA
/// device runs for this kernel (1 on a host space).
template <class ExecSpace>
int im2col_team_size(int spatial) {
  if (runs_on_host<ExecSpace>()) return 1;
  const int threads = (spatial + copies_per_thread - 1) / copies_per_thread;
  return std::min(256, (threads + 31) / 32 * 32);
}

/// im2col into a LayoutLeft patch matrix on a device: im2col_column_runs' work items, each a team
/// whose threads share its output positions, so a team writes down one column and reads along
/// input rows (both contiguous at stride 1), with one division per entry. Thread s0 copies the
/// positions s0 + r m (m the team's share), loading them all before its first store (for_copies).
template <class ExecSpace, class XView, class PView>
void im2col_column_teams(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                         const PView& patches) {
  using T = typename PView::non_const_value_type;
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w, B = g.batch;
  const int H = g.height, W = g.width, S = g.stride, P = g.padding, spatial = OH * OW;
  const int m = (spatial + copies_per_thread - 1) / copies_per_thread;
  Kokkos::parallel_for(
      func, Policy(exec, g.patch() * B, im2col_team_size<ExecSpace>(spatial)),
      KOKKOS_LAMBDA(const typename Policy::member_type& team) {
        const int b = team.league_rank() % B, k = team.league_rank() / B;
        const int q = k % KW, p = (k / KW) % KH, c = k / (KW * KH);
        const int r0 = b * spatial;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, m), [&](const int s0) {
          T v[copies_per_thread] = {};
          for (int r = 0, s = s0; r < copies_per_thread; ++r, s += m) {
            const int i = s / OW, j = s - i * OW;
            const int h = i * S - P + p, w = j * S - P + q;
            if (s < spatial && h >= 0 && h < H && w >= 0 && w < W) v[r] = T(x(b, c, h, w));
          }
          for (int r = 0; r < copies_per_thread; ++r)  // a fixed trip count: v stays in registers
            if (s0 + r * m < spatial) patches(r0 + s0 + r * m, k) = v[r];
        });
      });
}

/// col2im from a LayoutLeft patch matrix on a host space, row by row: each input row (b, c, h)
/// sums, for each kernel row p that reads it (one division per p), the kernel columns' contiguous
/// runs along j, clipped to the row; a row's kh·kw runs are read side by side.
template <class ExecSpace, class PView, class XView>
void col2im_row_runs(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const PView& patches,
                     const XView& dx) {
  using T = typename XView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w, S = g.stride, P = g.padding;
  const int W = g.width;
  for_rows_nchw(
      func, exec, g.batch, g.channels, g.height, KOKKOS_LAMBDA(const int b, const int c, const int h) {
        const auto out = nchw_row(dx, b, c, h);
        for (int w = 0; w < W; ++w) out[w] = T(0);
        for (int p = 0; p < KH; ++p) {
          const int hp = h + P - p;  // == i*S for the output row i that reads h through p
          if (hp < 0 || hp % S != 0 || hp / S >= OH) continue;
          const int r0 = (b * OH + hp / S) * OW;
          for (int q = 0; q < KW; ++q) {
            const InsideColumns inside(q, S, P, W, OW);
            const auto* const column = &patches(r0, (c * KH + p) * KW + q);  // LayoutLeft: contiguous
            if (S == 1) {
              for (int j = inside.begin; j < inside.end; ++j) out[j - P + q] += column[j];
            } else {
              for (int j = inside.begin; j < inside.end; ++j) out[j * S - P + q] += column[j];
            }
          }
        }
      });
}

/// col2im from a LayoutLeft patch matrix on a host space, a column at a time: one work item per
/// (image b, channel c) adds each of the channel's kh·kw columns, out_h runs of out_w entries,
/// into its zeroed padded plane, then copies the plane's interior to dx. Each element receives
/// its entries in (p, q) order, as a gather would add them.
template <class ExecSpace, class PView, class XView>
void col2im_plane_runs(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const PView& patches,
                       const XView& dx) {
  using T = typename XView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w;
  const int H = g.height, W = g.width, S = g.stride, P = g.padding, PH = H + 2 * P, PW = W + 2 * P;
  for_padded_planes<T>(
      func, exec, g, KOKKOS_LAMBDA(const int b, const int c, T* const pad) {
        zero_run(pad, PH * PW);
        for (int p = 0; p < KH; ++p)
          for (int q = 0; q < KW; ++q) {
            const auto* const column = &patches(b * OH * OW, (c * KH + p) * KW + q);  // LayoutLeft: contiguous
            for (int i = 0; i < OH; ++i) add_run(pad + (i * S + p) * PW + q, S, column + i * OW, OW);
          }
        for (int h = 0; h < H; ++h) gather_run(nchw_row(dx, b, c, h), pad + (h + P) * PW + P, 1, W);
      });
}

/// col2im from a LayoutLeft patch matrix on a host space. Measured on the 2-core VM (float,
/// docs/performance.md): a column at a time (col2im_plane_runs) was 1.5x faster for 5 x 5 kernels
/// (64 x 16x14x14: 2.9 against 4.5 ms), row by row with the kernel's columns side by side
/// (col2im_row_runs) 1.1-1.6x faster for 3 x 3 ones (8 x 64x56x56: 4.4 against 7.3 ms): kh·kw
/// streams read at once help until there are too many of them.
template <class ExecSpace, class PView, class XView>
void col2im_columns(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const PView& patches,
                    const XView& dx) {
  if (g.kernel_h * g.kernel_w >= 16 && padded_planes_fit(exec, g))
    col2im_plane_runs(exec, func, g, patches, dx);
  else
    col2im_row_runs(exec, func, g, patches, dx);
}

/// im2col into any other layout: one work item per (patch row r, channel c), the kh x kw block of
/// columns of that channel, so the index arithmetic is paid once per block rather than per element.
template <class ExecSpace, class XView, class PView>
void im2col_rows(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                 const PView& patches) {
  using T = typename PView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w;
  const int C = g.channels, H = g.height, W = g.width, S = g.stride, P = g.padding;
  const std::int64_t items = static_cast<std::int64_t>(g.rows()) * C;  // <= the patch matrix's size
  Kokkos::parallel_for(
      func, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, items),
      KOKKOS_LAMBDA(const std::int64_t t) {
        const int c = static_cast<int>(t % C), r = static_cast<int>(t / C);
        const int j = r % OW, i = (r / OW) % OH, b = r / (OW * OH);
        const int k0 = c * KH * KW;
        // Columns q in [q_begin, q_end) read inside the input row (w = j*S - P + q in [0, W)); the
        // rest are padding. Splitting the loop keeps the bounds test out of the inner loop.
        const int w0 = j * S - P;
        const int q_begin = w0 < 0 ? (-w0 < KW ? -w0 : KW) : 0;
        const int q_end = W - w0 < q_begin ? q_begin : (W - w0 < KW ? W - w0 : KW);
        for (int p = 0; p < KH; ++p) {
          const int h = i * S - P + p, k = k0 + p * KW;
          const bool row_inside = h >= 0 && h < H;
          const int inside_begin = row_inside ? q_begin : KW, inside_end = row_inside ? q_end : KW;
          for (int q = 0; q < inside_begin; ++q) patches(r, k + q) = T(0);
          for (int q = inside_begin; q < inside_end; ++q) patches(r, k + q) = T(x(b, c, h, w0 + q));
          for (int q = inside_end > inside_begin ? inside_end : inside_begin; q < KW; ++q) patches(r, k + q) = T(0);
        }
      });
}

/// col2im from any other layout: a gather over dx, one element at a time.
template <class ExecSpace, class PView, class XView>
void col2im_rows(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const PView& patches,
                 const XView& dx) {
  using T = typename XView::value_type;
  const int OH = g.out_h(), OW = g.out_w(), KH = g.kernel_h, KW = g.kernel_w, S = g.stride, P = g.padding;
  for_each_nchw(
      func, exec, g.batch, g.channels, g.height, g.width,
      KOKKOS_LAMBDA(const int b, const int c, const int h, const int w) {
        // Kernel offset p reads input row h from output row i when i*S - P + p == h.
        T sum = 0;
        for (int p = 0; p < KH; ++p) {
          const int hp = h + P - p;
          if (hp < 0 || hp % S != 0 || hp / S >= OH) continue;
          for (int q = 0; q < KW; ++q) {
            const int wq = w + P - q;
            if (wq < 0 || wq % S != 0 || wq / S >= OW) continue;
            sum += patches((b * OH + hp / S) * OW + wq / S, (c * KH + p) * KW + q);
          }
        }
        dx(b, c, h, w) = sum;
      });
}

template <class View>
constexpr bool is_layout_left() {
  return std::is_same<typename View::array_layout, Kokkos::LayoutLeft>::value;
}

/// im2col's kernel for the space and the patch layout, unchecked (nn::Conv2d calls it per chunk).
/// Host: the column and row kernels, a loop per work item. Device: a team per column and image
/// (LayoutLeft), else every entry its own thread.
template <class ExecSpace, class XView, class PView>
void im2col_kernel(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const XView& x,
                   const PView& patches) {
  if constexpr (runs_on_host<ExecSpace>() && is_layout_left<PView>())
    im2col_columns(exec, func, g, x, patches);
  else if constexpr (runs_on_host<ExecSpace>())
    im2col_rows(exec, func, g, x, patches);
  else if constexpr (is_layout_left<PView>())
    im2col_column_teams(exec, func, g, x, patches);
  else
    im2col_entries(exec, func, g, x, patches);
}

/// col2im's kernel, unchecked: the column kernel on the host for LayoutLeft, otherwise the gather
/// over dx's rows.
template <class ExecSpace, class PView, class XView>
void col2im_kernel(const ExecSpace& exec, const char* func, const Conv2dGeometry& g, const PView& patches,
                   const XView& dx) {
  if constexpr (is_layout_left<PView>() && runs_on_host<ExecSpace>())
    col2im_columns(exec, func, g, patches, dx);
  else
    col2im_rows(exec, func, g, patches, dx);
}

}  // namespace impl

/// patches := im2col(x) for the geometry g (see the header's contract). A LayoutLeft patch
/// matrix (each column contiguous over the rows) is the fast one: its kernel copies along the
/// input rows, and a gemm or syrk reads it as a column-major matrix in place.
template <class ExecSpace, class XView, class PView>
void im2col(const ExecSpace& exec, const Conv2dGeometry& g, const XView& x, const PView& patches) {
  constexpr const char* func = "kdist::im2col";
  impl::check_im2col<ExecSpace>(func, g, x, patches);
  impl::im2col_kernel(exec, func, g, x, patches);
}

/// dx := col2im(patches), the adjoint of im2col: each element of dx (or its padded plane) is
/// written by one work item, so no atomics.
template <class ExecSpace, class PView, class XView>
void col2im(const ExecSpace& exec, const Conv2dGeometry& g, const PView& patches, const XView& dx) {
  constexpr const char* func = "kdist::col2im";
  impl::check_im2col<ExecSpace>(func, g, dx, patches);
  impl::col2im_kernel(exec, func, g, patches, dx);
}

/// rows((b*H + h)*W + w, c) := y(b, c, h, w).
template <class ExecSpace, class YView, class RView>
void nchw_to_rows(const ExecSpace& exec, const YView& y, const RView& rows) {
  impl::nchw_rows_copy<impl::ToRows>(exec, "kdist::nchw_to_rows", y, rows);
}

/// y(b, c, h, w) := rows((b*H + h)*W + w, c); y's extents give the shape.
template <class ExecSpace, class RView, class YView>
void rows_to_nchw(const ExecSpace& exec, const RView& rows, const YView& y) {
  impl::nchw_rows_copy<impl::ToNchw>(exec, "kdist::rows_to_nchw", y, rows);
}

// ---- the same on the output view's default execution space ------------------------------------

template <class XView, class PView>
void im2col(const Conv2dGeometry& g, const XView& x, const PView& patches) {
  im2col(typename PView::execution_space{}, g, x, patches);
}
template <class PView, class XView>
void col2im(const Conv2dGeometry& g, const PView& patches, const XView& dx) {
  col2im(typename XView::execution_space{}, g, patches, dx);
}
template <class YView, class RView>
void nchw_to_rows(const YView& y, const RView& rows) {
  nchw_to_rows(typename RView::execution_space{}, y, rows);
}
template <class RView, class YView>
void rows_to_nchw(const RView& rows, const YView& y) {
  rows_to_nchw(typename YView::execution_space{}, rows, y);
}

}  // namespace kdist
