#include <kdist/core/error.hpp>
#include <kdist/kfac/options.hpp>

#include <cmath>

namespace kdist {
namespace kfac {

const char* to_string(Strategy s) {
  switch (s) {
    case Strategy::spd:
      return "spd";
    case Strategy::mpdkfac:
      return "mpdkfac";
    case Strategy::dkfac:
      return "dkfac";
  }
  return "?";
}

const char* to_string(CholeskySolves c) {
  switch (c) {
    case CholeskySolves::always:
      return "always";
    case CholeskySolves::measured:
      return "measured";
    case CholeskySolves::never:
      return "never";
  }
  return "?";
}

const char* to_string(FactorSync f) {
  switch (f) {
    case FactorSync::every_step:
      return "every-step";
    case FactorSync::before_inverses:
      return "before-inverses";
  }
  return "?";
}

bool parse_strategy(const std::string& text, Strategy* out) {
  for (Strategy s : {Strategy::spd, Strategy::mpdkfac, Strategy::dkfac})
    if (text == to_string(s)) {
      *out = s;
      return true;
    }
  return false;
}

namespace {
void require(bool ok, const char* field, const std::string& value, const char* range) {
  if (!ok)
    impl::throw_invalid("kdist::kfac::Options",
                        std::string(field) + " = " + value + " is out of range (" + range + ")");
}
}  // namespace

void Options::validate() const {
  require(std::isfinite(damping) && damping > 0, "damping", std::to_string(damping), "> 0");
  require(factor_decay >= 0 && factor_decay < 1, "factor_decay", std::to_string(factor_decay), "[0, 1)");
  require(factor_every >= 1, "factor_every", std::to_string(factor_every), ">= 1");
  require(inverse_every >= 1, "inverse_every", std::to_string(inverse_every), ">= 1");
  require(std::isfinite(kl_clip) && kl_clip >= 0, "kl_clip", std::to_string(kl_clip), ">= 0");
  require(std::isfinite(lr) && lr > 0, "lr", std::to_string(lr), "> 0");
  require(profile_steps >= 0, "profile_steps", std::to_string(profile_steps), ">= 0");
  require(threshold_bytes >= 1, "threshold_bytes", std::to_string(threshold_bytes), ">= 1");
}

Resolved resolve(const Options& options) {
  Resolved r;
  if (options.strategy != Strategy::spd) {
    r.pipelined = false;
    r.planner = comm::Planner::threshold;
    r.placement = options.strategy == Strategy::mpdkfac ? PlacementKind::sequential : PlacementKind::replicated;
  }
  if (options.pipelined) r.pipelined = *options.pipelined;
  if (options.planner) r.planner = *options.planner;
  if (options.placement) r.placement = *options.placement;
  return r;
}

}  // namespace kfac
}  // namespace kdist
