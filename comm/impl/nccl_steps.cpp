// Posting a schedule step with device buffers on NCCL (NCCL builds): the step's transfers and
// collective as one NCCL group on the caller's stream, at the same point of the Engine's ordered
// stream as an MPI step would be; the step completes when an event recorded after it does. Every
// step posted in one progress pass sits in one outer group, launched when the pass ends: a send
// and the receive it matches on this rank must share a group, and a receive launched alone would
// block its stream before this rank's later sends (user send/recv are held for the next pass,
// comm/engine.cpp). The
// NCCL communicator is bootstrapped over the payload wire when the Engine is made. NCCL runs on
// the whole Engine: a collective on a sub-group with device buffers needs staging or GPU-aware MPI.
#include <kdist/comm/impl/engine_core.hpp>

#if KDIST_ENABLE_NCCL

namespace kdist {
namespace comm {
namespace impl {

namespace {
nccl::Reduce nccl_op(ReduceOp op) {
  return op == ReduceOp::min ? nccl::Reduce::min : op == ReduceOp::max ? nccl::Reduce::max : nccl::Reduce::sum;
}

// The step's NCCL calls, inside the group its caller opened.
void enqueue_nccl_calls(EngineCore& c, nccl::Comm& n, const Schedule::Step& s, cudaStream_t stream) {
  using K = Schedule::CollectiveKind;
  for (const auto& t : s.transfers) {
    if (t.is_send)
      n.send(t.buffer.data, t.buffer.count, t.buffer.dtype, t.peer, stream);
    else
      n.recv(t.buffer.data, t.buffer.count, t.buffer.dtype, t.peer, stream);
    ++c.stats.payload_calls;
  }
  const auto& k = s.collective;
  switch (k.kind) {
    case K::allreduce:
      n.allreduce(k.out.data, k.out.data, k.out.count, k.out.dtype, nccl_op(k.op), stream);
      break;
    case K::reduce_scatter:
      n.reduce_scatter(k.in.data, k.out.data, k.out.count, k.out.dtype, nccl_op(k.op), stream);
      break;
    case K::allgather:
      n.allgather(k.in.data, k.out.data, k.in.count, k.in.dtype, stream);
      break;
    case K::broadcast:
      n.broadcast(k.out.data, k.out.count, k.out.dtype, k.root, stream);
      break;
    case K::none:
      break;
  }
}
}  // namespace

void post_step_nccl(EngineCore& c, Operation& op, const Schedule::Step& s) {
  using K = Schedule::CollectiveKind;
  if (s.collective.kind != K::none && s.collective.group.sub())
    kdist::impl::throw_invalid("kdist::comm::Engine",
                               "'" + op.what.label +
                                   "': a collective on a sub-group with device buffers needs "
                                   "host staging or GPU-aware MPI (NCCL runs on the whole Engine)");
  auto stream = static_cast<cudaStream_t>(s.stream);
  nccl::Comm& n = *c.nccl;
  n.group_start();
  try {
    enqueue_nccl_calls(c, n, s, stream);
  } catch (...) {
    try {
      n.group_end();  // the thread's group depth back to the pass's (the Engine fails over this)
    } catch (...) {
    }
    throw;
  }
  n.group_end();
  if (s.collective.kind != K::none) {
    ++c.stats.payload_calls;
    ++c.stats.collective_calls;
    --op.collectives_left;
  }
  op.nccl_done = std::make_shared<nccl::Event>();
  c.nccl_unlaunched.emplace_back(op.nccl_done, s.stream);
  op.step_posted = true;
}

void begin_nccl_pass(EngineCore& c) {
  if (!c.nccl) return;
  c.nccl->group_start();
  c.nccl_pass_open = true;
}

void end_nccl_pass(EngineCore& c) {
  if (!c.nccl_pass_open) return;
  c.nccl_pass_open = false;
  auto posted = std::move(c.nccl_unlaunched);
  c.nccl_unlaunched.clear();
  try {
    c.nccl->group_end();
    for (auto& [event, stream] : posted) event->record(static_cast<cudaStream_t>(stream));
  } catch (const std::exception& e) {
    c.fail_everywhere(std::current_exception(), "error launching NCCL calls on rank " + std::to_string(c.rank) + " (" +
                                                    std::to_string(posted.size()) + " steps): " + e.what());
  }
  abort_nccl_if_failed(c);  // a failure heard during the pass
}

void abort_nccl_if_failed(EngineCore& c) noexcept {
  if (c.poisoned && c.nccl && !c.nccl_pass_open) c.nccl->abort();
}

}  // namespace impl
}  // namespace comm
}  // namespace kdist

#endif  // KDIST_ENABLE_NCCL
