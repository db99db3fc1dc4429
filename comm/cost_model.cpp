#include <kdist/comm/cost_model.hpp>
#include <kdist/core/inverse.hpp>
#include <kdist/core/timer.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

namespace kdist {
namespace comm {

AlphaBeta fit_alpha_beta(const std::vector<double>& x, const std::vector<double>& t) {
  constexpr const char* func = "kdist::comm::fit_alpha_beta";
  if (x.size() != t.size() || x.size() < 2)
    kdist::impl::throw_invalid(func, "needs >= 2 points of equal count, got " + std::to_string(x.size()) +
                                         " sizes and " + std::to_string(t.size()) + " times");
  // Weighted least squares, weights 1/t^2: rows [1/t, x/t] . [alpha, beta] = 1.
  double s11 = 0, s12 = 0, s22 = 0, r1 = 0, r2 = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!(t[i] > 0)) kdist::impl::throw_invalid(func, "time " + std::to_string(i) + " is not positive");
    const double a = 1.0 / t[i], b = x[i] / t[i];
    s11 += a * a;
    s12 += a * b;
    s22 += b * b;
    r1 += a;
    r2 += b;
  }
  const double det = s11 * s22 - s12 * s12;
  if (std::abs(det) < 1e-300 * std::max(1.0, s11 * s22)) kdist::impl::throw_invalid(func, "sizes are all equal");
  AlphaBeta ab;
  ab.alpha = (r1 * s22 - r2 * s12) / det;
  ab.beta = (s11 * r2 - s12 * r1) / det;
  return ab;
}

CostModel CostModel::linear(double alpha, double beta) {
  CostModel m;
  m.fit_ = {alpha, beta};
  return m;
}

CostModel CostModel::from_measurements(std::vector<double> x, std::vector<double> t) {
  if (x.size() != t.size())
    kdist::impl::throw_invalid("kdist::comm::CostModel::from_measurements", "sizes and times differ in count");
  std::vector<std::size_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return x[a] < x[b]; });
  CostModel m;
  for (std::size_t k : idx) {
    m.x_.push_back(x[k]);
    m.t_.push_back(m.t_.empty() ? t[k] : std::max(m.t_.back(), t[k]));  // monotone
  }
  if (m.x_.size() >= 2) m.fit_ = fit_alpha_beta(m.x_, m.t_);
  return m;
}

double CostModel::time(double x) const {
  if (x_.size() >= 2 && x >= x_.front() && x <= x_.back()) {
    const auto it = std::lower_bound(x_.begin(), x_.end(), x);
    const std::size_t hi = static_cast<std::size_t>(it - x_.begin());
    if (hi == 0 || x_[hi] == x) return t_[hi];
    const std::size_t lo = hi - 1;
    if (x_[lo] > 0 && t_[lo] > 0 && t_[hi] > 0) {
      const double f = std::log(x / x_[lo]) / std::log(x_[hi] / x_[lo]);
      return std::exp(std::log(t_[lo]) + f * std::log(t_[hi] / t_[lo]));
    }
    const double f = (x - x_[lo]) / (x_[hi] - x_[lo]);
    return t_[lo] + f * (t_[hi] - t_[lo]);
  }
  const double v = fit_.alpha + fit_.beta * x;
  // Outside the table keep monotone: never below the table's end values.
  if (!x_.empty() && x > x_.back()) return std::max(v, t_.back());
  if (!x_.empty() && x < x_.front()) return std::min(std::max(v, 0.0), t_.front());
  return std::max(v, 0.0);
}

std::string CostKey::str() const {
  return op + "/" + dtype + "/" + std::to_string(ranks) + "/" + comm;
}

CostModel CostModelStore::get(const CostKey& key) const {
  const auto it = models_.find(key.str());
  if (it != models_.end()) return it->second.second;
  if (key.op == "spd_inverse") return CostModel::linear(0.0, 1.0 / 10e9);  // d^3 flops at 10 GFLOP/s
  return CostModel();
}

