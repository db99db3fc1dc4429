// Timeline recorder: phases of each rank as Chrome trace events (chrome://tracing, Perfetto),
// one process per rank and one thread track per phase. Off by default; when off, recording costs
// one branch and no clock read.
#pragma once

#include <kdist/core/timer.hpp>

#include <string>
#include <vector>

namespace kdist {

class Timeline {
 public:
  /// `clock` (optional, must outlive the timeline) maps local times onto the shared time base.
  explicit Timeline(int rank = 0, const Clock* clock = nullptr) : rank_(rank), clock_(clock) {}

  void enable(bool on = true) noexcept { enabled_ = on; }
  bool enabled() const noexcept { return enabled_; }

  /// Id of the track called `name`, created on first use ("forward", "factor allreduce", ...).
  int track(const std::string& name);

  /// Records [t_begin, t_end] (Clock::local_now() readings) on `track`; no-op when disabled.
  void record(int track, const std::string& name, double t_begin, double t_end) {
    if (enabled_) push(track, name, t_begin, t_end);
  }

  /// Records the lifetime of the scope on `track`.
  class Scope {
   public:
    Scope(Timeline& tl, int track, const char* name)
        : tl_(tl), track_(track), name_(name), t0_(tl.enabled_ ? Clock::local_now() : 0.0) {}
    ~Scope() {
      if (tl_.enabled_) tl_.push(track_, name_, t0_, Clock::local_now());
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Timeline& tl_;
    int track_;
    const char* name_;
    double t0_;
  };

  std::size_t size() const noexcept { return events_.size(); }
  void clear() { events_.clear(); }

  /// Chrome trace-event JSON document for this rank.
  std::string to_json() const;
  /// Replaces `path` with to_json() atomically (core/atomic_file.hpp); throws kdist::Error naming
  /// the path if it cannot, leaving an existing file as it was.
  void write(const std::string& path) const;
  /// Joins per-rank documents (e.g. gathered on rank 0) into one trace.
  static std::string merge(const std::vector<std::string>& documents);

 private:
  struct Event {
    int track;
    std::string name;
    double t0;
    double t1;
  };
  void push(int track, const std::string& name, double t0, double t1);

  int rank_;
  const Clock* clock_;
  bool enabled_ = false;
  std::vector<std::string> tracks_;
  std::vector<Event> events_;
};

}  // namespace kdist
