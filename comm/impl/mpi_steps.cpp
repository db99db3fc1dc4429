// Posting a schedule step on MPI: its point-to-point transfers on the p2p wire (tag = the
// operation's tag block + the step's tag) and its collective on the payload wire or a sub-group,
// all nonblocking; the Engine tests the requests on every call. Buffers are host memory, or device
// memory with GPU-aware MPI; with NCCL a step with device buffers goes to post_step_nccl. Counts
// past what one call carries: below.
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
// 2^31-1 elements is refused.
#if MPI_VERSION >= 4
using P2pCount = MPI_Count;
#define KDIST_MPI_P2P(name) name##_c
#else
using P2pCount = int;
#define KDIST_MPI_P2P(name) name
#endif

P2pCount as_count(std::size_t n, const std::string& label) {
  if (n > static_cast<std::size_t>(std::numeric_limits<P2pCount>::max()))
    kdist::impl::throw_invalid("kdist::comm::Engine", "'" + label + "' has " + std::to_string(n) +
                                                          " elements; one MPI call moves at most " +
                                                          std::to_string(std::numeric_limits<P2pCount>::max()));
  return static_cast<P2pCount>(n);
}

// Collectives keep int counts: MPICH 4.0.2's large-count MPI_Ibcast_c fails past 2^31-1 elements
// ("Invalid communicator") and MPI_Ireduce_scatter_block_c asserts. A collective of more than
// EngineCore::call_elements elements (per rank block) goes out as consecutive calls instead, each
// its own request. Every rank splits the same count the same way, and MPI matches a
// communicator's collectives in the order they are posted.

/// f(offset, length) for consecutive pieces of [0, n) of at most `piece` elements; one (empty)
/// piece when n is 0.
template <class F>
void for_each_piece(std::size_t n, std::size_t piece, F f) {
  std::size_t done = 0;
  do {
    const std::size_t len = std::min(piece, n - done);
    f(done, static_cast<int>(len));
    done += len;
  } while (done < n);
}

struct Posting {
  EngineCore& c;
  Operation& op;
  void add(MPI_Request r) {
    op.requests.push_back(r);
    ++c.stats.payload_calls;
    ++c.stats.collective_calls;
  }
};

/// A reduce-scatter's or all-gather's buffers: `block` (its out or in) holds one rank's block.
struct Blocks {
  MPI_Datatype type;
  std::size_t n, bytes;  ///< elements per block, bytes per element
  char *in, *out;
  Blocks(const Schedule::Collective& k, const Buffer& block)
      : type(mpi_type(block.dtype)),
        n(block.count),
        bytes(size_of(block.dtype)),
        in(static_cast<char*>(k.in.data)),
        out(static_cast<char*>(k.out.data)) {}
};

// Reduce-scatter of blocks past the limit: one reduce per member and piece, rooted at the member
// whose block it is (in = member 0's n elements, member 1's, ...).
void post_reduce_scatter(Posting p, const Blocks& b, ReduceOp op, MPI_Comm g) {
  MPI_Request r;
  if (b.n <= p.c.call_elements) {
    p.c.ok(MPI_Ireduce_scatter_block(b.in, b.out, static_cast<int>(b.n), b.type, mpi_op(op), g, &r),
           "MPI_Ireduce_scatter_block");
    return p.add(r);
  }
  int members = 0;
  p.c.ok(MPI_Comm_size(g, &members), "MPI_Comm_size");
  for_each_piece(b.n, p.c.call_elements, [&](std::size_t at, int len) {
    for (int root = 0; root < members; ++root) {
      char* const block = b.in + (static_cast<std::size_t>(root) * b.n + at) * b.bytes;
      p.c.ok(MPI_Ireduce(block, b.out + at * b.bytes, len, b.type, mpi_op(op), root, g, &r), "MPI_Ireduce");
      p.add(r);
    }
  });
}

// All-gather of blocks past the limit: per piece, each member's part lands n elements after the
// previous member's, so it is received as one element of a type `len` long whose extent is n.
void post_allgather(Posting p, const Blocks& b, MPI_Comm g) {
  MPI_Request r;
  if (b.n <= p.c.call_elements) {
    const int n = static_cast<int>(b.n);
    p.c.ok(MPI_Iallgather(b.in, n, b.type, b.out, n, b.type, g, &r), "MPI_Iallgather");
    return p.add(r);
  }
  for_each_piece(b.n, p.c.call_elements, [&](std::size_t at, int len) {
    MPI_Datatype part = MPI_DATATYPE_NULL, spaced = MPI_DATATYPE_NULL;
    p.c.ok(MPI_Type_contiguous(len, b.type, &part), "MPI_Type_contiguous");
    int rc = MPI_Type_create_resized(part, 0, static_cast<MPI_Aint>(b.n * b.bytes), &spaced);
    MPI_Type_free(&part);
    p.c.ok(rc, "MPI_Type_create_resized");
    rc = MPI_Type_commit(&spaced);
    if (rc == MPI_SUCCESS)
      rc = MPI_Iallgather(b.in + at * b.bytes, len, b.type, b.out + at * b.bytes, 1, spaced, g, &r);
    MPI_Type_free(&spaced);  // MPI keeps it until the call completes
    p.c.ok(rc, "MPI_Iallgather");
    p.add(r);
  });
}

void post_collective(EngineCore& c, const Schedule::Collective& k, Operation& op) {
  using K = Schedule::CollectiveKind;
  const MPI_Comm g = c.group_comm(k.group);
  const MPI_Datatype t = mpi_type(k.out.dtype);
  const std::size_t es = size_of(k.out.dtype);
  char* const out = static_cast<char*>(k.out.data);
  Posting p{c, op};
  MPI_Request r;
  switch (k.kind) {
    case K::allreduce:
      return for_each_piece(k.out.count, c.call_elements, [&](std::size_t at, int n) {
        c.ok(MPI_Iallreduce(MPI_IN_PLACE, out + at * es, n, t, mpi_op(k.op), g, &r), "MPI_Iallreduce");
        p.add(r);
      });
    case K::broadcast:
      return for_each_piece(k.out.count, c.call_elements, [&](std::size_t at, int n) {
        c.ok(MPI_Ibcast(out + at * es, n, t, k.root, g, &r), "MPI_Ibcast");
        p.add(r);
      });
    case K::reduce_scatter:
      return post_reduce_scatter(p, Blocks(k, k.out), k.op, g);
    case K::allgather:
      return post_allgather(p, Blocks(k, k.in), g);
    case K::none:
      return;
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
    const P2pCount n = as_count(t.buffer.count, op.what.label);
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
