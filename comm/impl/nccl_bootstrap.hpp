// Creates the NCCL communicator of an MPI communicator: rank 0 makes the unique id, MPI
// broadcasts it, every rank calls ncclCommInitRank. Collective over `comm`.
#pragma once

#include <mpi.h>

#include <memory>

#include "nccl_backend.hpp"

namespace kdist {
namespace comm {
namespace nccl {

std::unique_ptr<Comm> bootstrap(MPI_Comm comm);

}  // namespace nccl
}  // namespace comm
}  // namespace kdist
