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
// Two algorithms compute that tree (Options::algorithm): VHDD, vector halving and distance
// doubling (bandwidth-optimal: about 2 n per rank in 2 log2 P exchanges plus a partials round per
// level), and whole-vector recursive doubling (latency-optimal: log2 P exchanges of the whole
// vector, both partners applying the pair operator to the same two vectors). `automatic` takes
// doubling for flat calls below Options::small_bytes, the way MPI libraries switch algorithms by
// message size; small_bytes_from() reads the crossover kdist_calibrate measured. On a power of
// two with the Engine's check on, doubling's first exchange (up to 64 KiB) rides in the check's
// own message (comm::CheckPayload): at 2 ranks the call is one message. VHDD moves each
// half in cache-sized chunks (Options::chunk_bytes) and sums a chunk's partials while the next
// chunk is in flight; the partials' order of addition is fixed by the tensors, not the chunks. The two agree to
// rounding (their partial sums run in different orders); each is bit-identical on every rank, and
// every rank must choose the same one (the choice is part of the Engine's signature check).
// The view may live in any memory space: it is staged through host memory and the result copied
// back on `exec` when the request completes, so the call never blocks. All ranks must pass the
// same tensor layout (bounds and labels are part of the Engine's signature check).
// NaN or Inf in any input: every rank raises kdist::NonFiniteError naming the first such tensor
// and the lowest rank it came from; buffer contents are then unspecified.
#pragma once

#include <kdist/adasum/operator.hpp>
#include <kdist/adasum/shared_buffer.hpp>
#include <kdist/comm/engine.hpp>
#include <kdist/core/cost_model.hpp>
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
  long long vector_messages = 0;     ///< messages of vector data sent (one per chunk)
  long long in_place_levels = 0;     ///< levels and node phases that read or write a peer's block in place
};

/// Node structure for hierarchical Adasum: the node-local and cross-node groups of one Engine
/// (made through it, collective) and their rank maps. Use it only with that Engine.
class Topology {
 public:
  /// node_size > 0 imposes nodes of that many consecutive ranks (emulated nodes); 0 takes the
  /// shared-memory nodes. Unequal node sizes throw kdist::InvalidArgument. Collective and checked
  /// (the node splits and, for imposed nodes, one all-reduce saying whether every node lies in one
  /// shared-memory node).
  explicit Topology(comm::Engine& engine, int node_size = 0);
  const comm::Engine* engine() const noexcept { return engine_id_; }
  const comm::Communicator& node() const noexcept { return node_; }
  const comm::Communicator& cross() const noexcept { return cross_; }
  /// Engine-communicator rank of node-local rank l / cross-node rank x.
  int node_peer(int l) const { return node_peers_[static_cast<std::size_t>(l)]; }
  int cross_peer(int x) const { return cross_peers_[static_cast<std::size_t>(x)]; }
  /// True when every node, on every rank, lies inside one shared-memory node: only then may the
  /// hierarchical all-reduce on a SharedBuffer run in place. The same on every rank, so two
  /// partners on one machine never disagree on whether a level is read in place or sent by MPI
  /// (an imposed node that straddles machines makes it false everywhere, not only on that node).
  bool nodes_share_memory() const noexcept { return nodes_share_memory_; }

 private:
  const comm::Engine* engine_id_;
  comm::Communicator node_, cross_;
  std::vector<int> node_peers_, cross_peers_;
  bool nodes_share_memory_ = false;
};

enum class Algorithm { automatic, vhdd, doubling };
/// "automatic", "vhdd", "doubling".
const char* to_string(Algorithm a);

/// Bytes below which `automatic` takes recursive doubling when nothing was calibrated: at 2 ranks
/// doubling was faster up to 16 KiB on the emulated 4 Gbit/s link and VHDD from 16 KiB on shared
/// memory (docs/performance.md, "Adasum"); beyond 2 ranks doubling sends log2 P times n, VHDD 2 n.
constexpr std::size_t kDefaultSmallBytes = 16u << 10;

/// VHDD's exchange chunk to partners on other nodes when Options::chunk_bytes is 0. A constant,
/// not the local cache size: ranks on different CPUs must chunk alike (the chunk is part of the
/// signature). Two chunks and the partner's chunk fit a 512 KiB L2; the link series of
/// perf/results/adasum ran with it on hosts 3 and 4.
constexpr std::size_t kDefaultChunkBytes = 128u << 10;

