#include <kdist/core/cost_model.hpp>
#include <kdist/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

namespace kdist {

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

/// Sizes finite and >= 0, times finite and > 0, equal counts.
void check_points(const char* func, const std::vector<double>& x, const std::vector<double>& t) {
  if (x.size() != t.size())
    impl::throw_invalid(func, "sizes and times differ in count: " + std::to_string(x.size()) + " sizes and " +
                                  std::to_string(t.size()) + " times");
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i]) || x[i] < 0)
      impl::throw_invalid(
          func, "size " + std::to_string(i) + " is " + number(x[i]) + ": sizes must be finite and non-negative");
    if (!std::isfinite(t[i]) || !(t[i] > 0))
      impl::throw_invalid(func,
                          "time " + std::to_string(i) + " is " + number(t[i]) + ": times must be finite and positive");
  }
}

void check_coefficient(const char* func, const char* name, double v) {
  if (!std::isfinite(v) || v < 0)
    impl::throw_invalid(func, std::string(name) + " is " + number(v) + ": must be finite and non-negative");
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// sum_i (c1 a_i + c2 b_i - 1)^2
double residual(const std::vector<double>& a, const std::vector<double>& b, double c1, double c2) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (c1 * a[i] + c2 * b[i] - 1) * (c1 * a[i] + c2 * b[i] - 1);
  return s;
}

}  // namespace

AlphaBeta fit_alpha_beta(const std::vector<double>& x, const std::vector<double>& t) {
  constexpr const char* func = "kdist::fit_alpha_beta";
  if (x.size() != t.size() || x.size() < 2)
    impl::throw_invalid(func, "needs >= 2 points of equal count, got " + std::to_string(x.size()) + " sizes and " +
                                  std::to_string(t.size()) + " times");
  check_points(func, x, t);
  // Rows [1/t_i, x_i/t_i] . [alpha, beta] = 1, scaled so every entry lies in [0, 1] whatever the
  // units (t = 1e308 or x = 1e-300 no longer over- or underflow the normal equations):
  //   a_i = T / t_i, b_i = a_i x_i / X with T = min t, X = max x;  alpha = c1 T, beta = c2 T / X.
  const double T = *std::min_element(t.begin(), t.end()), X = *std::max_element(x.begin(), x.end());
  std::vector<double> a(x.size()), b(x.size()), ones(x.size(), 1.0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    a[i] = T / t[i];
    b[i] = X > 0 ? a[i] * (x[i] / X) : 0.0;
  }
  // Least squares by modified Gram-Schmidt on [a b]: q = a/|a|, w = b - (q.b) q.
  const double na = std::sqrt(dot(a, a)), nb = std::sqrt(dot(b, b));
  std::vector<double> w(b);
  double r12 = 0;
  for (std::size_t i = 0; i < a.size(); ++i) r12 += a[i] / na * b[i];
  for (std::size_t i = 0; i < a.size(); ++i) w[i] -= r12 * a[i] / na;
  const double r22 = std::sqrt(dot(w, w));
  if (!(r22 > 1e-12 * nb))
    impl::throw_invalid(func, "sizes are all equal (" + number(x[0]) + "): the fit needs two distinct sizes");
  const double y1 = dot(a, ones) / na;
  double y2 = 0;
  for (std::size_t i = 0; i < a.size(); ++i) y2 += w[i] / r22 * (1.0 - y1 * a[i] / na);
  double c2 = y2 / r22, c1 = (y1 - r12 * c2) / na;
  // alpha, beta >= 0: otherwise the optimum lies on a face of the orthant; take the better face.
  if (c1 < 0 || c2 < 0) {
    const double beta_only = dot(b, ones) / dot(b, b), alpha_only = dot(a, ones) / dot(a, a);
    const bool on_beta = residual(a, b, 0.0, beta_only) < residual(a, b, alpha_only, 0.0);
    c1 = on_beta ? 0.0 : alpha_only;
    c2 = on_beta ? beta_only : 0.0;
  }
  return {c1 * T, c2 * T / X};
}

CostModel CostModel::linear(double alpha, double beta) {
  check_coefficient("kdist::CostModel::linear", "alpha", alpha);
  check_coefficient("kdist::CostModel::linear", "beta", beta);
  CostModel m;
  m.fit_ = {alpha, beta};
  return m;
}

CostModel CostModel::from_measurements(std::vector<double> x, std::vector<double> t) {
  check_points("kdist::CostModel::from_measurements", x, t);
  if (x.empty()) impl::throw_invalid("kdist::CostModel::from_measurements", "no measurements (0 sizes and 0 times)");
  std::vector<std::size_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return x[a] < x[b]; });
  CostModel m;
  for (std::size_t k : idx) {
    m.x_.push_back(x[k]);
    m.t_.push_back(m.t_.empty() ? t[k] : std::max(m.t_.back(), t[k]));  // monotone
  }
  if (m.x_.size() >= 2) {
    m.fit_ = fit_alpha_beta(m.x_, m.t_);
  } else {
    // One measurement fixes one coefficient: a rate through the origin (a latency at size 0),
    // so the model gives the measured time at the measured size, never the unmeasured default.
    m.fit_ = m.x_[0] > 0 ? AlphaBeta{0.0, m.t_[0] / m.x_[0]} : AlphaBeta{m.t_[0], 0.0};
  }
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

}  // namespace kdist
