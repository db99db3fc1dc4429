#include <kdist/comm/calibrate.hpp>
#include <kdist/core/timer.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace kdist {
namespace comm {

namespace {
template <class T>
CostModel calibrate_typed(Engine& engine, CostOp op, const CalibrationOptions& o) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  std::vector<double> xs, ts;
  MPI_Comm c = engine.communicator().raw();
  for (std::size_t bytes = std::max<std::size_t>(o.min_bytes, sizeof(T)); bytes <= o.max_bytes; bytes *= 4) {
    Kokkos::View<T*, Kokkos::HostSpace> v("kdist::calibrate", bytes / sizeof(T));
    std::vector<double> samples;
    for (int r = 0; r < o.warmup + o.repeats; ++r) {
      MPI_Barrier(c);
      const double t0 = Clock::local_now();
      if (op == CostOp::broadcast)
        engine.broadcast(Host(), v, 0, "calibrate").wait();
      else
        engine.allreduce(Host(), v, ReduceOp::sum, "calibrate").wait();
      double dt = Clock::local_now() - t0, worst = 0;
      MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, c);
      if (r >= o.warmup) samples.push_back(worst);
    }
    xs.push_back(static_cast<double>(bytes));
    ts.push_back(kdist::impl::median(samples));
  }
  return CostModel::from_measurements(xs, ts);
}
}  // namespace

CostModel calibrate_collective(Engine& engine, CostOp op, DType dtype, const CalibrationOptions& options) {
  constexpr const char* func = "kdist::comm::calibrate_collective";
  if (op != CostOp::allreduce && op != CostOp::broadcast)
    kdist::impl::throw_invalid(func, std::string("cannot calibrate ") + to_string(op));
  if (dtype != DType::float32 && dtype != DType::float64)
    kdist::impl::throw_invalid(func, std::string("cannot calibrate dtype ") + to_string(dtype));
  return dtype == DType::float32 ? calibrate_typed<float>(engine, op, options)
                                 : calibrate_typed<double>(engine, op, options);
}

}  // namespace comm
}  // namespace kdist
