#include <kdist/comm/engine.hpp>

#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

namespace kdist {
namespace comm {

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::allreduce:
      return "allreduce";
    case OpKind::broadcast:
      return "broadcast";
    case OpKind::reduce_scatter:
      return "reduce_scatter";
    case OpKind::allgather:
      return "allgather";
    case OpKind::send:
      return "send";
    case OpKind::recv:
      return "recv";
    case OpKind::composite:
      return "composite";
  }
  return "unknown";
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::average:
      return "average";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
  }
  return "unknown";
}

namespace {
constexpr int kTagsPerOp = 4096;  // user tags of a composite schedule: 0 .. 4095
}

Engine::Engine(const Communicator& comm, EngineOptions options) : comm_(comm), options_(options) {
  impl::check_mpi(MPI_Comm_dup(comm_.raw(), &check_comm_), "MPI_Comm_dup", comm_.rank());
  impl::check_mpi(MPI_Comm_dup(comm_.raw(), &sched_comm_), "MPI_Comm_dup", comm_.rank());
  void* attr = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(sched_comm_, MPI_TAG_UB, &attr, &flag);
  const long long tag_ub = flag ? *static_cast<int*>(attr) : 32767;
  tag_ops_ = static_cast<int>(std::max(1LL, (tag_ub + 1) / kTagsPerOp));
}

Engine::~Engine() {
  // Complete what is in flight so MPI owns no request into freed buffers; errors were (or will
  // never be) reported through their requests.
  try {
    if (!poisoned_) wait_all();
  } catch (...) {
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    MPI_Comm_free(&check_comm_);
    MPI_Comm_free(&sched_comm_);
  }
}

std::shared_ptr<impl::Operation> Engine::make_op(OpKind kind, DType dtype, long long count, std::string label,
                                                 int root) {
  auto o = std::make_shared<impl::Operation>();
  o->kind = kind;
  o->dtype = dtype;
  o->count = count;
  o->root = root;
  o->label = std::move(label);
  return o;
}

Request Engine::submit(Schedule schedule, long long count, DType dtype) {
  auto o = make_op(OpKind::composite, dtype, count, schedule.label());
  o->schedule = std::move(schedule);
  o->tag_base = static_cast<int>(next_composite_++ % tag_ops_) * kTagsPerOp;
  for (const auto& s : o->schedule.steps())
    for (const auto& t : s.transfers)
      if (t.tag < 0 || t.tag >= kTagsPerOp)
        kdist::impl::throw_invalid("kdist::comm::Engine::submit", "schedule '" + o->label + "' uses tag " +
                                                                      std::to_string(t.tag) + " outside [0, " +
                                                                      std::to_string(kTagsPerOp) + ")");
  return enqueue(std::move(o));
}

Request Engine::enqueue(std::shared_ptr<impl::Operation> op) {
  if (poisoned_) std::rethrow_exception(poisoned_);
  const bool collective = op->kind != OpKind::send && op->kind != OpKind::recv;
  op->collectives_left = op->schedule.collective_steps();
  ++stats_.operations;
  if (collective) {
    op->seq = next_seq_++;
    if (options_.check_consistency) {
      const long long sig[impl::Operation::kSig] = {op->seq, static_cast<long long>(op->kind),
                                                    static_cast<long long>(op->dtype), op->count, op->root};
      for (int i = 0; i < impl::Operation::kSig; ++i) {
        op->sig_send[i] = sig[i];
        op->sig_send[impl::Operation::kSig + i] = -sig[i];
      }
      impl::check_mpi(MPI_Iallreduce(op->sig_send, op->sig_recv, 2 * impl::Operation::kSig, MPI_LONG_LONG, MPI_MAX,
                                     check_comm_, &op->check_request),
                      "MPI_Iallreduce (consistency check)", comm_.rank());
      ++stats_.check_calls;
      op->state = impl::Operation::State::checking;
    }
  }
  inflight_.push_back(op);
  progress();
  return Request(this, std::move(op));
}

void Engine::progress() {
  if (poisoned_) return;
  bool earlier_collectives_pending = false;
  bool earlier_checking = false;
  for (auto& op : inflight_) {
    // Signatures are judged in submission order, so every rank raises a mismatch at the same
    // operation even when a later check completes first.
    if (op->state == impl::Operation::State::checking && earlier_checking) break;
    advance(*op, earlier_collectives_pending);
    earlier_checking = earlier_checking || op->state == impl::Operation::State::checking;
  }
  while (!inflight_.empty() && (inflight_.front()->state == impl::Operation::State::done ||
                                inflight_.front()->state == impl::Operation::State::failed))
    inflight_.pop_front();
}

void Engine::fail(impl::Operation& op, std::exception_ptr e) {
  op.error = e;
  op.state = impl::Operation::State::failed;
}

