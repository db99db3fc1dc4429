#include "nccl_backend.hpp"

#include <nccl.h>
#include <kdist/core/error.hpp>

#include <cstring>
#include <sstream>
#include <string>

#define KDIST_NCCL_CHECK(expr)                                                                     \
  do {                                                                                             \
    const ncclResult_t kdist_rc_ = (expr);                                                         \
    if (kdist_rc_ != ncclSuccess) ::kdist::comm::nccl::fail(#expr, __FILE__, __LINE__, kdist_rc_); \
  } while (0)

namespace kdist {
namespace comm {
namespace nccl {

[[noreturn]] void fail(const char* expr, const char* file, int line, ncclResult_t rc) {
  std::ostringstream os;
  os << "NCCL call failed: " << expr << " returned " << static_cast<int>(rc) << " (" << ncclGetErrorString(rc)
     << ") at " << file << ":" << line;
  throw BackendError(os.str());
}

namespace {
ncclDataType_t to_nccl(DType d) {
  switch (d) {
    case DType::float32:
      return ncclFloat32;
    case DType::float64:
      return ncclFloat64;
    case DType::int32:
      return ncclInt32;
    case DType::int64:
      return ncclInt64;
    case DType::bytes:
      return ncclInt8;
  }
  return ncclInt8;
}
ncclRedOp_t to_nccl(Reduce op) {
  switch (op) {
    case Reduce::sum:
      return ncclSum;
    case Reduce::average:
      return ncclAvg;
    case Reduce::min:
      return ncclMin;
    case Reduce::max:
      return ncclMax;
  }
  return ncclSum;
}
void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw BackendError(std::string("kdist::comm::nccl: ") + what + " failed: " + cudaGetErrorString(rc));
}
}  // namespace

struct Comm::Impl {
  ncclComm_t comm = nullptr;
};

UniqueId make_unique_id() {
  static_assert(sizeof(ncclUniqueId) == sizeof(UniqueId), "ncclUniqueId is 128 bytes");
  ncclUniqueId id;
  KDIST_NCCL_CHECK(ncclGetUniqueId(&id));
  UniqueId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

BusId current_bus_id() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  BusId id{};
  check_cuda(cudaDeviceGetPCIBusId(id.data(), static_cast<int>(id.size()), device), "cudaDeviceGetPCIBusId");
  id.back() = '\0';
  return id;
}

Comm::Comm(const UniqueId& id, int nranks, int rank) : impl_(new Impl), rank_(rank), size_(nranks) {
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof(nid));
  KDIST_NCCL_CHECK(ncclCommInitRank(&impl_->comm, nranks, nid, rank));
}

Comm::~Comm() {
  if (impl_ && impl_->comm) ncclCommDestroy(impl_->comm);
}

void Comm::abort() noexcept {
  if (!impl_->comm) return;
  ncclCommAbort(impl_->comm);  // a failure here leaves nothing more to do: the Engine has failed
  impl_->comm = nullptr;
}
bool Comm::aborted() const noexcept {
  return impl_->comm == nullptr;
}

void Comm::allreduce(const void* send, void* recv, std::size_t count, DType dtype, Reduce op, cudaStream_t stream) {
  KDIST_NCCL_CHECK(ncclAllReduce(send, recv, count, to_nccl(dtype), to_nccl(op), impl_->comm, stream));
}
void Comm::broadcast(void* buffer, std::size_t count, DType dtype, int root, cudaStream_t stream) {
  KDIST_NCCL_CHECK(ncclBroadcast(buffer, buffer, count, to_nccl(dtype), root, impl_->comm, stream));
}
void Comm::reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype, Reduce op,
                          cudaStream_t stream) {
  KDIST_NCCL_CHECK(ncclReduceScatter(send, recv, count, to_nccl(dtype), to_nccl(op), impl_->comm, stream));
}
void Comm::allgather(const void* send, void* recv, std::size_t count, DType dtype, cudaStream_t stream) {
  KDIST_NCCL_CHECK(ncclAllGather(send, recv, count, to_nccl(dtype), impl_->comm, stream));
}
void Comm::send(const void* buffer, std::size_t count, DType dtype, int peer, cudaStream_t stream) {
  KDIST_NCCL_CHECK(ncclSend(buffer, count, to_nccl(dtype), peer, impl_->comm, stream));
}
void Comm::recv(void* buffer, std::size_t count, DType dtype, int peer, cudaStream_t stream) {
  KDIST_NCCL_CHECK(ncclRecv(buffer, count, to_nccl(dtype), peer, impl_->comm, stream));
}
Event::Event() {
  check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
}
Event::~Event() {
  if (event_) cudaEventDestroy(event_);
}
void Event::record(cudaStream_t stream) {
  check_cuda(cudaEventRecord(event_, stream), "cudaEventRecord");
  recorded_ = true;
}
bool Event::done() const {
  if (!recorded_) return false;
  const cudaError_t rc = cudaEventQuery(event_);
  if (rc == cudaErrorNotReady) return false;
  check_cuda(rc, "cudaEventQuery");
  return true;
}

void Comm::group_start() {
  KDIST_NCCL_CHECK(ncclGroupStart());
}
void Comm::group_end() {
  KDIST_NCCL_CHECK(ncclGroupEnd());
}

}  // namespace nccl
}  // namespace comm
}  // namespace kdist
