#include "nccl_bootstrap.hpp"

#include <kdist/core/error.hpp>

#include <string>
#include <vector>

namespace kdist {
namespace comm {
namespace nccl {

namespace {
// NCCL answers two ranks on one GPU with "invalid usage" (its log says "Duplicate GPU"): every
// rank gathers the bus ids first, so each raises the same error naming the ranks and the GPU.
void require_one_gpu_per_rank(MPI_Comm comm, int rank, int size) {
  const BusId mine = current_bus_id();
  std::vector<BusId> all(static_cast<std::size_t>(size));
  if (MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(), static_cast<int>(mine.size()),
                    MPI_CHAR, comm) != MPI_SUCCESS)
    throw BackendError("kdist::comm::nccl::bootstrap: MPI_Allgather of the GPUs' bus ids failed on rank " +
                       std::to_string(rank));
  for (int s = 1; s < size; ++s)
    for (int r = 0; r < s; ++r)
      if (all[static_cast<std::size_t>(r)] == all[static_cast<std::size_t>(s)])
        throw BackendError("kdist::comm::Engine: ranks " + std::to_string(r) + " and " + std::to_string(s) +
                           " use the same GPU (PCI " + std::string(all[static_cast<std::size_t>(s)].data()) +
                           "); NCCL needs one GPU per rank: give each rank its own device (one visible GPU per "
                           "local rank, or Kokkos' --kokkos-map-device-id-by=mpi_rank), or build without "
                           "KDIST_ENABLE_NCCL to stage device views through MPI (rank " +
                           std::to_string(rank) + ")");
}
}  // namespace

std::unique_ptr<Comm> bootstrap(MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  require_one_gpu_per_rank(comm, rank, size);
  UniqueId id{};
  if (rank == 0) id = make_unique_id();
  const int rc = MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, comm);
  if (rc != MPI_SUCCESS)
    throw BackendError("kdist::comm::nccl::bootstrap: MPI_Bcast of the NCCL unique id failed on rank " +
                       std::to_string(rank));
  return std::unique_ptr<Comm>(new Comm(id, size, rank));
}

}  // namespace nccl
}  // namespace comm
}  // namespace kdist
