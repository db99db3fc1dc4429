// CostModelStore's JSON file: every field is type- and range-checked before it is used, and
// every error names the file, the entry (index, then op/dtype, then the whole key as far as it
// was read) and the field, so a hand-edited or truncated calibration points at its own fault.
#include <kdist/core/atomic_file.hpp>
#include <kdist/core/cost_model.hpp>
#include <kdist/core/error.hpp>

#include <climits>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace kdist {

namespace {

using nlohmann::json;

/// Where in the file we are: the path, then " entry i (op/dtype...)" while reading an entry.
class Place {
 public:
  explicit Place(const std::string& path) : path_(path) {}
  [[noreturn]] void fail(const std::string& message) const {
    throw Error("kdist::CostModelStore::load: '" + path_ + "'" + where_ + ": " + message);
  }
  void enter_entry(std::size_t index) { where_ = " entry " + std::to_string(index); }
  void name_entry(const std::string& key) { where_ = where_.substr(0, where_.find(" (")) + " (" + key + ")"; }

 private:
  std::string path_, where_;
};

std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

const json& field(const Place& at, const json& object, const char* name) {
  const auto it = object.find(name);
  if (it == object.end()) at.fail(std::string("field '") + name + "' is missing");
  return *it;
}

std::string string_field(const Place& at, const json& object, const char* name) {
  const json& v = field(at, object, name);
  if (!v.is_string()) at.fail(std::string("field '") + name + "' must be a string, got " + shown(v));
  return v.get<std::string>();
}

/// An integer in [lowest, INT_MAX].
int int_field(const Place& at, const json& object, const char* name, int lowest) {
  const json& v = field(at, object, name);
  if (!v.is_number_integer()) at.fail(std::string("field '") + name + "' must be an integer, got " + shown(v));
  const double d = v.get<double>();
  if (d < lowest || d > INT_MAX)
    at.fail(std::string("field '") + name + "' is " + shown(v) + ": must be >= " + std::to_string(lowest) +
            " and <= " + std::to_string(INT_MAX));
  return static_cast<int>(v.get<long long>());
}

/// A finite number >= 0 (> 0 when `positive`).
double checked_number(const Place& at, const json& v, const std::string& name, bool positive) {
  if (!v.is_number()) at.fail("field " + name + " must be a number, got " + shown(v));
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < 0 || (positive && d == 0))
    at.fail("field " + name + " is " + shown(v) +
            (positive ? ": must be positive and finite" : ": must be finite and non-negative"));
  return d;
}

double number_field(const Place& at, const json& object, const char* name) {
  return checked_number(at, field(at, object, name), std::string("'") + name + "'", false);
}

std::vector<double> positive_numbers_field(const Place& at, const json& object, const char* name) {
  const json& v = field(at, object, name);
  if (!v.is_array()) at.fail(std::string("field '") + name + "' must be an array of numbers, got " + shown(v));
  std::vector<double> out;
  for (std::size_t i = 0; i < v.size(); ++i)
    out.push_back(checked_number(at, v[i], std::string("'") + name + "'[" + std::to_string(i) + "]", true));
  return out;
}

CostKey read_key(Place& at, const json& e) {
  CostKey k;
  const std::string op = string_field(at, e, "op");
  if (!parse_cost_op(op.c_str(), &k.op))
    at.fail("field 'op' is \"" + op + "\", expected allreduce, broadcast, adasum or spd_inverse");
  at.name_entry(op);
  const std::string dtype = string_field(at, e, "dtype");
  if (!parse_dtype(dtype.c_str(), &k.dtype))
    at.fail("field 'dtype' is \"" + dtype + "\", expected float32, float64, int32, int64 or bytes");
  at.name_entry(op + "/" + dtype);
  k.ranks = int_field(at, e, "ranks", 1);
  k.comm = string_field(at, e, "comm");
  at.name_entry(k.str());
  return k;
}

CostModel read_model(const Place& at, const json& e) {
  const std::vector<double> x = positive_numbers_field(at, e, "x"), t = positive_numbers_field(at, e, "t");
  const double alpha = number_field(at, e, "alpha"), beta = number_field(at, e, "beta");
  if (x.size() != t.size())
    at.fail("fields 'x' and 't' differ in length: " + std::to_string(x.size()) + " sizes, " + std::to_string(t.size()) +
            " times");
  try {
    // With fewer than two points there is no table to fit: alpha and beta are the model.
    return x.size() >= 2 ? CostModel::from_measurements(x, t) : CostModel::linear(alpha, beta);
  } catch (const Error& fit_error) {
    at.fail(fit_error.what());
  }
}

json read_document(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("kdist::CostModelStore::load: cannot open '" + path + "'");
  try {
    return json::parse(in);  // strict: anything after the document is an error, as in a file cut or doubled
  } catch (const std::exception& e) {
    throw Error("kdist::CostModelStore::load: '" + path + "' is not valid JSON: " + e.what());
  }
}

}  // namespace

CostModel CostModelStore::get(const CostKey& key) const {
  const auto it = models_.find(key.str());
  if (it != models_.end()) return it->second.second;
  if (key.op == CostOp::spd_inverse) return CostModel::linear(0.0, 1.0 / 10e9);  // d^3 flops at 10 GFLOP/s
  return CostModel();
}

CostModelStore CostModelStore::load(const std::string& path) {
  const json j = read_document(path);
  Place at(path);
  if (!j.is_object()) at.fail("must hold a JSON object, got " + shown(j));
  const int version = int_field(at, j, "version", 0);
  if (version != kVersion)
    at.fail("has version " + std::to_string(version) + ", this kdist reads version " + std::to_string(kVersion));
  const json& entries = field(at, j, "entries");
  if (!entries.is_array()) at.fail("field 'entries' must be an array, got " + shown(entries));
  CostModelStore s;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    at.enter_entry(i);
    if (!entries[i].is_object()) at.fail("must be an object, got " + shown(entries[i]));
    const CostKey key = read_key(at, entries[i]);
    if (s.has(key)) at.fail("repeats the key " + key.str() + " of an earlier entry");
    s.set(key, read_model(at, entries[i]));
  }
  return s;
}

void CostModelStore::save(const std::string& path) const {
  json entries = json::array();
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
  write_file_atomically(path, json{{"version", kVersion}, {"entries", entries}}.dump(1) + '\n',
                        "kdist::CostModelStore::save");
}

}  // namespace kdist
