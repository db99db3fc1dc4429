// Adasum all-reduce: every rank ends with the bit-identical Adasum of all ranks' buffers, tensor
// by tensor, for any rank count.
//
// The tree (what the result equals; unit_tests build it serially as the reference):
//   P = 2^k + q ranks (0 <= q < 2^k). First rank 2i+1 (i < q) is folded into rank 2i:
//   x_2i := Adasum(x_2i, x_2i+1). The 2^k survivors take virtual ranks v = r < 2q ? r/2 : r - q
//   and are combined by a balanced binary tree over consecutive virtual ranks: at level l the
//   block [j 2^l, j 2^l + 2^(l-1)) is `a`, the next 2^(l-1) virtual ranks are `b`.
//   Finally rank 2i sends the result back to 2i+1. For P a power of two this is Horovod's tree.
//
// The algorithm (vector-halving distance-doubling, one engine Schedule): at distance d = 1, 2, 4
// ... partner v XOR d; the lower virtual rank keeps the first floor(n/2) elements of its current
// slice and sends the rest; the partials [a.b, a.a, b.b] of each tensor are summed over the 2d
// virtual ranks that hold pieces of the two vectors (point-to-point recursive doubling, so every
// holder gets bit-identical sums) and applied; then the slices are all-gathered in reverse order.
// Per rank this moves at most 2 (P'-1)/P' n elements of vector data (P' = 2^k; up to one element
// more per level when halves are uneven), plus n twice for a folded pair, in at most 2k + 2
// exchanges, and makes k small reductions (AdasumCounters reports both).
//
// Hierarchical mode (node size s): average inside each node by reduce-scatter (the buffer is
// padded to a multiple of s), run the algorithm above across nodes on each slice, with a
// tensor's partials summed over every rank holding a piece of it (the node's other slices
// included), then all-gather inside the node. The result is exactly Adasum over node averages.
//
// Range: partials are accumulated in double, and a squared norm below sqrt(DBL_MIN) (~1.5e-154)
// counts as zero (coefficient 1). For float and half storage no representable tensor is that
// small; for double storage, tensors with norms below ~1e-77 are treated as zero.
//
// NaN or Inf in any input: every rank throws kdist::adasum::NonFiniteError naming the first such
// tensor (by label) and the lowest rank where it appeared. The rank of each tensor's non-finite
// input travels with the partial sums (a min), so detection costs no extra message. Buffer
// contents are unspecified after this error. (Double inputs above ~1e154 in magnitude, whose
// squared norms overflow, are reported the same way: Adasum's coefficients overflow there too.)
#pragma once

#include <kdist/adasum/operator.hpp>
#include <kdist/comm/engine.hpp>

#include <memory>
#include <string>
#include <vector>

namespace kdist {
namespace adasum {

/// kdist's one non-finite error type (core/error.hpp), under the name adasum code used.
using NonFiniteError = kdist::NonFiniteError;

/// Traffic of one Adasum all-reduce on this rank, filled when the request completes.
struct AdasumCounters {
  long long vector_bytes_sent = 0;   ///< vector data this rank sent
  long long vector_exchanges = 0;    ///< steps in which it exchanged vector data
  long long partial_reductions = 0;  ///< small reductions of per-tensor partials
  long long partial_bytes_sent = 0;  ///< bytes of partials (and non-finite markers) sent
};

/// Node structure for hierarchical Adasum over the engine's communicator: the node-local and
/// cross-node communicators and their rank maps, built once (collective) and reused.
class Topology {
 public:
  /// node_size > 0 imposes nodes of that many consecutive ranks (emulated nodes); 0 takes the
  /// shared-memory nodes. Unequal node sizes throw kdist::InvalidArgument.
  Topology(const comm::Communicator& world, int node_size = 0);
  const comm::Communicator& node() const noexcept { return node_; }
  const comm::Communicator& cross() const noexcept { return cross_; }
  /// Engine-communicator rank of node-local rank l / cross-node rank x.
  int node_peer(int l) const { return node_peers_[static_cast<std::size_t>(l)]; }
  int cross_peer(int x) const { return cross_peers_[static_cast<std::size_t>(x)]; }

 private:
  comm::Communicator node_, cross_;
  std::vector<int> node_peers_, cross_peers_;
};

/// Starts the Adasum all-reduce of `data` (n elements, host memory that stays valid until the
/// request completes) with tensor boundaries `bounds` (offsets, 0 ... n) and optional tensor
/// labels for error messages. `hierarchy` (nullptr: flat) selects hierarchical mode; it and
/// `counters`, if given, must outlive the request.
template <class T>
comm::Request allreduce(comm::Engine& engine, T* data, std::size_t n, std::vector<std::size_t> bounds,
                        std::vector<std::string> labels = {}, const Topology* hierarchy = nullptr,
                        AdasumCounters* counters = nullptr);

/// View front end: in place on a rank-1 view (staged through host memory if on a device).
template <class ExecSpace, class V>
comm::Request allreduce(const ExecSpace& exec, comm::Engine& engine, const V& v, std::vector<std::size_t> bounds,
                        std::vector<std::string> labels = {}, const Topology* hierarchy = nullptr,
                        AdasumCounters* counters = nullptr) {
  static_assert(compat::view_rank<V>() == 1, "kdist::adasum::allreduce: rank-1 view");
  using T = typename V::non_const_value_type;
  auto h = comm::impl::stage_in(exec, v);
  comm::Request r =
      allreduce<T>(engine, h.data(), h.extent(0), std::move(bounds), std::move(labels), hierarchy, counters);
  if (static_cast<const void*>(h.data()) != static_cast<const void*>(v.data())) {
    r.wait();  // device views: copy the result back (host views are reduced in place)
    Kokkos::deep_copy(exec, v, h);
  }
  return r;
}

}  // namespace adasum
}  // namespace kdist
