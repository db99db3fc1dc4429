#include "platform.hpp"

#include <kdist/core/error.hpp>
#include <kdist/core/packed.hpp>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace kdist_perf {
namespace {

using nlohmann::json;

struct Flops {
  double forward = 0, backward = 0, factors = 0, precondition = 0;
};

// Gathering [dW|db] (read, write), the clip's inner product (two reads), scattering nu V (read,
// write): six passes over the g x a gradient.
double gradient_pass_bytes(const LayerShape& s) {
  return 6.0 * s.g_dim() * s.a_dim() * 4;
}

// Bytes moved packing (first) and unpacking (second) a d x d float factor.
std::pair<double, double> copy_bytes(int d) {
  const double t = static_cast<double>(kdist::packed_size(static_cast<std::size_t>(d))) * 4;
  return {2 * t, t + 4.0 * d * d};
}

Flops flops_of(const LayerShape& s, int batch, bool first) {
  const double S = static_cast<double>(s.out_h()) * s.out_w(), K = static_cast<double>(s.c_in) * s.k_h * s.k_w;
  const double a = s.a_dim(), g = s.g_dim(), B = batch;
  Flops f;
  f.forward = 2 * B * S * s.c_out * K;
  f.backward = (first ? 1 : 2) * f.forward;
  f.factors = 2 * B * S * (a * a + g * g);
  f.precondition = 2 * (g * g * a + g * a * a);
  return f;
}

int ceil_log2(int p) {
  int k = 0;
  while ((1 << k) < p) ++k;
  return k;
}

// alpha with ceil(log2 P), beta with (P-1)/P, from the entry at P' (see the header).
kdist::AlphaBeta extrapolate(const kdist::AlphaBeta& at, int from, int to) {
  const double a = from > 1 ? static_cast<double>(ceil_log2(to)) / ceil_log2(from) : 1.0;
  const double b = from > 1 ? ((to - 1.0) / to) / ((from - 1.0) / from) : 1.0;
  return {at.alpha * a, at.beta * b};
}

template <class Map>
int nearest_listed(const Map& m, int ranks) {
  auto it = m.upper_bound(ranks);
  return it == m.begin() ? it->first : std::prev(it)->first;
}

void fail(const std::string& path, const std::string& what) {
  throw kdist::Error("kdist_perf::Platform::from_file('" + path + "'): " + what);
}

const json& field(const std::string& path, const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) fail(path, where + " has no field '" + key + "'");
  return j.at(key);
}

double positive(const std::string& path, const json& j, const char* key, const std::string& where, bool zero_ok) {
  const json& v = field(path, j, key, where);
  if (!v.is_number()) fail(path, where + "." + key + " is not a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < 0 || (!zero_ok && x == 0))
    fail(path, where + "." + key + " = " + v.dump() + " is out of range");
  return x;
}

Platform::AlphaBetaTable table_of(const std::string& path, const json& j, const char* key) {
  const json& t = field(path, field(path, j, key, "the file"), "by_ranks", key);
  if (!t.is_object() || t.empty()) fail(path, std::string(key) + ".by_ranks must be a non-empty object");
  Platform::AlphaBetaTable table;
  for (const auto& [ranks, ab] : t.items()) {
    const std::string where = std::string(key) + ".by_ranks." + ranks;
    int p = 0;
    try {
      p = std::stoi(ranks);
    } catch (const std::exception&) {
      fail(path, where + ": the key must be a rank count");
    }
    if (p < 2) fail(path, where + ": the rank count must be >= 2");
    table.by_ranks[p] = {positive(path, ab, "alpha", where, true), positive(path, ab, "beta", where, true)};
  }
  return table;
}

// The exponential inverse model sampled at d = 1 .. 16384 (log-spaced): CostModel interpolates
// log-log inside the table, which follows alpha e^{beta d} to well under 1 %.
kdist::CostModel exponential_inverse(double alpha, double beta) {
  std::vector<double> x, t;
  for (double d = 1; d <= 16384; d *= 1.05) {
    const double r = std::round(d);
    if (!x.empty() && r * r * r <= x.back()) continue;
    x.push_back(r * r * r);
    t.push_back(alpha * std::exp(beta * r));
  }
  return kdist::CostModel::from_measurements(x, t);
}

}  // namespace

std::vector<LayerTimes> network_times(const std::vector<LayerShape>& shapes, int batch, const ComputeRates& r) {
  if (batch < 1) throw std::invalid_argument("kdist_perf::network_times: batch = " + std::to_string(batch));
  if (!(r.forward_backward > 0 && r.factors > 0 && r.precondition > 0 && r.memory > 0))
    throw std::invalid_argument("kdist_perf::network_times: every compute rate must be > 0");
  std::vector<LayerTimes> out;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const LayerShape& s = shapes[i];
    const Flops f = flops_of(s, batch, i == 0);
    out.push_back({s.label, s.a_dim(), s.g_dim(), static_cast<std::size_t>(s.weights()), f.forward / r.forward_backward,
                   f.backward / r.forward_backward, 0.0, 0.0, f.precondition / r.precondition});
    const double total = 2 * static_cast<double>(batch) * s.out_h() * s.out_w();
    out.back().factor_a = total * s.a_dim() * s.a_dim() / r.factors;
    out.back().factor_g = total * s.g_dim() * s.g_dim() / r.factors;
    out.back().precondition_copy = gradient_pass_bytes(s) / r.memory;
    out.back().pack_a = copy_bytes(s.a_dim()).first / r.memory;
    out.back().unpack_a = copy_bytes(s.a_dim()).second / r.memory;
    out.back().pack_g = copy_bytes(s.g_dim()).first / r.memory;
    out.back().unpack_g = copy_bytes(s.g_dim()).second / r.memory;
  }
  return out;
}