void Engine::advance(impl::Operation& op, bool& earlier_pending) {
  using State = impl::Operation::State;
  if (op.state == State::done || op.state == State::failed) return;
  if (op.state == State::checking) {
    int done = 0;
    impl::check_mpi(MPI_Test(&op.check_request, &done, MPI_STATUS_IGNORE), "MPI_Test", comm_.rank());
    if (!done) {
      earlier_pending = earlier_pending || op.collectives_left > 0;
      return;
    }
    check_signature(op);  // throws MismatchError (and poisons the engine) on a mismatch
    op.state = State::ready;
  }
  auto& steps = op.schedule.steps();
  while (op.step < steps.size()) {
    Schedule::Step& s = steps[op.step];
    if (!op.step_posted) {
      if (s.collective && earlier_pending) break;  // keep collectives in submission order
      op.requests.clear();
      const bool user_p2p = op.kind == OpKind::send || op.kind == OpKind::recv;
      MPI_Comm pc = user_p2p ? comm_.raw() : sched_comm_;
      for (const auto& t : s.transfers) {
        MPI_Request r;
        const int tag = user_p2p ? t.tag : op.tag_base + t.tag;
        if (t.is_send) {
          impl::check_mpi(MPI_Isend(t.buffer, t.count, t.type, t.peer, tag, pc, &r), "MPI_Isend", comm_.rank());
          int bytes = 0;
          MPI_Type_size(t.type, &bytes);
          if (!user_p2p) stats_.bytes_sent += static_cast<long long>(bytes) * t.count;
        } else {
          impl::check_mpi(MPI_Irecv(t.buffer, t.count, t.type, t.peer, tag, pc, &r), "MPI_Irecv", comm_.rank());
        }
        op.requests.push_back(r);
        ++stats_.payload_calls;
      }
      if (s.collective) {
        MPI_Request r;
        impl::check_mpi(s.collective(&r), "nonblocking collective", comm_.rank());
        op.requests.push_back(r);
        ++stats_.payload_calls;
        ++stats_.collective_calls;
        --op.collectives_left;
      }
      op.step_posted = true;
    }
    int done = 1;
    if (!op.requests.empty())
      impl::check_mpi(MPI_Testall(static_cast<int>(op.requests.size()), op.requests.data(), &done, MPI_STATUSES_IGNORE),
                      "MPI_Testall", comm_.rank());
    if (!done) break;
    try {
      if (s.local_work) s.local_work();
    } catch (...) {
      fail(op, std::current_exception());
      return;
    }
    s = Schedule::Step{};  // release captured buffers early
    ++op.step;
    op.step_posted = false;
  }
  if (op.step >= steps.size())
    op.state = State::done;
  else
    earlier_pending = earlier_pending || op.collectives_left > 0;
}

void Engine::check_signature(impl::Operation& op) {
  constexpr int k = impl::Operation::kSig;
  bool same = true;
  for (int i = 0; i < k; ++i) same = same && op.sig_recv[i] == -op.sig_recv[k + i];
  if (!same) raise_mismatch(op);
}

void Engine::raise_mismatch(impl::Operation& op) {
  // Every rank sees the mismatch at the same check (checks are identical and ordered), so this
  // blocking gather is matched on every rank. No payload of this operation has been posted.
  struct Record {
    long long sig[impl::Operation::kSig];
    char label[64];
  };
  Record mine{};
  std::memcpy(mine.sig, op.sig_send, sizeof(mine.sig));
  std::strncpy(mine.label, op.label.c_str(), sizeof(mine.label) - 1);
  std::vector<Record> all(static_cast<std::size_t>(comm_.size()));
  MPI_Allgather(&mine, sizeof(Record), MPI_BYTE, all.data(), sizeof(Record), MPI_BYTE, check_comm_);
  std::ostringstream os;
  os << "kdist::comm: ranks disagree on collective operation #" << op.seq << " ('" << op.label << "' on rank "
     << comm_.rank() << "); nothing was sent. Per rank:";
  for (int r = 0; r < comm_.size(); ++r) {
    const Record& x = all[static_cast<std::size_t>(r)];
    os << "\n  rank " << r << ": " << to_string(static_cast<OpKind>(x.sig[1])) << " '" << x.label
       << "' dtype=" << to_string(static_cast<DType>(x.sig[2])) << " count=" << x.sig[3] << " root=" << x.sig[4];
  }
  auto e = std::make_exception_ptr(MismatchError(os.str()));
  poisoned_ = e;
  // Fail everything in flight on this engine: later operations may depend on this one.
  // (Their pending signature checks are left alone: peers may never post them.)
  for (auto& o : inflight_)
    if (o->state != impl::Operation::State::done) fail(*o, e);
  std::rethrow_exception(e);
}

void Engine::wait(impl::Operation& op) {
  using State = impl::Operation::State;
  if (op.state == State::done || op.state == State::failed) {
    ++stats_.completed_before_wait;
  } else {
    ++stats_.waited;
    while (op.state != State::done && op.state != State::failed) {
      progress();
      if (poisoned_ && op.state != State::done) break;
    }
  }
  if (op.state == State::failed || (poisoned_ && op.state != State::done))
    std::rethrow_exception(op.error ? op.error : poisoned_);
}

void Engine::wait_all() {
  while (!inflight_.empty()) {
    auto op = inflight_.front();
    wait(*op);
    progress();
  }
}

bool Request::test() {
  if (!op_) return true;
  engine_->progress();
  if (op_->state == impl::Operation::State::failed) std::rethrow_exception(op_->error);
  return op_->state == impl::Operation::State::done;
}

void Request::wait() {
  if (op_) engine_->wait(*op_);
}

}  // namespace comm
}  // namespace kdist