struct Options {
  Algorithm algorithm = Algorithm::automatic;
  std::size_t small_bytes = kDefaultSmallBytes;  ///< automatic: doubling below this many bytes (flat only)
  /// VHDD sends each half in chunks of this many bytes and sums each chunk's partials while the
  /// next one moves; the last level applies chunk by chunk while the all-gather sends. 0: chunks
  /// of kDefaultChunkBytes to partners on other nodes only (on the node MPI copies on the CPU
  /// and nothing overlaps). The result does not depend on it, bit for bit; ranks must agree on it.
  std::size_t chunk_bytes = 0;
  /// With a SharedBuffer: read the blocks of peers on this node in place (zero-copy); false runs
  /// the same buffer through MPI. Ranks must agree (the signature says which path).
  bool in_place = true;
  const Topology* hierarchy = nullptr;  ///< nullptr: flat; hierarchical calls always run VHDD
  AdasumCounters* counters = nullptr;
};

/// The crossover kdist_calibrate stored (CostKey{adasum, dtype, ranks, "world"} for VHDD and
/// "world/doubling" for doubling): the least measured size at which VHDD is no slower (doubling
/// below it); twice the largest measured size when doubling is faster at every one;
/// kDefaultSmallBytes when either model is missing.
std::size_t small_bytes_from(const CostModelStore& store, DType dtype, int ranks);

namespace impl {
/// The algorithm on host memory that stays valid until the request completes; `on_success`
/// runs as its last local work.
template <class T>
comm::Request allreduce_host(comm::Engine& engine, T* data, std::size_t n, comm::Layout layout, const Options& options,
                             std::function<void()> on_success, const comm::SharedWindow* window = nullptr);
}  // namespace impl

/// In place on a rank-1 contiguous view with tensor boundaries `bounds` (offsets 0 ... n; {0} for
/// an empty buffer of no tensors, which completes having done nothing but the Engine's check) and
/// optional labels for messages. The request holds `v` (an unmanaged view's memory must outlive
/// it), also after a failure; `options.hierarchy` and `options.counters` must outlive the request.
template <class ExecSpace, class V>
comm::Request allreduce(const ExecSpace& exec, comm::Engine& engine, const V& v, std::vector<std::size_t> bounds,
                        std::vector<std::string> labels, const Options& options) {
  static_assert(Kokkos::is_view<V>::value && compat::view_rank<V>() == 1, "kdist::adasum::allreduce: rank-1 view");
  using T = typename V::non_const_value_type;
  kdist::impl::require_contiguous("kdist::adasum::allreduce", v);
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(exec, h, v);
  compat::fence(exec, "kdist::adasum::allreduce: input ready");
  // The request holds h (v itself on a host space): a failed request can leave receives posted
  // into it after wait() has thrown, and the Engine keeps such an operation, and so h, while MPI
  // may still write.
  const bool staged = h.data() != v.data();
  std::function<void()> copy_back = [h, v, exec, staged] {
    if (staged) Kokkos::deep_copy(exec, v, h);
  };
  return impl::allreduce_host<T>(engine, h.data(), h.extent(0), comm::Layout{std::move(bounds), std::move(labels), {}},
                                 options, std::move(copy_back));
}

/// In place on a SharedBuffer: levels (and, hierarchical, node phases) whose peer shares the node
/// read its block where it lies instead of receiving a copy (Options::in_place). Equal to the
/// copying path bit for bit, flat or with nodes of two. `buffer` must outlive the request.
/// Synchronisation: before a rank reads a range of a peer's block, the peer tells it (a one-byte
/// message after MPI_Win_sync) that the range is final: its vector after the level before, its
/// input before the node average (for the first read of inputs, the Engine's check, when on,
/// already says so). Every read comes before a message the reader then sends the block's owner
/// (the partials round, the node's rounds). The all-gather pushes: a rank writes its piece into
/// the partner's block (a range nobody reads any more), then tells it; the last level's apply
/// writes both copies in one pass. Nothing reads or writes this rank's block once its last
/// message has come, so the buffer may be read and written as soon as wait() returns.
template <class T>
comm::Request allreduce(comm::Engine& engine, SharedBuffer<T>& buffer, std::vector<std::size_t> bounds,
                        std::vector<std::string> labels, const Options& options) {
  return impl::allreduce_host<T>(engine, buffer.data(), buffer.size(),
                                 comm::Layout{std::move(bounds), std::move(labels), {}}, options, {}, &buffer.window());
}

/// The same with the algorithm chosen automatically (flat calls below kDefaultSmallBytes by doubling).
template <class ExecSpace, class V>
comm::Request allreduce(const ExecSpace& exec, comm::Engine& engine, const V& v, std::vector<std::size_t> bounds,
                        std::vector<std::string> labels = {}, const Topology* hierarchy = nullptr,
                        AdasumCounters* counters = nullptr) {
  Options o;
  o.hierarchy = hierarchy;
  o.counters = counters;
  return allreduce(exec, engine, v, std::move(bounds), std::move(labels), o);
}

}  // namespace adasum
}  // namespace kdist
