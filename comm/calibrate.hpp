// Calibration of the collective cost models (core/cost_model.hpp): engine all-reduce (sum) or
// broadcast (root 0) timed over log-spaced sizes from min_bytes to max_bytes (x 4 per step).
// Each size: `warmup` untimed runs, then `repeats` timed ones; a timed run is a barrier, one
// operation, and the maximum of the ranks' elapsed times; the model keeps the median over
// repeats. With in_flight = k > 1 a timed run posts k operations (k buffers) at once, waits
// them all and counts elapsed / k: the cost of one call among calls back to back, as the fused,
// pipelined reductions issue them. It differs from the single call where a call's start-up
// overlaps the next (oversubscribed ranks: one call waits a scheduler slice, k calls share it).
// Collective: every rank of the engine calls it with the same arguments, and every
// collective it runs goes through `engine`, so it is ordered with the engine's other work.
#pragma once

#include <kdist/comm/engine.hpp>
#include <kdist/core/cost_model.hpp>

#include <cstddef>
#include <functional>

namespace kdist {
namespace comm {

struct CalibrationOptions {
  std::size_t min_bytes = 4;
  std::size_t max_bytes = 64u << 20;
  int warmup = 5;
  int repeats = 5;
  int in_flight = 1;  ///< operations posted together per timed run (their mean is recorded)
};

namespace impl {
/// One timed run as the calibrations take it: a 1-element all-reduce as the barrier, `run` (which
/// posts and waits its operations), then the maximum over ranks of the elapsed seconds (a 1-element
/// max all-reduce), all through `engine`. Collective.
double time_over_ranks(Engine& engine, const std::function<void()>& run);

/// Throws InvalidArgument naming `func` unless repeats >= 1, warmup >= 0, in_flight >= 1 and
/// min_bytes <= max_bytes.
void check_options(const char* func, const CalibrationOptions& options);
}  // namespace impl

/// Measures `op` (CostOp::allreduce or CostOp::broadcast) on float32 or float64 views.
/// Throws InvalidArgument for any other operation or dtype, repeats < 1, warmup < 0, in_flight < 1 or
/// min_bytes > max_bytes (the same on every rank, before any communication). Collective.
CostModel calibrate_collective(Engine& engine, CostOp op, DType dtype, const CalibrationOptions& options);

}  // namespace comm
}  // namespace kdist
