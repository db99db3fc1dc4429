// Calibration of the Adasum all-reduce's two algorithms (allreduce.hpp), for the crossover that
// Algorithm::automatic switches at: VHDD and whole-vector recursive doubling timed on the same
// log-spaced sizes as the collectives (comm/calibrate.hpp: a barrier, the operation, the maximum
// of the ranks' times; the median over repeats), one tensor per buffer. kdist_calibrate stores
// them as CostKey{adasum, dtype, ranks, "world"} (VHDD) and {..., "world/doubling"};
// small_bytes_from() reads the crossover back. Collective: every rank calls it with the same
// arguments. Throws InvalidArgument for a dtype other than float32/float64 or options that
// calibrate_collective refuses, before any communication.
#pragma once

#include <kdist/comm/calibrate.hpp>
#include <kdist/core/cost_model.hpp>

#include <utility>

namespace kdist {
namespace adasum {

/// {VHDD, doubling} on `engine` (flat).
std::pair<CostModel, CostModel> calibrate(comm::Engine& engine, DType dtype, const comm::CalibrationOptions& options);

}  // namespace adasum
}  // namespace kdist
