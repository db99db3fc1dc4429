// comm/clock_sync.hpp: rank 0 answers each rank in turn, one outstanding exchange at a time,
// which keeps round trips short; every other rank keeps its samples and estimates its offset from
// the best of them (core/timer.hpp, estimate_clock_offset).
#include <kdist/comm/clock_sync.hpp>
#include <kdist/core/error.hpp>
#include <kdist/core/phase.hpp>

#include <string>
#include <vector>

namespace kdist {
namespace comm {

ClockOffset synchronize_clock(Engine& engine, Clock& clock, int rounds, const std::function<double()>& local_now) {
  if (rounds < 1)
    kdist::impl::throw_invalid("kdist::comm::synchronize_clock", "rounds must be >= 1, got " + std::to_string(rounds));
  Phase phase("kdist::comm::synchronize_clock");
  using Host = Kokkos::DefaultHostExecutionSpace;
  Kokkos::View<double*, Kokkos::HostSpace> out("kdist::comm::clock ping", 1), in("kdist::comm::clock pong", 1);
  const Host host;
  constexpr int tag = 7;
  ClockOffset result;
  if (engine.rank() == 0) {
    for (int peer = 1; peer < engine.size(); ++peer)
      for (int r = 0; r < rounds; ++r) {
        engine.recv(host, in, peer, tag, "clock ping").wait();
        out(0) = local_now();
        engine.send(host, out, peer, tag, "clock pong").wait();
      }
  } else {
    std::vector<ClockSample> samples;
    samples.reserve(static_cast<std::size_t>(rounds));
    for (int r = 0; r < rounds; ++r) {
      ClockSample s{};
      out(0) = s.t_send = local_now();
      engine.send(host, out, 0, tag, "clock ping").wait();
      engine.recv(host, in, 0, tag, "clock pong").wait();
      s.t_recv = local_now();
      s.t_remote = in(0);
      samples.push_back(s);
    }
    result = estimate_clock_offset(samples);
  }
  clock.set_offset(result.offset);
  return result;
}

}  // namespace comm
}  // namespace kdist
