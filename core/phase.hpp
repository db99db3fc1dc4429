// Phase: the one guard every named phase of kdist runs under. It opens a Kokkos profiling region
// (so Kokkos Tools / nsys show it) and, when a Timeline is given and enabled, records the phase
// on that timeline's track when the scope ends. Cost when profiling and the timeline are off:
// two calls into Kokkos' profiling hooks and one branch.
//   { kdist::Phase p("kdist::adasum::allreduce::halve", &timeline, "adasum"); ... }
#pragma once

#include <kdist/core/timeline.hpp>

#include <Kokkos_Core.hpp>
#include <string>

namespace kdist {

class Phase {
 public:
  explicit Phase(std::string name, Timeline* timeline = nullptr, const char* track = nullptr)
      : name_(std::move(name)), timeline_(timeline && timeline->enabled() ? timeline : nullptr) {
    Kokkos::Profiling::pushRegion(name_);
    if (timeline_) {
      track_ = timeline_->track(track ? track : name_.c_str());
      t0_ = Clock::local_now();
    }
  }
  ~Phase() {
    if (timeline_) timeline_->record(track_, name_, t0_, Clock::local_now());
    Kokkos::Profiling::popRegion();
  }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  std::string name_;
  Timeline* timeline_;
  int track_ = -1;
  double t0_ = 0.0;
};

}  // namespace kdist
