#include "nccl_bootstrap.hpp"

#include <kdist/core/error.hpp>

#include <string>

namespace kdist {
namespace comm {
namespace nccl {

std::unique_ptr<Comm> bootstrap(MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
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
