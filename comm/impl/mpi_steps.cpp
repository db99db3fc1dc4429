// Posting a schedule step on MPI: its point-to-point transfers on the p2p wire (tag = the
// operation's tag block + the step's tag) and its collective on the payload wire or a sub-group,
// all nonblocking; the Engine tests the requests on every call. Buffers are host memory, or device
// memory with GPU-aware MPI; with NCCL a step with device buffers goes to post_step_nccl.
#include <kdist/comm/impl/engine_core.hpp>

#include <algorithm>
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

// Point-to-point transfers: MPI 4's large-count calls (MPI_Isend_c, MPI_Irecv_c) move any count
// that fits MPI_Count; an MPI 3 library (Open MPI 4) takes int counts, so there a message past
// 2^31-1 elements is refused. Collectives keep int counts everywhere: MPICH 4.0.2's large-count
// MPI_Ibcast_c fails past 2^31-1 ("Invalid communicator") and MPI_Ireduce_scatter_block_c
// asserts, so all-reduce and broadcast are split instead (below).
#if MPI_VERSION >= 4
using P2pCount = MPI_Count;
#define KDIST_MPI_P2P(name) name##_c
#else
using P2pCount = int;
#define KDIST_MPI_P2P(name) name
#endif

template <class Count>
Count as_count(std::size_t n, const std::string& label, const char* unit) {
  if (n > static_cast<std::size_t>(std::numeric_limits<Count>::max()))
    kdist::impl::throw_invalid("kdist::comm::Engine", "'" + label + "' has " + std::to_string(n) + " elements" + unit +
                                                          "; one MPI call moves at most " +
                                                          std::to_string(std::numeric_limits<Count>::max()));
  return static_cast<Count>(n);
}

/// An element-wise collective (all-reduce, broadcast) of any count, as consecutive calls of at most
/// 2^31-1 elements, each its own request. Every rank splits the same count the same way, and MPI
/// matches a communicator's collectives in the order they are posted.
template <class Post>
void post_in_pieces(EngineCore& c, const Buffer& b, Post post, Operation& op) {
  constexpr std::size_t piece = static_cast<std::size_t>(std::numeric_limits<int>::max());
  char* const data = static_cast<char*>(b.data);
  std::size_t done = 0;
  do {
    const std::size_t n = std::min(piece, b.count - done);
    MPI_Request r;
    post(data + done * size_of(b.dtype), static_cast<int>(n), &r);
    op.requests.push_back(r);
    ++c.stats.payload_calls;
    ++c.stats.collective_calls;
    done += n;
  } while (done < b.count);
}

void post_collective(EngineCore& c, const Schedule::Collective& k, Operation& op) {
  using K = Schedule::CollectiveKind;
  MPI_Comm g = c.group_comm(k.group);
  const MPI_Datatype t = mpi_type(k.out.dtype);
  const std::string& label = op.what.label;
  MPI_Request r;
  switch (k.kind) {
    case K::allreduce:
      return post_in_pieces(
          c, k.out,
          [&](void* p, int n, MPI_Request* req) {
            c.ok(MPI_Iallreduce(MPI_IN_PLACE, p, n, t, mpi_op(k.op), g, req), "MPI_Iallreduce");
          },
          op);
    case K::broadcast:
      return post_in_pieces(
          c, k.out, [&](void* p, int n, MPI_Request* req) { c.ok(MPI_Ibcast(p, n, t, k.root, g, req), "MPI_Ibcast"); },
          op);
    case K::reduce_scatter: {
      const int n = as_count<int>(k.out.count, label, " per rank");
      c.ok(MPI_Ireduce_scatter_block(k.in.data, k.out.data, n, t, mpi_op(k.op), g, &r), "MPI_Ireduce_scatter_block");
      break;
    }
    case K::allgather: {
      const int n = as_count<int>(k.in.count, label, " per rank");
      c.ok(MPI_Iallgather(k.in.data, n, t, k.out.data, n, t, g, &r), "MPI_Iallgather");
      break;
    }
    case K::none:
      return;
  }
  op.requests.push_back(r);
  ++c.stats.payload_calls;
  ++c.stats.collective_calls;
}

}  // namespace

void post_step(EngineCore& c, Operation& op, const Schedule::Step& s) {
  op.requests.clear();
#if KDIST_ENABLE_NCCL
  if (s.device()) return post_step_nccl(c, op, s);
#endif
  for (const auto& t : s.transfers) {
    MPI_Request r;
    const P2pCount n = as_count<P2pCount>(t.buffer.count, op.what.label, "");
    const int tag = op.tag_base + t.tag;
    if (t.is_send) {
      c.ok(KDIST_MPI_P2P(MPI_Isend)(t.buffer.data, n, mpi_type(t.buffer.dtype), t.peer, tag, c.p2p, &r), "MPI_Isend");
      if (op.seq >= 0) c.stats.bytes_sent += static_cast<long long>(size_of(t.buffer.dtype)) * n;
    } else {
      c.ok(KDIST_MPI_P2P(MPI_Irecv)(t.buffer.data, n, mpi_type(t.buffer.dtype), t.peer, tag, c.p2p, &r), "MPI_Irecv");
    }
    op.requests.push_back(r);
    ++c.stats.payload_calls;
  }
  if (s.collective.kind != Schedule::CollectiveKind::none) {
    post_collective(c, s.collective, op);
    --op.collectives_left;
  }
  op.step_posted = true;
}

#undef KDIST_MPI_P2P

}  // namespace impl
}  // namespace comm
}  // namespace kdist
