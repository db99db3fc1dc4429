// Posting a schedule step on MPI: its point-to-point transfers on the p2p wire (tag = the
// operation's tag block + the step's tag) and its collective on the payload wire or a sub-group,
// all nonblocking; the Engine tests the requests on every call. Buffers are host memory, or device
// memory with GPU-aware MPI; with NCCL a step with device buffers goes to post_step_nccl.
#include <kdist/comm/impl/engine_core.hpp>

#include <limits>

namespace kdist {
namespace comm {
namespace impl {

namespace {

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::float32:
      return MPI_FLOAT;
    case DType::float64:
      return MPI_DOUBLE;
    case DType::int32:
      return MPI_INT;
    case DType::int64:
      return MPI_INT64_T;
    case DType::bytes:
      return MPI_BYTE;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::min ? MPI_MIN : op == ReduceOp::max ? MPI_MAX : MPI_SUM;
}

int as_count(std::size_t n, const std::string& label) {
  if (n > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    kdist::impl::throw_invalid("kdist::comm::Engine", "'" + label + "' has " + std::to_string(n) +
                                                          " elements; one MPI call moves at most 2^31-1");
  return static_cast<int>(n);
}

void post_collective(EngineCore& c, const Schedule::Collective& k, const std::string& label, MPI_Request* r) {
  using K = Schedule::CollectiveKind;
  MPI_Comm g = c.group_comm(k.group);
  const MPI_Datatype t = mpi_type(k.out.dtype);
  const int n = as_count(k.kind == K::allgather ? k.in.count : k.out.count, label);
  switch (k.kind) {
    case K::allreduce:
      c.ok(MPI_Iallreduce(MPI_IN_PLACE, k.out.data, n, t, mpi_op(k.op), g, r), "MPI_Iallreduce");
      break;
    case K::reduce_scatter:
      c.ok(MPI_Ireduce_scatter_block(k.in.data, k.out.data, n, t, mpi_op(k.op), g, r), "MPI_Ireduce_scatter_block");
      break;
    case K::allgather:
      c.ok(MPI_Iallgather(k.in.data, n, t, k.out.data, n, t, g, r), "MPI_Iallgather");
      break;
    case K::broadcast:
      c.ok(MPI_Ibcast(k.out.data, n, t, k.root, g, r), "MPI_Ibcast");
      break;
    case K::none:
      break;
  }
}

}  // namespace

void post_step(EngineCore& c, Operation& op, const Schedule::Step& s) {
  op.requests.clear();
#if KDIST_ENABLE_NCCL
  if (s.device()) return post_step_nccl(c, op, s);
#endif
  for (const auto& t : s.transfers) {
    MPI_Request r;
    const int n = as_count(t.buffer.count, op.what.label);
    const int tag = op.tag_base + t.tag;
    if (t.is_send) {
      c.ok(MPI_Isend(t.buffer.data, n, mpi_type(t.buffer.dtype), t.peer, tag, c.p2p, &r), "MPI_Isend");
      if (op.seq >= 0) c.stats.bytes_sent += static_cast<long long>(size_of(t.buffer.dtype)) * n;
    } else {
      c.ok(MPI_Irecv(t.buffer.data, n, mpi_type(t.buffer.dtype), t.peer, tag, c.p2p, &r), "MPI_Irecv");
    }
    op.requests.push_back(r);
    ++c.stats.payload_calls;
  }
  if (s.collective.kind != Schedule::CollectiveKind::none) {
    MPI_Request r;
    post_collective(c, s.collective, op.what.label, &r);
    op.requests.push_back(r);
    ++c.stats.payload_calls;
    ++c.stats.collective_calls;
    --op.collectives_left;
  }
  op.step_posted = true;
}

}  // namespace impl
}  // namespace comm
}  // namespace kdist