CostModelStore CostModelStore::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("kdist::comm::CostModelStore::load: cannot open '" + path + "'");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw Error("kdist::comm::CostModelStore::load: '" + path + "' is not valid JSON: " + e.what());
  }
  if (j.value("version", -1) != kVersion)
    throw Error("kdist::comm::CostModelStore::load: '" + path + "' has version " +
                std::to_string(j.value("version", -1)) + ", this kdist reads version " + std::to_string(kVersion));
  CostModelStore s;
  for (const auto& e : j.at("entries")) {
    CostKey k{e.at("op"), e.at("dtype"), e.at("ranks"), e.at("comm")};
    CostModel m =
        CostModel::from_measurements(e.at("x").get<std::vector<double>>(), e.at("t").get<std::vector<double>>());
    if (m.x().size() < 2) m = CostModel::linear(e.at("alpha"), e.at("beta"));
    s.set(k, m);
  }
  return s;
}

void CostModelStore::save(const std::string& path) const {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& kv : models_) {
    const CostKey& k = kv.second.first;
    const CostModel& m = kv.second.second;
    entries.push_back({{"op", k.op},
                       {"dtype", k.dtype},
                       {"ranks", k.ranks},
                       {"comm", k.comm},
                       {"x", m.x()},
                       {"t", m.t()},
                       {"alpha", m.fit().alpha},
                       {"beta", m.fit().beta}});
  }
  // Write a temporary file and rename it: a reader never sees a half-written calibration.
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long long>(::getpid()));
  {
    std::ofstream out(tmp);
    if (!out) throw Error("kdist::comm::CostModelStore::save: cannot write '" + tmp + "'");
    out << nlohmann::json{{"version", kVersion}, {"entries", entries}}.dump(1) << '\n';
    if (!out) throw Error("kdist::comm::CostModelStore::save: failed writing '" + tmp + "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error("kdist::comm::CostModelStore::save: cannot rename '" + tmp + "' to '" + path + "'");
  }
}

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}
template <class T>
CostModel calibrate_typed(Engine& engine, OpKind op, const CalibrationOptions& o) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  std::vector<double> xs, ts;
  MPI_Comm c = engine.communicator().raw();
  for (std::size_t bytes = std::max<std::size_t>(o.min_bytes, sizeof(T)); bytes <= o.max_bytes; bytes *= 4) {
    Kokkos::View<T*, Kokkos::HostSpace> v("kdist::calibrate", bytes / sizeof(T));
    std::vector<double> samples;
    for (int r = 0; r < o.warmup + o.repeats; ++r) {
      MPI_Barrier(c);
      const double t0 = Clock::local_now();
      if (op == OpKind::broadcast)
        engine.broadcast(Host(), v, 0, "calibrate").wait();
      else
        engine.allreduce(Host(), v, ReduceOp::sum, "calibrate").wait();
      double dt = Clock::local_now() - t0, worst = 0;
      MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, c);
      if (r >= o.warmup) samples.push_back(worst);
    }
    xs.push_back(static_cast<double>(bytes));
    ts.push_back(median(samples));
  }
  return CostModel::from_measurements(xs, ts);
}
}  // namespace

CostModel calibrate_collective(Engine& engine, OpKind op, DType dtype, const CalibrationOptions& options) {
  if (op != OpKind::allreduce && op != OpKind::broadcast)
    kdist::impl::throw_invalid("kdist::comm::calibrate_collective", std::string("cannot calibrate ") + to_string(op));
  return dtype == DType::float32 ? calibrate_typed<float>(engine, op, options)
                                 : calibrate_typed<double>(engine, op, options);
}

CostModel calibrate_inverse(int max_d, double budget_seconds, int repeats) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  std::vector<double> xs, ts;
  const double start = Clock::local_now();
  for (int d = 64; d <= max_d; d *= 2) {
    Kokkos::View<double**, Kokkos::LayoutLeft, Kokkos::HostSpace> A("A", d, d), inv("inv", d, d);
    for (int i = 0; i < d; ++i) A(i, i) = 1.0 + i % 7;
    std::vector<double> samples;
    for (int r = 0; r < repeats; ++r) {
      const double t0 = Clock::local_now();
      spd_inverse(Host(), A, 1e-3, inv);
      samples.push_back(Clock::local_now() - t0);
    }
    xs.push_back(double(d) * d * d);
    ts.push_back(median(samples));
    // Next size costs ~8x this one: stop if it would overrun the budget.
    if (Clock::local_now() - start + 8.0 * ts.back() * repeats > budget_seconds) break;
  }
  return CostModel::from_measurements(xs, ts);
}

}  // namespace comm
}  // namespace kdist
