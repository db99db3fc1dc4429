#include <kdist/comm/shared_window.hpp>

#include <mpi.h>

#include <cstdint>
#include <exception>
#include <string>

namespace kdist {
namespace comm {

struct SharedWindow::Impl {
  Communicator node;
  MPI_Win win = MPI_WIN_NULL;
  explicit Impl(Communicator c) : node(std::move(c)) {}
};

namespace {
// Every rank asks for the same size, or every rank throws (the Engine's checked max of [b, -b]).
void agree_on_bytes(Engine& engine, std::size_t bytes) {
  const auto b = static_cast<std::int64_t>(bytes);
  const std::vector<std::int64_t> v =
      engine.allreduce_values<std::int64_t>({b, -b}, ReduceOp::max, "shared_window/bytes");
  if (v[0] != -v[1])
    kdist::impl::throw_invalid("kdist::comm::SharedWindow", "ranks ask for different sizes: " + std::to_string(-v[1]) +
                                                                " to " + std::to_string(v[0]) + " bytes (rank " +
                                                                std::to_string(engine.rank()) + " asks " +
                                                                std::to_string(bytes) + ")");
}
}  // namespace

SharedWindow::SharedWindow(Engine& engine, std::size_t bytes)
    : engine_(&engine), uncaught_(std::uncaught_exceptions()), bytes_(bytes), engine_rank_(engine.rank()) {
  agree_on_bytes(engine, bytes);
  impl_.reset(new Impl(engine.node_group()));
  const Communicator& node = impl_->node;
  node_size_ = node.size();
  void* base = nullptr;
  // Size 0 is legal for MPI; one byte keeps every block's address distinct and queryable.
  impl::check_mpi(MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes > 0 ? bytes : 1), 1, MPI_INFO_NULL, node.raw(),
                                          &base, &impl_->win),
                  "MPI_Win_allocate_shared", engine_rank_);
  impl::check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, impl_->win), "MPI_Win_lock_all", engine_rank_);
  blocks_.assign(static_cast<std::size_t>(engine.size()), nullptr);
  for (int l = 0; l < node_size_; ++l) {
    MPI_Aint size = 0;
    int unit = 1;
    void* p = nullptr;
    impl::check_mpi(MPI_Win_shared_query(impl_->win, l, &size, &unit, &p), "MPI_Win_shared_query", engine_rank_);
    blocks_[static_cast<std::size_t>(node.rank_in(engine.communicator(), l))] = p;
  }
}

SharedWindow::~SharedWindow() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || impl_->win == MPI_WIN_NULL) return;
  // MPI_Win_free waits for every rank of the node. A rank unwinding from an exception gets here
  // before its Engine's destructor, which is what would tell the peers: without telling them
  // first, they wait for this rank in their next operation while it waits for them here. Failed,
  // the Engine makes their pending and next operations raise RemoteError; they unwind, and their
  // windows' destructors come here too. An Engine already failed or finished has nothing to say.
  if (std::uncaught_exceptions() > uncaught_ && engine_->healthy()) {
    try {
      engine_->fail(std::make_exception_ptr(
          Error("kdist::comm::SharedWindow: rank " + std::to_string(engine_rank_) + " destroyed its window of " +
                std::to_string(bytes_) + " bytes while an exception propagated (that rank reports its error itself)")));
    } catch (...) {  // a destructor: nothing may escape; the free below still lets the peers go
    }
  }
  MPI_Win_unlock_all(impl_->win);
  MPI_Win_free(&impl_->win);
}

void SharedWindow::sync() const {
  impl::check_mpi(MPI_Win_sync(impl_->win), "MPI_Win_sync", engine_rank_);
}

}  // namespace comm
}  // namespace kdist
