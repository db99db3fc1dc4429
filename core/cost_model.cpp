#include <kdist/core/cost_model.hpp>
#include <kdist/core/error.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

namespace kdist {

AlphaBeta fit_alpha_beta(const std::vector<double>& x, const std::vector<double>& t) {
  constexpr const char* func = "kdist::fit_alpha_beta";
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
    kdist::impl::throw_invalid("kdist::CostModel::from_measurements", "sizes and times differ in count");
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

double impl::median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

namespace {
constexpr CostOp kCostOps[] = {CostOp::allreduce, CostOp::broadcast, CostOp::adasum, CostOp::spd_inverse};
}

const char* to_string(CostOp op) {
  switch (op) {
    case CostOp::allreduce:
      return "allreduce";
    case CostOp::broadcast:
      return "broadcast";
    case CostOp::adasum:
      return "adasum";
    case CostOp::spd_inverse:
      return "spd_inverse";
  }
  return "unknown";
}

bool parse_cost_op(const char* text, CostOp* out) {
  for (CostOp op : kCostOps)
    if (std::strcmp(text, to_string(op)) == 0) {
      *out = op;
      return true;
    }
  return false;
}

std::string CostKey::str() const {
  return std::string(to_string(op)) + "/" + to_string(dtype) + "/" + std::to_string(ranks) + "/" + comm;
}

CostModel CostModelStore::get(const CostKey& key) const {
  const auto it = models_.find(key.str());
  if (it != models_.end()) return it->second.second;
  if (key.op == CostOp::spd_inverse) return CostModel::linear(0.0, 1.0 / 10e9);  // d^3 flops at 10 GFLOP/s
  return CostModel();
}

CostModelStore CostModelStore::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("kdist::CostModelStore::load: cannot open '" + path + "'");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw Error("kdist::CostModelStore::load: '" + path + "' is not valid JSON: " + e.what());
  }
  if (j.value("version", -1) != kVersion)
    throw Error("kdist::CostModelStore::load: '" + path + "' has version " + std::to_string(j.value("version", -1)) +
                ", this kdist reads version " + std::to_string(kVersion));
  CostModelStore s;
  for (const auto& e : j.at("entries")) {
    CostKey k;
    const std::string op = e.at("op"), dtype = e.at("dtype");
    if (!parse_cost_op(op.c_str(), &k.op) || !parse_dtype(dtype.c_str(), &k.dtype))
      throw Error("kdist::CostModelStore::load: '" + path + "' has an unknown operation or dtype: " + op + "/" + dtype);
    k.ranks = e.at("ranks");
    k.comm = e.at("comm");
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
    entries.push_back({{"op", to_string(k.op)},
                       {"dtype", to_string(k.dtype)},
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
    if (!out) throw Error("kdist::CostModelStore::save: cannot write '" + tmp + "'");
    out << nlohmann::json{{"version", kVersion}, {"entries", entries}}.dump(1) << '\n';
    if (!out) throw Error("kdist::CostModelStore::save: failed writing '" + tmp + "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error("kdist::CostModelStore::save: cannot rename '" + tmp + "' to '" + path + "'");
  }
}

}  // namespace kdist
