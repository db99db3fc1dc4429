// SharedWindow: one block of host memory per rank, allocated as an MPI-3 shared-memory window
// (MPI_Win_allocate_shared) over the ranks of this Engine that share a node, so that each of them
// can load and store every node peer's block in place. Composite schedules (adasum/) use it to
// read a partner's data where it lies instead of copying it through MPI.
//
// - Construction is collective over the Engine (node_group, then a checked agreement on `bytes`:
//   ranks that ask for different sizes get kdist::InvalidArgument on every rank). Destruction
//   frees the window, collective over the node: destroy windows in the same order everywhere,
//   and before their Engine.
// - Destroyed while an exception propagates (a rank that throws with the window alive), it first
//   fails the Engine, which tells every peer (they raise RemoteError, unwind and free their
//   blocks too), and only then frees the window: waiting in the collective free without telling
//   them left the peers waiting in their next operation, and this rank waiting for them, for ever.
// - block(r) is engine rank r's block, or nullptr when r is on another node. The blocks stay in
//   a passive-target epoch (lock_all) for the window's lifetime.
// - Synchronisation is the caller's: between writing a block and telling a peer (a message) call
//   sync(), and again after hearing from the peer, before reading its block (MPI_Win_sync, the
//   unified memory model's ordering point).
// - The window must outlive every operation that uses it.
#pragma once

#include <kdist/comm/engine.hpp>

#include <cstddef>
#include <memory>
#include <vector>

namespace kdist {
namespace comm {

class SharedWindow {
 public:
  SharedWindow(Engine& engine, std::size_t bytes);
  ~SharedWindow();
  SharedWindow(const SharedWindow&) = delete;
  SharedWindow& operator=(const SharedWindow&) = delete;

  std::size_t bytes() const noexcept { return bytes_; }
  void* local() const noexcept { return block(engine_rank_); }
  /// Engine rank r's block; nullptr when r does not share this rank's node.
  void* block(int engine_rank) const noexcept {
    return engine_rank >= 0 && engine_rank < static_cast<int>(blocks_.size())
               ? blocks_[static_cast<std::size_t>(engine_rank)]
               : nullptr;
  }
  /// Ranks on this node (this rank included).
  int node_size() const noexcept { return node_size_; }
  const Engine* engine() const noexcept { return engine_; }
  /// MPI_Win_sync: orders this rank's stores and loads on the window against its messages.
  void sync() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Engine* engine_;
  int uncaught_ = 0;  // std::uncaught_exceptions() at construction
  std::size_t bytes_ = 0;
  int engine_rank_ = 0, node_size_ = 1;
  std::vector<void*> blocks_;  // by engine rank
};

}  // namespace comm
}  // namespace kdist
