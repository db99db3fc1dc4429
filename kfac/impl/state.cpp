#include <kdist/kfac/impl/state.hpp>

#include <algorithm>
#include <climits>
#include <functional>
#include <sstream>

namespace kdist {
namespace kfac {
namespace impl {

namespace {
std::vector<long long> widen(const std::vector<int>& v) {
  return std::vector<long long>(v.begin(), v.end());
}
std::string list(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return "[" + s + "]";
}
/// `name`'s integers, each in [lo, hi]; refused naming the field otherwise.
std::vector<int> ints_in(const StateReader& in, const std::string& name, long long lo, long long hi) {
  std::vector<int> out;
  for (long long x : in.integers(name)) {
    if (x < lo || x > hi)
      in.refuse(name,
                "holds " + std::to_string(x) + ", outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    out.push_back(static_cast<int>(x));
  }
  return out;
}
long long count_in(const StateReader& in, const std::string& name, long long lo, long long hi = LLONG_MAX) {
  const long long x = in.integer(name);
  if (x < lo) in.refuse(name, "is " + std::to_string(x) + ", below " + std::to_string(lo));
  if (x > hi) in.refuse(name, "is " + std::to_string(x) + ", above " + std::to_string(hi));
  return x;
}
}  // namespace

std::vector<std::pair<std::string, double>> saved_options(const Options& o) {
  return {{"damping", o.damping},           {"factor_decay", o.factor_decay},
          {"factor_every", o.factor_every}, {"inverse_every", o.inverse_every},
          {"kl_clip", o.kl_clip},           {"lr", o.lr}};
}

std::string switches_text(const Resolved& r) {
  return std::string("pipelined ") + (r.pipelined ? "yes" : "no") + ", planner " + comm::to_string(r.planner) +
         ", placement " + to_string(r.placement);
}

std::string option_differences(const StateCounters& saved, const Options& running) {
  std::string text;
  for (const auto& [name, now] : saved_options(running))
    for (const auto& [saved_name, then] : saved.options)
      if (saved_name == name && then != now) {
        std::ostringstream os;
        os << (text.empty() ? "" : ", ") << name << " " << then << " (this run: " << now << ")";
        text += os.str();
      }
  const std::string method = to_string(running.inverse_method);
  if (!saved.inverse_method.empty() && saved.inverse_method != method)
    text += (text.empty() ? "" : ", ") + ("inverse method " + saved.inverse_method) + " (this run: " + method + ")";
  return text;
}

bool inverses_differ(const StateCounters& saved, const Options& running) {
  for (const auto& [name, then] : saved.options)
    if (name == "damping" && then != running.damping) return true;
  return !saved.inverse_method.empty() && saved.inverse_method != to_string(running.inverse_method);
}

void write_state_fields(StateWriter& out, const std::string& p, const StateShape& shape, const StateCounters& c) {
  out.set(p + "dtype", std::string(to_string(shape.dtype)));
  out.set(p + "layers", shape.layers);
  out.set(p + "dims", widen(shape.dims));
  out.set(p + "ranks", static_cast<long long>(shape.ranks));
  out.set(p + "step", c.step);
  out.set(p + "factor_steps", c.factor_steps);
  out.set(p + "replan_after", c.replan_after);
  out.set_flag(p + "have_inverses", c.have_inverses);
  out.set(p + "owners", widen(c.owners));
  out.set(p + "fusion_groups", widen(c.fusion_groups));
  for (const auto& [name, value] : c.options) out.set(p + "options." + name, value);
  out.set(p + "switches", c.switches);
  out.set(p + "options.inverse_method", c.inverse_method);
  out.set(p + "inverse_forms", widen(c.inverse_forms));
}

StateCounters read_state_fields(const StateReader& in, const std::string& p, const StateShape& shape) {
  const std::string dtype = in.text(p + "dtype");
  if (dtype != to_string(shape.dtype))
    in.refuse(p + "dtype", "the state holds " + dtype + ", this preconditioner is " + to_string(shape.dtype));
  const std::vector<std::string> layers = in.texts(p + "layers");
  if (layers != shape.layers)
    in.refuse(p + "layers", "the state's layers are " + list(layers) + ", this preconditioner's " + list(shape.layers));
  if (ints_in(in, p + "dims", 1, 1 << 30) != shape.dims)
    in.refuse(p + "dims", "factor sizes differ from this preconditioner's");
  StateCounters c;
  c.ranks = static_cast<int>(count_in(in, p + "ranks", 1, INT_MAX));
  c.step = count_in(in, p + "step", 0);
  c.factor_steps = count_in(in, p + "factor_steps", 0);
  c.replan_after = count_in(in, p + "replan_after", -1);
  c.have_inverses = in.flag(p + "have_inverses");
  for (const auto& [name, ignored] : saved_options(Options{}))
    c.options.push_back({name, in.real(p + "options." + name)});
  if (in.has(p + "switches")) c.switches = in.text(p + "switches");
  if (in.has(p + "options.inverse_method")) c.inverse_method = in.text(p + "options.inverse_method");
  if (in.has(p + "inverse_forms")) {
    c.inverse_forms = ints_in(in, p + "inverse_forms", 0, 1);
    if (c.inverse_forms.size() != shape.dims.size())
      in.refuse(p + "inverse_forms", std::to_string(c.inverse_forms.size()) + " forms for " +
                                         std::to_string(shape.dims.size()) + " factors");
  }
  if (c.ranks != shape.ranks) return c;  // another rank count: this run keeps its own plans
  const int factors = static_cast<int>(shape.dims.size());
  c.owners = ints_in(in, p + "owners", -1, shape.ranks - 1);
  if (static_cast<int>(c.owners.size()) != factors)
    in.refuse(p + "owners", std::to_string(c.owners.size()) + " owners for " + std::to_string(factors) + " factors");
  c.fusion_groups = ints_in(in, p + "fusion_groups", 1, factors);
  if (c.fusion_groups.empty() || c.fusion_groups.back() != factors ||
      std::adjacent_find(c.fusion_groups.begin(), c.fusion_groups.end(), std::greater_equal<int>()) !=
          c.fusion_groups.end())
    in.refuse(p + "fusion_groups", "does not cover the " + std::to_string(factors) + " factors in order");
  return c;
}

}  // namespace impl
}  // namespace kfac
}  // namespace kdist
