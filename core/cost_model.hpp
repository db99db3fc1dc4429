// Cost models for planners and placement, as pure data: a measured size -> time table (made
// monotone, interpolated log-log) with a relative-error-weighted alpha + beta * x fit, stored per
// typed key (operation, dtype, ranks, communicator kind) in one versioned JSON file:
//   {"version": 1, "entries": [{"op": "allreduce", "dtype": "float32", "ranks": 2, "comm": "world",
//                               "x": [...], "t": [...], "alpha": ..., "beta": ...}]}
// `x` is bytes for communication and d^3 for the SPD inverse; times are seconds. Without a
// calibration, stated defaults apply (CostModelStore::get).
//
// Validation. Models hold finite sizes >= 0, finite times > 0 and finite alpha, beta >= 0 (the fit
// is constrained to them). CostModelStore::load checks every field's JSON type and value (a
// file's sizes must be > 0) and throws kdist::Error naming the file, the entry (index, op/dtype)
// and the field; no JSON-library exception escapes, and fit errors come in the same context.
//
// Measuring lives with the code that runs the operation: comm/calibrate.hpp (collectives, through
// an Engine) and core/inverse_calibration.hpp (the SPD inverse on an execution space).
#pragma once

#include <kdist/core/dtype.hpp>

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kdist {

struct AlphaBeta {
  double alpha = 0.0;
  double beta = 0.0;
};

/// Minimises sum_i ((alpha + beta x_i - t_i) / t_i)^2 subject to alpha, beta >= 0: relative
/// error, so small sizes count. Throws InvalidArgument on fewer than 2 points, unequal lengths,
/// sizes not finite or negative, times not finite or not positive, or all sizes equal.
AlphaBeta fit_alpha_beta(const std::vector<double>& x, const std::vector<double>& t);

class CostModel {
 public:
  /// Stated defaults when nothing was calibrated: alpha 20 us, 5 GB/s (communication).
  CostModel() : fit_{20e-6, 1.0 / 5e9} {}
  /// Throws InvalidArgument unless alpha and beta are finite and >= 0.
  static CostModel linear(double alpha, double beta);
  /// From measurements (x ascending after sorting); the table is made monotone (running max).
  /// One measurement gives the rate through the origin, t0 / x0 (x0 = 0: the latency t0), so
  /// time(x0) is t0. Throws InvalidArgument on no measurement, unequal lengths or values outside
  /// the ranges above.
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

enum class CostOp { allreduce, broadcast, adasum, spd_inverse };
/// "allreduce", "broadcast", "adasum", "spd_inverse".
const char* to_string(CostOp op);
/// Parses to_string()'s spelling; returns false for anything else.
bool parse_cost_op(const char* text, CostOp* out);

struct CostKey {
  CostOp op = CostOp::allreduce;
  DType dtype = DType::float32;
  int ranks = 1;
  std::string comm = "world";  ///< communicator kind ("world", "node", "cross_node", "local", ...)
  /// "op/dtype/ranks/comm": the store's ordering and messages.
  std::string str() const;
};

class CostModelStore {
 public:
  static constexpr int kVersion = 1;
  void set(const CostKey& key, const CostModel& model) { models_[key.str()] = {key, model}; }
  bool has(const CostKey& key) const { return models_.count(key.str()) != 0; }
  /// The calibrated model, or the stated default for the operation (inverse: d^3 at 10 GFLOP/s).
  CostModel get(const CostKey& key) const;
  std::size_t size() const noexcept { return models_.size(); }
  /// Throws kdist::Error naming the path (and the entry and field) on a missing or unreadable
  /// file, a version mismatch, or any field of the wrong type or out of range.
  static CostModelStore load(const std::string& path);
  void save(const std::string& path) const;

 private:
  std::map<std::string, std::pair<CostKey, CostModel>> models_;
};

namespace impl {
/// Median of `samples` (a calibration keeps the median of its repeats); 0 for none.
double median(std::vector<double> samples);
}  // namespace impl

}  // namespace kdist
