#include <kdist/adasum/allreduce.hpp>
#include <kdist/adasum/calibrate.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace kdist {
namespace adasum {
namespace {

using Host = Kokkos::DefaultHostExecutionSpace;

template <class T>
double timed_run(comm::Engine& engine, Algorithm a, const Kokkos::View<T*, Kokkos::HostSpace>& v) {
  Options o;
  o.algorithm = a;
  return comm::impl::time_over_ranks(engine, [&] { allreduce(Host(), engine, v, {0, v.extent(0)}, {}, o).wait(); });
}

template <class T>
std::pair<CostModel, CostModel> calibrate_typed(comm::Engine& engine, const comm::CalibrationOptions& o) {
  std::vector<double> xs, vhdd, doubling;
  for (std::size_t bytes = std::max<std::size_t>(o.min_bytes, sizeof(T)); bytes <= o.max_bytes; bytes *= 4) {
    Kokkos::View<T*, Kokkos::HostSpace> v("kdist::adasum::calibrate::payload", bytes / sizeof(T));
    Kokkos::deep_copy(v, T(1) + static_cast<T>(engine.rank()));
    std::vector<double> sv, sd;
    for (int r = 0; r < o.warmup + o.repeats; ++r) {
      // Interleaved, so a drift of the machine lands on both alike.
      const double tv = timed_run(engine, Algorithm::vhdd, v);
      const double td = timed_run(engine, Algorithm::doubling, v);
      if (r < o.warmup) continue;
      sv.push_back(tv);
      sd.push_back(td);
    }
    xs.push_back(static_cast<double>(bytes));
    vhdd.push_back(kdist::impl::median(sv));
    doubling.push_back(kdist::impl::median(sd));
  }
  return {CostModel::from_measurements(xs, vhdd), CostModel::from_measurements(xs, doubling)};
}

}  // namespace

std::pair<CostModel, CostModel> calibrate(comm::Engine& engine, DType dtype, const comm::CalibrationOptions& options) {
  constexpr const char* func = "kdist::adasum::calibrate";
  if (dtype != DType::float32 && dtype != DType::float64)
    kdist::impl::throw_invalid(func, std::string("cannot calibrate dtype ") + to_string(dtype));
  comm::impl::check_options(func, options);
  return dtype == DType::float32 ? calibrate_typed<float>(engine, options) : calibrate_typed<double>(engine, options);
}

}  // namespace adasum
}  // namespace kdist
