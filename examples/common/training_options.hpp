// The command-line pieces both Fashion-MNIST programs share: the main job (examples/fashion_mnist,
// kdist's own nn/ layers) and the LibTorch job (examples/torch_fashion_mnist).
//
// - add_choice(): an option whose value is one of a few names, parsed into an enum. A name not
//   in the set is refused as CLI::IsMember refuses ("--model: foo not in {mlp,cnn}"), a number is
//   refused like any other word, and --help shows the names and the default's name.
// - add_kfac_options(): --strategy, --damping, --factor-decay, --kl-clip, --factor-every,
//   --inverse-every, --replicated-precondition, --cholesky-solves, --invert-every-factor and --factor-sync, parsed
//   straight into a
//   kdist::kfac::Options that starts from kfac_job_defaults() (the jobs' tuned values, not the library's).
// - Schedule, add_schedule_option() and learning_rate(): --lr-schedule constant or cosine, the
//   rate at the fraction of all steps taken (from epoch and step, so a resumed run follows the
//   same curve).
#pragma once

#include <kdist/kfac/options.hpp>

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace examples {

/// A choice's spellings, in --help's order.
template <class E>
using Names = std::vector<std::pair<std::string, E>>;

template <class E>
std::string name_of(const Names<E>& names, E value) {
  for (const auto& [name, e] : names)
    if (e == value) return name;
  return "?";
}

/// One of `names` into `value`: the option converts the name to the enum's number itself, so a
/// number typed on the command line is refused like any other word that is not a name.
template <class E>
CLI::Option* add_choice(CLI::App& app, const std::string& flag, E& value, const Names<E>& names,
                        const std::string& help) {
  std::string set;
  for (const auto& n : names) set += (set.empty() ? "{" : ",") + n.first;
  set += "}";
  const CLI::Validator to_number(
      [names, set](std::string& input) {
        for (const auto& [name, e] : names)
          if (input == name) {
            input = std::to_string(static_cast<int>(e));
            return std::string();
          }
        return input + " not in " + set;
      },
      set);
  return app.add_option(flag, value, help)->transform(to_number)->type_name("TEXT")->default_str(name_of(names, value));
}

inline const Names<kdist::kfac::CholeskySolves> kCholeskySolvesNames{
    {"always", kdist::kfac::CholeskySolves::always},
    {"measured", kdist::kfac::CholeskySolves::measured},
    {"never", kdist::kfac::CholeskySolves::never}};
inline const Names<kdist::kfac::FactorSync> kFactorSyncNames{
    {kdist::kfac::to_string(kdist::kfac::FactorSync::every_step), kdist::kfac::FactorSync::every_step},
    {kdist::kfac::to_string(kdist::kfac::FactorSync::before_inverses), kdist::kfac::FactorSync::before_inverses}};
inline const Names<kdist::kfac::Strategy> kStrategyNames{
    {kdist::kfac::to_string(kdist::kfac::Strategy::spd), kdist::kfac::Strategy::spd},
    {kdist::kfac::to_string(kdist::kfac::Strategy::mpdkfac), kdist::kfac::Strategy::mpdkfac},
    {kdist::kfac::to_string(kdist::kfac::Strategy::dkfac), kdist::kfac::Strategy::dkfac}};

/// The jobs' K-FAC settings for Fashion-MNIST (docs/main-job.md): stronger damping and KL clip
/// than the library's defaults, inverses every 10 steps.
inline kdist::kfac::Options kfac_job_defaults() {
  kdist::kfac::Options o;
  o.damping = 0.3;
  o.kl_clip = 0.03;
  o.inverse_every = 10;
  return o;
}

/// The K-FAC options, in --help's order, into `o` (lr and timeline stay the caller's).
inline void add_kfac_options(CLI::App& app, kdist::kfac::Options& o) {
  add_choice(app, "--strategy", o.strategy, kStrategyNames, "K-FAC strategy: spd, mpdkfac or dkfac");
  app.add_option("--damping", o.damping, "K-FAC damping gamma")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--factor-decay", o.factor_decay, "K-FAC running-average decay xi in [0, 1)")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  app.add_option("--kl-clip", o.kl_clip, "K-FAC KL clip (0: off)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--factor-every", o.factor_every, "K-FAC factor update period")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--inverse-every", o.inverse_every, "K-FAC inverse update period")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag_callback(
      "--replicated-precondition", [&o] { o.split_preconditioning = false; },
      "K-FAC: every rank preconditions every layer (default: each rank a block of every layer's outputs "
      "or inputs, all-gathered)");
  add_choice(app, "--cholesky-solves", o.cholesky_solves, kCholeskySolvesNames,
             "K-FAC: keep the factors applied to whole columns as Cholesky factors, applied by two triangular "
             "solves: always, measured (only where the solves, timed at the start, are faster over an inverse "
             "period) or never");
  app.add_flag_callback(
      "--invert-every-factor", [&o] { o.cholesky_solves = kdist::kfac::CholeskySolves::never; },
      "K-FAC: invert every factor, as kfac-pytorch does (--cholesky-solves never)");
  add_choice(app, "--factor-sync", o.factor_sync, kFactorSyncNames,
             "K-FAC: all-reduce the factors every-step (SPD-KFAC, kfac-pytorch) or before-inverses only "
             "(kfac-jax's lazy sync: the same factors inverted, one factor all-reduce per inverse period)");
  app.add_flag("--low-rank-dense", o.low_rank_dense,
               "K-FAC: precondition a Dense layer's gradient from its batch, dy^T [x 1], where that costs fewer flops "
               "(the batch is smaller than the layer), summed by one all-reduce; the gradient must be the batch's");
}

enum class Schedule { constant, cosine };
inline const Names<Schedule> kScheduleNames{{"constant", Schedule::constant}, {"cosine", Schedule::cosine}};

inline CLI::Option* add_schedule_option(CLI::App& app, Schedule& schedule) {
  return add_choice(app, "--lr-schedule", schedule, kScheduleNames,
                    "constant, or cosine: lr * (1 + cos(pi * t)) / 2 at the fraction t of all steps taken");
}

/// The rate at `progress`, the fraction of all steps taken.
inline double learning_rate(Schedule schedule, double lr, double progress) {
  return schedule == Schedule::cosine ? lr * 0.5 * (1 + std::cos(M_PI * progress)) : lr;
}

}  // namespace examples
