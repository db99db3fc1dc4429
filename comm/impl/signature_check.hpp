// SignatureCheck: the Engine's consistency check of one operation, a nonblocking element-wise MAX
// all-reduce of a fixed array of values, made of point-to-point messages on the Engine's check wire.
//
// - Why not MPI_Iallreduce: MPICH's nonblocking-collective schedule costs more than the message it
//   sends, and every checked operation pays it (2 ranks, 16 values: 1.8-2.3 us against 0.5 us for
//   one exchange on shared memory, ~2 us more on the emulated TCP link; signature_check.cpp).
// - Pattern: recursive doubling over P', the largest power of two <= P; rank r >= P' first sends
//   its values to r - P' and last receives the result from it. MAX is exact, so every rank ends
//   with the same values whatever order they were combined in.
// - Order: start() posts the first stage only, advance() the later ones. Every rank must start its
//   checks in the same order and let only its earliest unfinished check advance (the Engine does
//   both), so the k-th message between two ranks with one tag belongs to the same check on both.
// - Stale messages: each message carries the wire id; one stamped with another (left by an earlier
//   Engine whose communicator context MPI reused) is dropped and the receive posted again.
// - Payload: bytes given to start() ride in round 0's message to rank ^ 1 (P a power of two; the
//   Engine's CheckPayload). Round 0 is received by probe (MPI_Improbe, then MPI_Imrecv of what
//   came), on every check, so a peer that sent another size, or no payload, is still received and
//   found different by its signature, not by a truncation error or a hang.
// - A check whose peer stopped never completes: abandon() cancels its receive (left posted, it
//   could take a message meant for a later Engine on a reused context) and says whether its send
//   is still in flight, in which case the object must outlive it.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

namespace kdist {
namespace comm {
namespace impl {

class SignatureCheck {
 public:
  static constexpr int kValues = 16;
  struct Wire {
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0, size = 1;
    long long id = 0;
  };

  /// Posts the first stage with these values (throws kdist::Error on an MPI error); `payload`
  /// (copied) goes to rank ^ 1 with round 0 when P is a power of two, and is dropped otherwise.
  void start(const Wire& wire, const long long (&values)[kValues], const void* payload = nullptr,
             std::size_t payload_bytes = 0);
  /// Advances without blocking; true once result() holds the maximum over all ranks.
  bool advance(const Wire& wire);
  /// Blocks until done (the tests; the Engine drains checks through advance(), hearing its control
  /// channel meanwhile).
  void run_to_end(const Wire& wire);
  /// Gives up a pending check; true when its send is still in flight (keep this object alive).
  bool abandon() noexcept;
  bool pending() const noexcept { return started_ && !done_; }
  const long long* result() const noexcept { return acc_; }
  /// What rank ^ 1 sent with round 0 (once done; none when P is not a power of two).
  const char* payload() const noexcept { return in0_.size() > kHeader ? in0_.data() + kHeader : nullptr; }
  std::size_t payload_bytes() const noexcept { return in0_.size() > kHeader ? in0_.size() - kHeader : 0; }

 private:
  struct Stage {
    int send_to = -1, recv_from = -1, tag = 0;
    bool replace = false;  ///< take the received values (the fold's result) instead of the maximum
    bool round0 = false;   ///< bytes with a payload, received by probe
  };
  void plan(const Wire& wire);
  void post(const Wire& wire);
  void post_recv(const Wire& wire);
  bool probe(const Wire& wire);

  static constexpr int kMaxStages = 34;  // fold in, 32 rounds, fold out
  Stage stages_[kMaxStages];
  int stage_count_ = 0, stage_ = 0;
  bool started_ = false, done_ = false;
  long long acc_[kValues] = {};
  long long out_[kValues + 1] = {}, in_[kValues + 1] = {};  // values, then the wire id
  static constexpr std::size_t kHeader = sizeof(long long) * (kValues + 1);
  std::vector<char> out0_, in0_;  // round 0: the header, then the payload
  const void* payload_ = nullptr;
  std::size_t payload_bytes_ = 0;
  bool probing_ = false;      // round 0's receive waits for MPI_Improbe
  bool power_of_two_ = true;  // P is a power of two: round 0 may carry the payload
  MPI_Request req_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

}  // namespace impl
}  // namespace comm
}  // namespace kdist
