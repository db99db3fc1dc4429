// Cost models for planners and placement: a measured size -> time table (made monotone,
// interpolated log-log) with a relative-error-weighted alpha + beta * x fit, stored per
// (operation, dtype, ranks, communicator kind) in one versioned JSON file. `x` is bytes for
// communication and d^3 for the SPD inverse. Without calibration, stated defaults apply.
#pragma once

#include <kdist/comm/engine.hpp>

#include <map>
#include <string>
#include <vector>

namespace kdist {
namespace comm {

struct AlphaBeta {
  double alpha = 0.0;
  double beta = 0.0;
};

/// Minimises sum_i ((alpha + beta x_i - t_i) / t_i)^2: relative error, so small sizes count.
/// Throws InvalidArgument on fewer than 2 points, unequal lengths or non-positive times.
AlphaBeta fit_alpha_beta(const std::vector<double>& x, const std::vector<double>& t);

class CostModel {
 public:
  /// Stated defaults when nothing was calibrated: alpha 20 us, 5 GB/s (communication).
  CostModel() : fit_{20e-6, 1.0 / 5e9} {}
  static CostModel linear(double alpha, double beta);
  /// From measurements (x ascending after sorting); the table is made monotone (running max).
  static CostModel from_measurements(std::vector<double> x, std::vector<double> t);

  /// Modelled time at x: table interpolation (log-log) inside the measured range, the fit outside.
  double time(double x) const;
  double operator()(double x) const { return time(x); }
  const AlphaBeta& fit() const noexcept { return fit_; }
  const std::vector<double>& x() const noexcept { return x_; }
  const std::vector<double>& t() const noexcept { return t_; }

 private:
  AlphaBeta fit_;
  std::vector<double> x_, t_;
};

struct CostKey {
  std::string op;     ///< "allreduce", "broadcast", "adasum", "spd_inverse"
  std::string dtype;  ///< "float32", "float64"
  int ranks = 1;
  std::string comm = "world";
  std::string str() const;
};

/// The calibration file: {"version": 1, "entries": [{op, dtype, ranks, comm, x, t, alpha, beta}]}.
class CostModelStore {
 public:
  static constexpr int kVersion = 1;
  void set(const CostKey& key, const CostModel& model) { models_[key.str()] = {key, model}; }
  bool has(const CostKey& key) const { return models_.count(key.str()) != 0; }
  /// The calibrated model, or the stated default for the operation (inverse: d^3 at 10 GFLOP/s).
  CostModel get(const CostKey& key) const;
  std::size_t size() const noexcept { return models_.size(); }
  /// Throws kdist::Error naming the path on a missing/unreadable file or a version mismatch.
  static CostModelStore load(const std::string& path);
  void save(const std::string& path) const;

 private:
  std::map<std::string, std::pair<CostKey, CostModel>> models_;
};

struct CalibrationOptions {
  std::size_t min_bytes = 4;
  std::size_t max_bytes = 64u << 20;
  int warmup = 5;
  int repeats = 5;
};

/// Measures engine all-reduce (sum) or broadcast (root 0) over log-spaced sizes: warm-up, then
/// per repeat barrier + one operation, max over ranks, median over repeats. Collective.
CostModel calibrate_collective(Engine& engine, OpKind op, DType dtype, const CalibrationOptions& options);
/// Times spd_inverse (Cholesky, double) for d = 64, 128, ... up to max_d or until the time
/// budget is spent; fits t = alpha + beta d^3. Local (no communication).
CostModel calibrate_inverse(int max_d, double budget_seconds, int repeats = 3);

}  // namespace comm
}  // namespace kdist
