// The NCHW row drivers and the NCHW <-> rows copies, shared by im2col/col2im
// (kdist/core/im2col.hpp), nn's layers and their kernels:
//   for_rows_nchw(label, exec, B, C, H, f(b, c, h)) / for_each_nchw(..., f(b, c, h, w)): a body per
//     row or element of a B x C x H x W box; on a host a plane a work item where there are planes
//     for every thread (planes_suffice), else a row; on a device an element a thread, w fastest.
//   copy_over_nchw(label, exec, B, C, H, W, load(p), store(p, v)): a copy between an NCHW tensor
//     and another layout, a few elements a thread on a device.
//   nchw_row(v, b, c, h) / rows_column(m, r, c): a row of an NCHW view, a column of a rows matrix,
//     as a raw pointer where the layout makes it contiguous (so inner loops vectorise).
//   nchw_rows_copy<ToRows | ToNchw>(exec, func, nchw, rows): the checked copy behind
//     nchw_to_rows and rows_to_nchw (extents, int indexing, overlap: InvalidArgument).
#pragma once

#include <kdist/core/impl/entries.hpp>
#include <kdist/core/views.hpp>

#include <Kokkos_Core.hpp>
#include <climits>
#include <cstddef>
#include <string>
#include <type_traits>

namespace kdist {
namespace impl {

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
}  // namespace kdist
