// NCCL calls behind the Engine's device-buffer steps (posted by comm/impl/nccl_steps.cpp). Like
// the cuSOLVER unit it includes no Kokkos and no MPI: the unique id is bootstrapped by the caller
// (over the Engine's MPI wire in comm/, locally in perf/gpu_smoke), every call takes the Kokkos
// instance's stream, and every status is checked. Completion is observed through an Event
// recorded on that stream after the calls, so the Engine polls it like an MPI request.
#pragma once

#include <cuda_runtime_api.h>
#include <kdist/core/dtype.hpp>

#include <array>
#include <cstddef>
#include <memory>

namespace kdist {
namespace comm {
namespace nccl {

using kdist::DType;
enum class Reduce { sum, average, min, max };

/// A CUDA event recorded on a stream: done() once recorded and every call enqueued before
/// record() finished (never before it is recorded: a group's calls launch at its outermost end).
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t stream);
  bool done() const;

 private:
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
};

/// Opaque 128-byte ncclUniqueId, created on one rank and broadcast by the caller.
using UniqueId = std::array<char, 128>;
UniqueId make_unique_id();
/// The PCI bus id of this thread's current CUDA device ("0000:3C:00.0"): NCCL refuses two ranks
/// of one communicator on one GPU, and the bootstrap names them first.
using BusId = std::array<char, 32>;
BusId current_bus_id();

/// Owning NCCL communicator (ncclCommDestroy on destruction, or abort() before it).
class Comm {
 public:
  Comm(const UniqueId& id, int nranks, int rank);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  void allreduce(const void* send, void* recv, std::size_t count, DType dtype, Reduce op, cudaStream_t stream);
  void broadcast(void* buffer, std::size_t count, DType dtype, int root, cudaStream_t stream);
  /// recv (count) := this rank's block of the reduction of send (count x size()).
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, Reduce op, cudaStream_t stream);
  /// recv (count x size()) := every rank's send (count).
  void allgather(const void* send, void* recv, std::size_t count, DType dtype, cudaStream_t stream);
  void send(const void* buffer, std::size_t count, DType dtype, int peer, cudaStream_t stream);
  void recv(void* buffer, std::size_t count, DType dtype, int peer, cudaStream_t stream);
  /// Groups the sends/recvs issued in between into one NCCL launch (pairwise exchanges).
  void group_start();
  void group_end();
  /// ncclCommAbort: stops this rank's NCCL kernels still waiting for a peer; no call may follow.
  void abort() noexcept;
  bool aborted() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace nccl
}  // namespace comm
}  // namespace kdist
