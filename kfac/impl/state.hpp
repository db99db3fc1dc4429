// The K-FAC state's fields (Preconditioner::save_to / load_from, kfac/impl/preconditioner_state.hpp):
// what the file says besides the factor and inverse sections, written and checked here once.
//
//   <prefix>dtype, layers (describe() per layer), dims (per factor), ranks (P when saved),
//   step, factor_steps, replan_after, have_inverses, owners (per factor, -1: NCT), fusion_groups,
//   inverse_forms (per factor, 1: the inverse section holds the Cholesky factor),
//   options.<name> (damping, factor_decay, factor_every, inverse_every, kl_clip, lr: what it ran with)
//   sections <prefix>factor.<label> and <prefix>inverse.<label>: d x d, column-major
//
// read_state_fields refuses (InvalidArgument naming the file, the field and its byte offset) a
// state of another dtype, layer list or factor size, counters out of range, and, when the state
// was saved at this run's rank count, owners or a fusion plan that do not fit it. The owners and
// the fusion plan of a state saved at another rank count are not read: that run re-plans.
#pragma once

#include <kdist/core/dtype.hpp>
#include <kdist/core/state_file.hpp>
#include <kdist/kfac/options.hpp>

#include <string>
#include <vector>

namespace kdist {
namespace kfac {
namespace impl {

/// The running preconditioner's side: what a state must match, and where it stands now.
struct StateShape {
  DType dtype = DType::float32;
  int ranks = 1;
  std::vector<std::string> layers;
  std::vector<int> dims;  ///< per factor, in reduction order
};

struct StateCounters {
  int ranks = 1;  ///< the rank count the state was saved at
  long long step = 0, factor_steps = 0, replan_after = 0;
  bool have_inverses = false;
  std::vector<int> owners, fusion_groups;  ///< read only when ranks is the running count
  /// The options it ran with, by name (saved_options), for describe() to compare.
  std::vector<std::pair<std::string, double>> options;
  /// Its strategy's switches (switches_text); "" in a state from before they were saved.
  std::string switches;
  /// Its inverse method ("cholesky", "eigen"); "" in a state from before it was saved.
  std::string inverse_method;
  /// Per factor: 1 where its inverse section holds the Cholesky factor R (Options::cholesky_solves),
  /// 0 where it holds the inverse; empty in a state from before it was saved (every one an inverse).
  std::vector<int> inverse_forms;
};

/// "pipelined yes, planner optimal, placement lbp": what decides the plans a state keeps.
std::string switches_text(const Resolved& r);

/// The options a state records, by name.
std::vector<std::pair<std::string, double>> saved_options(const Options& o);
/// "damping 0.3 (this run: 0.2), ..." for each saved option that differs from `running`, or "".
std::string option_differences(const StateCounters& saved, const Options& running);
/// The saved inverses were made with another damping or inverse method than `running` uses.
bool inverses_differ(const StateCounters& saved, const Options& running);

void write_state_fields(StateWriter& out, const std::string& prefix, const StateShape& shape,
                        const StateCounters& counters);
StateCounters read_state_fields(const StateReader& in, const std::string& prefix, const StateShape& shape);

}  // namespace impl
}  // namespace kfac
}  // namespace kdist
