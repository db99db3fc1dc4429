#include <kdist/comm/communicator.hpp>
#include <kdist/core/error.hpp>

#include <string>
#include <vector>

#if KDIST_ENABLE_NCCL
#include <kdist/comm/impl/nccl_bootstrap.hpp>
#endif

namespace kdist {
namespace comm {

namespace impl {
void check_mpi(int rc, const char* call, int rank) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw BackendError(std::string("kdist::comm: ") + call + " failed" +
                     (rank >= 0 ? " on rank " + std::to_string(rank) : std::string()) + ": " +
                     std::string(text, static_cast<std::size_t>(len)));
}
}  // namespace impl

namespace {
const char* level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "unknown";
  }
}
}  // namespace

std::shared_ptr<MPI_Comm> Communicator::own(MPI_Comm c) {
  // kdist raises its own errors: MPI returns codes instead of aborting the job.
  if (c != MPI_COMM_NULL) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  return std::shared_ptr<MPI_Comm>(new MPI_Comm(c), [](MPI_Comm* p) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && *p != MPI_COMM_NULL) MPI_Comm_free(p);
    delete p;
  });
}

void require_thread_level(int level, const char* who) {
  int initialized = 0;
  impl::check_mpi(MPI_Initialized(&initialized), "MPI_Initialized", -1);
  if (!initialized) throw Error(std::string(who) + ": MPI is not initialised (kdist never initialises it)");
  int provided = MPI_THREAD_SINGLE;
  impl::check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread", -1);
  if (provided < level)
    throw Error(std::string(who) + ": needs MPI thread level " + level_name(level) + ", MPI provides " +
                level_name(provided) + "; initialise MPI with MPI_Init_thread(" + level_name(level) + ")");
}

Communicator::Communicator(MPI_Comm comm, std::string kind) : kind_(std::move(kind)) {
  // The engine calls MPI only from the caller's thread; FUNNELED is the least it needs.
  require_thread_level(MPI_THREAD_FUNNELED, "kdist::comm::Communicator");
  MPI_Comm dup = MPI_COMM_NULL;
  int world_rank = -1;
  impl::check_mpi(MPI_Comm_rank(comm, &world_rank), "MPI_Comm_rank", world_rank);
  impl::check_mpi(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup", world_rank);
  comm_ = own(dup);
  impl::check_mpi(MPI_Comm_rank(dup, &rank_), "MPI_Comm_rank", world_rank);
  impl::check_mpi(MPI_Comm_size(dup, &size_), "MPI_Comm_size", world_rank);
}

Communicator::Communicator(std::shared_ptr<MPI_Comm> comm, std::string kind, std::uint64_t engine_id)
    : comm_(std::move(comm)), kind_(std::move(kind)), engine_id_(engine_id) {
  impl::check_mpi(MPI_Comm_rank(*comm_, &rank_), "MPI_Comm_rank", -1);
  impl::check_mpi(MPI_Comm_size(*comm_, &size_), "MPI_Comm_size", rank_);
}

int Communicator::node_color(int node_size, int* local_rank, int* local_size) const {
  if (node_size > 0) {
    if (size_ % node_size != 0)
      throw InvalidArgument("kdist::comm::Communicator::node: imposed node size " + std::to_string(node_size) +
                            " does not divide the communicator size " + std::to_string(size_) + " (rank " +
                            std::to_string(rank_) + ")");
    *local_rank = rank_ % node_size;
    *local_size = node_size;
    return rank_ / node_size;
  }
  MPI_Comm shm = MPI_COMM_NULL;
  impl::check_mpi(MPI_Comm_split_type(*comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shm), "MPI_Comm_split_type",
                  rank_);
  auto owned_shm = own(shm);
  impl::check_mpi(MPI_Comm_rank(shm, local_rank), "MPI_Comm_rank", rank_);
  impl::check_mpi(MPI_Comm_size(shm, local_size), "MPI_Comm_size", rank_);
  // Node id: the lowest communicator rank on the node.
  int leader = rank_;
  impl::check_mpi(MPI_Allreduce(&rank_, &leader, 1, MPI_INT, MPI_MIN, shm), "MPI_Allreduce", rank_);
  return leader;
}

std::vector<int> Communicator::node_ids() const {
  int local_rank = 0, local_size = 0;
  int id = node_color(0, &local_rank, &local_size);
  std::vector<int> ids(static_cast<std::size_t>(size_));
  impl::check_mpi(MPI_Allgather(&id, 1, MPI_INT, ids.data(), 1, MPI_INT, *comm_), "MPI_Allgather", rank_);
  return ids;
}

Communicator Communicator::node(int node_size) const {
  int local_rank = 0, local_size = 0;
  const int color = node_color(node_size, &local_rank, &local_size);
  MPI_Comm c = MPI_COMM_NULL;
  impl::check_mpi(MPI_Comm_split(*comm_, color, rank_, &c), "MPI_Comm_split", rank_);
  return Communicator(own(c), "node", engine_id_);
}

Communicator Communicator::cross_node(int node_size) const {
  int local_rank = 0, local_size = 0;
  const int node_id = node_color(node_size, &local_rank, &local_size);
  int min_size = local_size, max_size = local_size;
  impl::check_mpi(MPI_Allreduce(&local_size, &min_size, 1, MPI_INT, MPI_MIN, *comm_), "MPI_Allreduce", rank_);
  impl::check_mpi(MPI_Allreduce(&local_size, &max_size, 1, MPI_INT, MPI_MAX, *comm_), "MPI_Allreduce", rank_);
  if (min_size != max_size)
    throw InvalidArgument("kdist::comm::Communicator::cross_node: nodes have unequal sizes (" +
                          std::to_string(min_size) + " to " + std::to_string(max_size) + " ranks; rank " +
                          std::to_string(rank_) + " is on a node of " + std::to_string(local_size) + ")");
  MPI_Comm c = MPI_COMM_NULL;
  // Ordered by node id, not by rank: a node's ranks need not be in the same order as another's
  // (nodes {0,3} and {1,2}), and keyed by rank the group of local position 0 would put node {0,3}
  // first while that of position 1 put node {1,2} first. Every cross group must list the nodes in
  // one order: hierarchical Adasum pairs slice l of node x with slice l of node y by cross rank.
  impl::check_mpi(MPI_Comm_split(*comm_, local_rank, node_id, &c), "MPI_Comm_split", rank_);
  return Communicator(own(c), "cross-node", engine_id_);
}

#if KDIST_ENABLE_NCCL
nccl::Comm& Communicator::nccl() const {
  if (!nccl_) nccl_ = nccl::bootstrap(*comm_);
  return *nccl_;
}
#endif

int Communicator::rank_in(const Communicator& other, int r) const {
  MPI_Group mine, theirs;
  impl::check_mpi(MPI_Comm_group(*comm_, &mine), "MPI_Comm_group", rank_);
  impl::check_mpi(MPI_Comm_group(other.raw(), &theirs), "MPI_Comm_group", rank_);
  int out = MPI_UNDEFINED;
  const int rc = MPI_Group_translate_ranks(mine, 1, &r, theirs, &out);
  MPI_Group_free(&mine);
  MPI_Group_free(&theirs);
  impl::check_mpi(rc, "MPI_Group_translate_ranks", rank_);
  return out;
}

}  // namespace comm
}  // namespace kdist
