// Communicator: kdist's handle on a group of ranks. It owns a duplicate of the user's MPI
// communicator (kdist never talks on the user's communicator or MPI_COMM_WORLD) and derives
// node-local and cross-node communicators, optionally with an imposed node size so that one
// machine can emulate N nodes of k ranks. On NCCL builds it also owns an NCCL communicator
// bootstrapped over MPI (see comm/impl/nccl_backend.hpp).
#pragma once

#include <mpi.h>
#include <kdist/config.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#if KDIST_ENABLE_NCCL
#include <kdist/comm/impl/nccl_backend.hpp>
#endif

namespace kdist {
namespace comm {

/// Throws kdist::Error naming `who` and the levels unless MPI is initialised with at least `level`.
void require_thread_level(int level, const char* who);

class Communicator {
 public:
  /// Duplicates `comm` (collective over it). `kind` names it in cost models and messages.
  explicit Communicator(MPI_Comm comm, std::string kind = "world");

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const std::string& kind() const noexcept { return kind_; }
  /// kdist's private duplicate (never free it). Engines do not talk on it: each duplicates it.
  MPI_Comm raw() const noexcept { return *comm_; }
  /// Ranks on the same node. With node_size > 0 nodes are imposed: consecutive blocks of
  /// node_size ranks; size() must be a multiple of node_size. Otherwise MPI_Comm_split_type
  /// (shared memory). Collective (blocking) over this communicator, which no Engine talks on:
  /// call it in the same order on every rank, like any MPI collective. For groups that Schedule
  /// steps use, ask the Engine (Engine::node_group), which runs the split inside its stream.
  Communicator node(int node_size = 0) const;
  /// Ranks with the same position inside their node, one per node (the cross-node ring), in
  /// the order of their nodes (a node: its lowest rank, or its block index when imposed), the same
  /// order in every such group even when nodes interleave ranks. Throws if nodes have unequal sizes.
  /// Collective.
  Communicator cross_node(int node_size = 0) const;

#if KDIST_ENABLE_NCCL
  /// The NCCL communicator over the same ranks, bootstrapped over MPI on first use (collective:
  /// every rank must make the first call). Pass the Kokkos instance's cuda_stream() to its calls.
  nccl::Comm& nccl() const;
#endif

  /// For every rank, its shared-memory node's id (the lowest rank there). Collective, like node().
  std::vector<int> node_ids() const;

  /// Rank in `other` of this communicator's rank `r` (MPI_UNDEFINED if not a member).
  int rank_in(const Communicator& other, int r) const;

 private:
  friend class Engine;
  /// Id of the Engine whose wire this is a group of (0: a user communicator).
  std::uint64_t engine_id() const noexcept {
    return engine_id_;
  }
  Communicator(std::shared_ptr<MPI_Comm> comm, std::string kind, std::uint64_t engine_id = 0);
  /// Takes ownership of `comm` (freed with the last copy) and makes it return MPI errors.
  static std::shared_ptr<MPI_Comm> own(MPI_Comm comm);
  int node_color(int node_size, int* local_rank, int* local_size) const;
  std::shared_ptr<MPI_Comm> comm_;
#if KDIST_ENABLE_NCCL
  mutable std::shared_ptr<nccl::Comm> nccl_;
#endif
  int rank_ = 0;
  int size_ = 1;
  std::string kind_;
  std::uint64_t engine_id_ = 0;
};

namespace impl {
/// Throws kdist::BackendError naming the MPI call, the error string and the rank.
void check_mpi(int rc, const char* call, int rank);
}  // namespace impl

}  // namespace comm
}  // namespace kdist
