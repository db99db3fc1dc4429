// The Adasum all-reduce's schedule builder and its Plan (internal to adasum/; the contract is in
// adasum/allreduce.hpp, the algorithm in adasum/allreduce.cpp). Builder<T> is instantiated for
// float and double; each unit that defines some of its methods instantiates those.
#pragma once

#include <kdist/adasum/impl/schedule_state.hpp>
#include <kdist/comm/engine.hpp>

#include <cstddef>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kdist {
namespace adasum {
namespace impl {

/// How one all-reduce runs. Every rank must choose the same: describe() travels in the Engine's
/// signature (OpDescription::plan), so ranks that differ fail with a MismatchError naming both
/// plans before any data moves.
struct Plan {
  const Topology* hierarchy = nullptr;  ///< non-null: node average, Adasum across nodes, node gather
  bool doubling = false;                ///< whole-vector recursive doubling instead of VHDD (flat only)
  std::size_t chunk = 1;                ///< elements per VHDD message chunk
  bool chunk_everywhere = false;        ///< chunk to partners on this node too (the caller set chunk_bytes)
  bool in_place = false;                ///< peers' blocks read and written through the shared window
  /// The plan for n elements of T under `options` (in place only with a window).
  template <class T>
  static Plan choose(std::size_t n, const Options& options, bool window);
  /// "vhdd, chunks of 65536, in place": what changes the messages of a buffer of n elements.
  std::string describe(std::size_t n) const;
};
// Builds the schedule of one all-reduce, step by step (adasum/allreduce.cpp has the algorithm).
// Each phase's steps are added by its own methods, defined in its own unit:
//   build()                           adasum/allreduce.cpp
//   fold_away / fold_in / unfold      adasum/impl/fold.cpp       ranks beyond a power of two
//   halving_level / gather_level      adasum/impl/vhdd.cpp       vector halving, distance doubling
//   doubling_level                    adasum/impl/doubling.cpp   whole-vector recursive doubling
//   *_in_place, tell_and_hear         adasum/impl/in_place.cpp   through the shared window
//   node_average / node_sum / gather  adasum/impl/node.cpp       hierarchical mode
// Names: the cross ranks are the ranks the algorithm runs over (every rank when flat, one per
// node position when hierarchical); pow2_ = 2^levels_ of them take part in the levels, the
// extra_ = cross_size_ - pow2_ others fold their vector into a partner first; virtual_rank_ is
// this rank's index among the pow2_.
template <class T>
class Builder {
 public:
  Builder(comm::Engine& engine, std::shared_ptr<State<T>> st, const Plan& plan)
      : shared_(std::move(st)),
        state_(*shared_),
        hier_(plan.hierarchy),
        engine_(engine),
        rank_(engine.rank()),
        doubling_(plan.doubling && !plan.hierarchy),
        chunk_(plan.chunk),
        chunk_everywhere_(plan.chunk_everywhere) {
    const Topology* hier = plan.hierarchy;
    node_size_ = hier ? hier->node().size() : 1;
    cross_size_ = hier ? hier->cross().size() : engine.size();
    cross_index_ = hier ? hier->cross().rank() : rank_;
    state_.node_size = node_size_;
    state_.local = hier ? hier->node().rank() : 0;
    while (pow2_ * 2 <= cross_size_) {
      pow2_ *= 2;
      ++levels_;
    }
    extra_ = cross_size_ - pow2_;
    // Flat doubling over a power of two: level 0's vector rides in the Engine's signature check
    // to the same partner (rank ^ 1), so at 2 ranks the whole all-reduce is one message. Only for
    // small vectors: the check copies its message in and out (three passes over the payload),
    // which above a few tens of KiB costs more than the message saved (forced doubling of 16 MiB
    // took 52-55 ms with it against 27 ms without, on shared memory).
    constexpr std::size_t kMaxCheckPayload = 64u << 10;
    piggyback_ = doubling_ && extra_ == 0 && levels_ > 0 && engine.options().check_consistency &&
                 state_.n * sizeof(T) + state_.tensors * sizeof(double) <= kMaxCheckPayload;
    if (state_.window) {
      // Every rank's choice alike (Topology::nodes_share_memory is agreed collectively): decided
      // from this rank's node alone, a node inside one machine read its cross partner in place
      // while that partner, on a node straddling machines, sent through MPI: both waited.
      node_in_place_ = node_size_ > 1 && hier_ && hier_->nodes_share_memory();
      state_.tokens_in.assign(static_cast<std::size_t>(std::max(node_size_, levels_ + 1)), 0);
    }
  }

  /// The bytes level 0 exchanges inside the check (piggyback()), packed now from the input.
  comm::CheckPayload check_payload() {
    if (!piggyback_) return {};
    state_.pack();
    return {state_.pack_out.data(), state_.pack_in.data(), state_.pack_out.size()};
  }

  comm::Schedule build();

 private:
  using Buffer = comm::Buffer;
  int msg() const { return static_cast<int>(state_.msg()); }
  int cross_rank(int x) const { return hier_ ? hier_->cross_peer(x) : x; }
  int real(int virt) const { return cross_rank(virt < extra_ ? 2 * virt : virt + extra_); }

