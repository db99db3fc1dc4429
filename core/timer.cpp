#include <kdist/core/error.hpp>
#include <kdist/core/timer.hpp>

#include <chrono>
#include <limits>
#include <string>

namespace kdist {

double Clock::local_now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

ClockOffset estimate_clock_offset(const std::vector<ClockSample>& samples) {
  if (samples.empty()) impl::throw_invalid("kdist::estimate_clock_offset", "no samples");
  double best_rtt = std::numeric_limits<double>::infinity();
  ClockOffset result;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const ClockSample& s = samples[i];
    const double rtt = s.t_recv - s.t_send;
    if (!(rtt >= 0.0))
      impl::throw_invalid("kdist::estimate_clock_offset",
                          "sample " + std::to_string(i) + " has a negative round trip (" + std::to_string(rtt) + " s)");
    if (rtt < best_rtt) {
      best_rtt = rtt;
      result.offset = s.t_remote - 0.5 * (s.t_send + s.t_recv);
      result.uncertainty = 0.5 * rtt;
    }
  }
  return result;
}

}  // namespace kdist
