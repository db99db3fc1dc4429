// Monotonic time for kdist: seconds on a steady clock, shifted onto rank 0's time base once the
// offset is estimated (comm/clock_sync.hpp), with iteration-relative timestamps. Fusion planners
// and the merged timeline compare times from different ranks, so they all use this base.
#pragma once

#include <vector>

namespace kdist {

class Clock {
 public:
  /// Seconds on this process's steady clock (arbitrary epoch, never goes back).
  static double local_now();

  /// Offset such that local_now() + offset() is rank 0's clock.
  double offset() const noexcept { return offset_; }
  void set_offset(double seconds) noexcept { offset_ = seconds; }
  /// Now on the shared (rank 0) time base.
  double now() const { return local_now() + offset_; }
  /// Converts a local_now() reading to the shared time base.
  double to_global(double local) const noexcept { return local + offset_; }

  /// Marks the start of a training iteration; since_iteration() is relative to it.
  void start_iteration() {
    ++iteration_;
    iteration_start_ = now();
  }
  double since_iteration() const { return now() - iteration_start_; }
  double iteration_start() const noexcept { return iteration_start_; }
  long long iteration() const noexcept { return iteration_; }

 private:
  double offset_ = 0.0;
  double iteration_start_ = 0.0;
  long long iteration_ = -1;
};

/// One ping-pong exchange as seen by the non-root rank: local send time, the root's clock reading
/// when it answered, and local receive time.
struct ClockSample {
  double t_send;
  double t_remote;
  double t_recv;
};

/// Offset to add to local time to get the remote (root) time, and its bound: the true offset lies
/// within offset +- uncertainty when message delays are non-negative (Cristian's algorithm).
struct ClockOffset {
  double offset = 0.0;
  double uncertainty = 0.0;
};

/// Picks the sample with the smallest round trip; throws InvalidArgument if there are none or a
/// sample has t_recv < t_send.
ClockOffset estimate_clock_offset(const std::vector<ClockSample>& samples);

}  // namespace kdist
