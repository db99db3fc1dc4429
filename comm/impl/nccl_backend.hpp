// NCCL calls behind kdist's device-buffer collectives. Like the cuSOLVER unit it includes no
// Kokkos and no MPI: the unique id is bootstrapped by the caller (over MPI in comm/, locally in
// perf/gpu_smoke), every call takes the Kokkos stream, and every status is checked.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <memory>

namespace kdist {
namespace comm {
namespace nccl {

enum class DType { float32, float64 };
enum class Reduce { sum, average };

/// Opaque 128-byte ncclUniqueId, created on one rank and broadcast by the caller.
using UniqueId = std::array<char, 128>;
UniqueId make_unique_id();

/// Owning NCCL communicator (ncclCommDestroy on destruction).
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
  void send(const void* buffer, std::size_t count, DType dtype, int peer, cudaStream_t stream);
  void recv(void* buffer, std::size_t count, DType dtype, int peer, cudaStream_t stream);
  /// Groups the sends/recvs issued in between into one NCCL launch (pairwise exchanges).
  void group_start();
  void group_end();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace nccl
}  // namespace comm
}  // namespace kdist
