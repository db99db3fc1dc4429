#include <kdist/comm/calibrate.hpp>
#include <kdist/core/timer.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace kdist {
namespace comm {

namespace {
using Host = Kokkos::DefaultHostExecutionSpace;

/// One timed run: the operations posted together, then all waited; seconds per operation.
template <class T>
double timed_run(Engine& engine, CostOp op, const std::vector<Kokkos::View<T*, Kokkos::HostSpace>>& buffers) {
  const double t = impl::time_over_ranks(engine, [&] {
    std::vector<Request> ops;
    for (const auto& v : buffers)
      ops.push_back(op == CostOp::broadcast
                        ? engine.broadcast(Host(), v, 0, "kdist::calibrate::broadcast")
                        : engine.allreduce(Host(), v, ReduceOp::sum, "kdist::calibrate::allreduce"));
    for (Request& r : ops) r.wait();
  });
  return t / static_cast<double>(buffers.size());
}

template <class T>
CostModel calibrate_typed(Engine& engine, CostOp op, const CalibrationOptions& o) {
  std::vector<double> xs, ts;
  for (std::size_t bytes = std::max<std::size_t>(o.min_bytes, sizeof(T)); bytes <= o.max_bytes; bytes *= 4) {
    std::vector<Kokkos::View<T*, Kokkos::HostSpace>> buffers;
    for (int k = 0; k < o.in_flight; ++k) buffers.emplace_back("kdist::calibrate::payload", bytes / sizeof(T));
    std::vector<double> samples;
    for (int r = 0; r < o.warmup + o.repeats; ++r) {
      const double worst = timed_run(engine, op, buffers);
      if (r >= o.warmup) samples.push_back(worst);
    }
    xs.push_back(static_cast<double>(bytes));
    ts.push_back(kdist::impl::median(samples));
  }
  return CostModel::from_measurements(xs, ts);
}
}  // namespace

double impl::time_over_ranks(Engine& engine, const std::function<void()>& run) {
  engine.allreduce_values<double>({0.0}, ReduceOp::sum, "kdist::calibrate::barrier");
  const double t0 = Clock::local_now();
  run();
  return engine.allreduce_values<double>({Clock::local_now() - t0}, ReduceOp::max, "kdist::calibrate::max_time")[0];
}

void impl::check_options(const char* func, const CalibrationOptions& options) {
  if (options.repeats < 1 || options.warmup < 0 || options.in_flight < 1 || options.min_bytes > options.max_bytes)
    kdist::impl::throw_invalid(
        func, "needs repeats >= 1, warmup >= 0, in_flight >= 1 and min_bytes <= max_bytes, got repeats " +
                  std::to_string(options.repeats) + ", warmup " + std::to_string(options.warmup) + ", in_flight " +
                  std::to_string(options.in_flight) + ", bytes " + std::to_string(options.min_bytes) + ".." +
                  std::to_string(options.max_bytes));
}

CostModel calibrate_collective(Engine& engine, CostOp op, DType dtype, const CalibrationOptions& options) {
  constexpr const char* func = "kdist::comm::calibrate_collective";
  if (op != CostOp::allreduce && op != CostOp::broadcast)
    kdist::impl::throw_invalid(func, std::string("cannot calibrate ") + to_string(op));
  if (dtype != DType::float32 && dtype != DType::float64)
    kdist::impl::throw_invalid(func, std::string("cannot calibrate dtype ") + to_string(dtype));
  impl::check_options(func, options);
  return dtype == DType::float32 ? calibrate_typed<float>(engine, op, options)
                                 : calibrate_typed<double>(engine, op, options);
}

}  // namespace comm
}  // namespace kdist
