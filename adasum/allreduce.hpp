// Adasum all-reduce: every rank ends with the bit-identical Adasum of all ranks' buffers, tensor
// by tensor, for any rank count, flat or hierarchical (Adasum across nodes of node averages).
//
// What the result equals (unit_tests build it serially as the reference): for P = 2^k + q ranks
// (0 <= q < 2^k) rank 2i+1 (i < q) is first folded into rank 2i, x_2i := Adasum(x_2i, x_2i+1);
// the 2^k survivors, in virtual-rank order v = r < 2q ? r/2 : r - q, are combined by a balanced
// binary tree (at level l block [j 2^l, j 2^l + 2^(l-1)) is `a`, the next 2^(l-1) are `b`). For
// P a power of two this is Horovod's tree. How it is computed, what it sends and its numerical
// range are in allreduce.cpp; AdasumCounters reports the traffic.
//
// The view may live in any memory space: it is staged through host memory and the result copied
// back on `exec` when the request completes, so the call never blocks. All ranks must pass the
// same tensor layout (bounds and labels are part of the Engine's signature check).
// NaN or Inf in any input: every rank raises kdist::NonFiniteError naming the first such tensor
// and the lowest rank it came from; buffer contents are then unspecified.
#pragma once

#include <kdist/adasum/operator.hpp>
#include <kdist/comm/engine.hpp>
#include <kdist/core/views.hpp>

#include <functional>

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

/// Node structure for hierarchical Adasum: the node-local and cross-node groups of one Engine
/// (made through it, collective) and their rank maps. Use it only with that Engine.
class Topology {
 public:
  /// node_size > 0 imposes nodes of that many consecutive ranks (emulated nodes); 0 takes the
  /// shared-memory nodes. Unequal node sizes throw kdist::InvalidArgument.
  explicit Topology(comm::Engine& engine, int node_size = 0);
  const comm::Engine* engine() const noexcept { return engine_id_; }
  const comm::Communicator& node() const noexcept { return node_; }
  const comm::Communicator& cross() const noexcept { return cross_; }
  /// Engine-communicator rank of node-local rank l / cross-node rank x.
  int node_peer(int l) const { return node_peers_[static_cast<std::size_t>(l)]; }
  int cross_peer(int x) const { return cross_peers_[static_cast<std::size_t>(x)]; }

 private:
  const comm::Engine* engine_id_;
  comm::Communicator node_, cross_;
  std::vector<int> node_peers_, cross_peers_;
};

namespace impl {
/// The algorithm on host memory that stays valid until the request completes; `on_success`
/// runs as its last local work.
template <class T>
comm::Request allreduce_host(comm::Engine& engine, T* data, std::size_t n, comm::Layout layout,
                             const Topology* hierarchy, AdasumCounters* counters, std::function<void()> on_success);
}  // namespace impl

/// In place on a rank-1 contiguous view with tensor boundaries `bounds` (offsets 0 ... n) and
/// optional labels for messages. `hierarchy` (nullptr: flat) and `counters` must outlive the
/// request; so must `v`.
template <class ExecSpace, class V>
comm::Request allreduce(const ExecSpace& exec, comm::Engine& engine, const V& v, std::vector<std::size_t> bounds,
                        std::vector<std::string> labels = {}, const Topology* hierarchy = nullptr,
                        AdasumCounters* counters = nullptr) {
  static_assert(Kokkos::is_view<V>::value && compat::view_rank<V>() == 1, "kdist::adasum::allreduce: rank-1 view");
  using T = typename V::non_const_value_type;
  kdist::impl::require_contiguous("kdist::adasum::allreduce", v);
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(exec, h, v);
  compat::fence(exec, "kdist::adasum::allreduce: input ready");
  std::function<void()> copy_back;
  if (h.data() != v.data()) copy_back = [h, v, exec] { Kokkos::deep_copy(exec, v, h); };
  return impl::allreduce_host<T>(engine, h.data(), h.extent(0), comm::Layout{std::move(bounds), std::move(labels)},
                                 hierarchy, counters, std::move(copy_back));
}

}  // namespace adasum
}  // namespace kdist