  // Hierarchical: the node average, by reduce-scatter of a padded copy.
  void node_average();

  // Hierarchical: the partials of the pair just formed are summed over the node's slices.
  void node_sum(int tag);

  // Odd rank 2i+1 (i < q) hands its vector to 2i and gets the result back at the end.
  void fold_away();

  // One step handing the whole slice and its non-finite markers to `peer`.
  void send_slice(int peer, int tag, int tag_bad);

  // Even rank 2i (i < q) combines its partner's vector with its own as a.
  void fold_in();

  // One halving level: the partner, which half this rank keeps, and where raw inputs came from.
  struct Level {
    int l, partner;
    bool lower, raw_here;
    double mine_from, theirs_from;
    std::size_t keep_lo, keep_hi, send_lo, send_hi;
  };
  Level plan_level(int l);

  // Level l of vector halving, distance doubling, with partner v XOR 2^l: form the partials of
  // the kept half (the partner's piece received in chunks, each summed while the next moves, or
  // read in place), sum them over the 2^(l+1) holders, apply (at the last level chunk by chunk,
  // see gather_level).
  void halving_level(int l);

  // The exchange of halves in chunks; the partials of each received chunk are summed while the
  // next one moves (the last chunk's by the step that follows).
  template <class AB>
  void receive_in_chunks(const Level& lv, AB a_b);

  // ---- in place (adasum/impl/in_place.cpp has the protocol) ----------------------------------
  bool reads_in_place(int peer) const {
    return state_.window && (node_size_ == 1 || node_in_place_) && state_.block(peer) != nullptr;
  }
  bool every_level_in_place() const;
  // The partner's copy of this rank's slice: same offsets in its block (same node position).
  std::size_t slice_offset() const { return static_cast<std::size_t>(state_.S - state_.data); }

  // A step that exchanges one-byte messages with `peers` after MPI_Win_sync; its local work
  // (the caller's then(), which syncs again before reading) runs once every peer's has come.
  void tell_and_hear(const std::vector<int>& peers, int tag);
  // Before the first read of peers' inputs, unchanged since they submitted: with the Engine's
  // check on, the schedule starts only once every rank has submitted (Engine::submit), each
  // after syncing its window (allreduce_host), so the one-byte round would only repeat that.
  void hear_inputs_final(const std::vector<int>& peers, int tag);
  // Gather level l, in place: push this rank's piece into the partner's block (the last level's
  // apply already did), say so, and wait for the partner's piece.
  void gather_in_place(int l, int partner);

  // Hierarchical, in place: this rank's slice of the node average, read from every node peer's
  // block, written into its own block (a region no peer reads).
  void node_average_in_place();

  // Hierarchical, in place: push this rank's slice of the result into every node peer's block
  // (where only its owner reads, and only after the message that follows), then hear theirs.
  void node_gather_in_place();

  // Level l of whole-vector recursive doubling: exchange vectors and non-finite markers with
  // partner v XOR 2^l, then both apply the pair operator with the lower virtual rank's vector as a.
  void doubling_level(int l);

  // Recursive doubling over the 2^(l+1) virtual ranks holding pieces of a and b, in a fixed
  // order, so every holder gets bit-identical sums.
  void sum_partials_over_holders(int l);

  // All-gather in reverse: hand the partner this rank's piece of the level-l slice, in chunks.
  // At the last level the piece is still being applied: each chunk is applied while the chunk
  // before it is sent (halving_level applied the first).
  void gather_level(int l);

  void unfold() { send_slice(cross_rank(cross_index_ + 1), Tags::unfold, Tags::unfold_bad); }

  // Hierarchical: all-gather the slices inside the node.
  void node_gather();

  std::shared_ptr<State<T>> shared_;
  State<T>& state_;
  const Topology* hier_;
  const comm::Engine& engine_;
  comm::Schedule sched_{"adasum"};
  int rank_, node_size_ = 1, cross_size_ = 1, cross_index_ = 0, pow2_ = 1, levels_ = 0, extra_ = 0, virtual_rank_ = 0;
  bool doubling_ = false, raw_ = true, folds_in_ = false, last_lower_ = true, node_in_place_ = false,
       piggyback_ = false;
  std::size_t chunk_ = 1;  // elements per VHDD chunk
  bool chunk_everywhere_ = false;

  // A partner on this node is reached by MPI copying on the CPU, which a chunk's partial sums
  // cannot overlap: unless the caller set a chunk size, such levels go in one message (256 KiB
  // chunks cost 6-30 % there at 4-16 MiB, and saved 1.5-9 % at 16 MiB over the emulated link).
  std::size_t chunk_for(int partner) const {
    return chunk_everywhere_ || !engine_.shares_node(partner) ? chunk_ : std::numeric_limits<std::size_t>::max() / 2;
  }
  std::size_t lo_ = 0, hi_ = 0;
  std::vector<std::pair<std::size_t, std::size_t>> slices_;  // slice before each level
};

}  // namespace impl
}  // namespace adasum
}  // namespace kdist