ComputeRates fit_rates(const std::vector<LayerShape>& shapes, int batch, const std::vector<LayerTimes>& measured) {
  if (shapes.size() != measured.size())
    throw std::invalid_argument("kdist_perf::fit_rates: " + std::to_string(shapes.size()) + " shapes for " +
                                std::to_string(measured.size()) + " measured layers");
  Flops flops, time;
  double bytes = 0, copy_time = 0;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    for (int d : {shapes[i].a_dim(), shapes[i].g_dim()}) bytes += copy_bytes(d).first + copy_bytes(d).second;
    bytes += gradient_pass_bytes(shapes[i]);
    copy_time += measured[i].pack_a + measured[i].pack_g + measured[i].unpack_a + measured[i].unpack_g +
                 measured[i].precondition_copy;
    const Flops f = flops_of(shapes[i], batch, i == 0);
    const LayerTimes& m = measured[i];
    flops.forward += f.forward + f.backward;
    time.forward += m.forward + m.backward;
    flops.factors += f.factors;
    time.factors += m.factor_a + m.factor_g;
    flops.precondition += f.precondition;
    time.precondition += m.precondition;
  }
  if (!(time.forward > 0 && time.factors > 0 && time.precondition > 0 && copy_time > 0))
    throw std::invalid_argument("kdist_perf::fit_rates: a measured total is zero");
  return {flops.forward / time.forward, flops.factors / time.factors, flops.precondition / time.precondition,
          bytes / copy_time};
}

Platform Platform::from_calibration(const kdist::CostModelStore& store, const ComputeRates& rates,
                                    const std::string& name) {
  Platform p;
  p.name_ = name;
  p.rates_ = rates;
  for (int ranks = 2; ranks <= 4096; ++ranks)
    for (auto op : {kdist::CostOp::allreduce, kdist::CostOp::broadcast}) {
      const kdist::CostKey key{op, kdist::DType::float32, ranks, "world"};
      if (store.has(key))
        (op == kdist::CostOp::allreduce ? p.allreduce_measured_ : p.broadcast_measured_)[ranks] = store.get(key);
    }
  if (p.allreduce_measured_.empty() || p.broadcast_measured_.empty())
    throw kdist::Error(
        "kdist_perf::Platform::from_calibration: the calibration has no float32 all-reduce or "
        "broadcast entry (run kdist_calibrate at 2 or more ranks)");
  p.inverse_ = store.get({kdist::CostOp::spd_inverse, kdist::DType::float64, 1, "local"});
  return p;
}

Platform Platform::from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, "cannot be read");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail(path, std::string("is not JSON: ") + e.what());
  }
  Platform p;
  const json& name = field(path, j, "name", "the file");
  if (!name.is_string()) fail(path, "name is not a string");
  p.name_ = name.get<std::string>();
  p.allreduce_ = table_of(path, j, "allreduce");
  p.broadcast_ = table_of(path, j, "broadcast");
  const json& inv = field(path, j, "inverse", "the file");
  p.inverse_ =
      exponential_inverse(positive(path, inv, "alpha", "inverse", false), positive(path, inv, "beta", "inverse", true));
  const json& c = field(path, j, "compute", "the file");
  const double efficiency = positive(path, c, "efficiency", "compute", false);
  const double rate = positive(path, c, "flops", "compute", false) * efficiency;
  p.rates_ = {rate, rate, rate, positive(path, c, "memory_bandwidth", "compute", false) * efficiency};
  const double batch = positive(path, c, "batch", "compute", false);
  if (batch != std::floor(batch) || batch > 1e6) fail(path, "compute.batch must be a whole number of images");
  p.batch_ = static_cast<int>(batch);
  return p;
}

kdist::CostModel Platform::collective(const std::map<int, kdist::CostModel>& measured, const AlphaBetaTable& table,
                                      int ranks) const {
  if (!measured.empty()) {
    const auto it = measured.find(ranks);
    if (it != measured.end()) return it->second;
    const int from = nearest_listed(measured, ranks);
    const kdist::AlphaBeta ab = extrapolate(measured.at(from).fit(), from, ranks);
    return kdist::CostModel::linear(ab.alpha, ab.beta);
  }
  const int from = nearest_listed(table.by_ranks, ranks);
  const kdist::AlphaBeta ab = extrapolate(table.by_ranks.at(from), from, ranks);
  return kdist::CostModel::linear(ab.alpha, ab.beta);
}

CommModels Platform::at(int ranks) const {
  if (ranks < 1) throw std::invalid_argument("kdist_perf::Platform::at: ranks = " + std::to_string(ranks));
  CommModels m;
  m.allreduce = collective(allreduce_measured_, allreduce_, std::max(ranks, 2));
  m.placement.broadcast = collective(broadcast_measured_, broadcast_, std::max(ranks, 2));
  m.placement.inverse = inverse_;
  m.placement.element_bytes = 4;
  return m;
}

bool Platform::extrapolated(int ranks) const {
  if (ranks == 1) return false;
  if (!allreduce_measured_.empty())
    return allreduce_measured_.count(ranks) == 0 || broadcast_measured_.count(ranks) == 0;
  return allreduce_.by_ranks.count(ranks) == 0 || broadcast_.by_ranks.count(ranks) == 0;
}

}  // namespace kdist_perf
