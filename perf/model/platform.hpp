// Platform: what the scale model needs to know about a machine at any rank count P.
//   - collectives at P: all-reduce and broadcast cost models (seconds for x = bytes)
//   - the SPD inverse: seconds for x = d^3 on one rank
//   - compute rates (FLOP/s) that turn a layer list into per-layer times (network_times)
// Two sources:
//   from_calibration  a kdist_calibrate file (this machine) plus rates fitted to a bench_kfac
//                     profile; P that was not calibrated comes from the largest calibrated P below it
//   from_file         a cluster description (JSON, perf/model/clusters/): per-P alpha/beta tables,
//                     the inverse as alpha * exp(beta * d), the device's FLOP rate and efficiency
// Rank counts missing from a table are extrapolated from the nearest listed P' below (or the
// smallest): alpha * ceil(log2 P) / ceil(log2 P') (tree or recursive-doubling start-up) and
// beta * ((P-1)/P) / ((P'-1)/P') (ring/Rabenseifner bandwidth term). Every figure the README
// projects says whether its P was listed or extrapolated (extrapolated()).
// Errors: std::invalid_argument / kdist::Error naming the file, the field and the value.
#pragma once

#include "networks.hpp"
#include "scale_model.hpp"

#include <map>
#include <string>
#include <vector>

namespace kdist_perf {

/// FLOP/s for each kind of work (FLOPs per layer in network_times), and bytes/s for the copies.
struct ComputeRates {
  double forward_backward = 0, factors = 0, precondition = 0, memory = 0;
};

/// Per-layer times of `shapes` at `batch` images per rank from FLOP counts:
///   forward 2 B S c_out K, backward twice that (once for the first layer: no input gradient),
///   factors 2 B S (a^2 + g^2), precondition 2 (g^2 a + g a^2), with S = out_h out_w and K = c_in k_h k_w;
///   packing a factor reads and writes its triangle, 2 t(d) 4 bytes; unpacking writes d^2 more, (t(d) + d^2) 4;
///   the passes over each gradient around preconditioning 6 g a 4 bytes.
std::vector<LayerTimes> network_times(const std::vector<LayerShape>& shapes, int batch, const ComputeRates& rates);
/// The rates that make network_times reproduce `measured` in total per kind (same layers, same batch).
ComputeRates fit_rates(const std::vector<LayerShape>& shapes, int batch, const std::vector<LayerTimes>& measured);

class Platform {
 public:
  struct AlphaBetaTable {
    std::map<int, kdist::AlphaBeta> by_ranks;
  };

  /// This machine: the calibrated entries of `store` (float32 collectives, the inverse) and `rates`.
  static Platform from_calibration(const kdist::CostModelStore& store, const ComputeRates& rates,
                                   const std::string& name);
  /// A cluster description file; see perf/model/clusters/*.json for the fields.
  static Platform from_file(const std::string& path);

  CommModels at(int ranks) const;
  /// True when `ranks` is not a listed (or calibrated) rank count.
  bool extrapolated(int ranks) const;
  const ComputeRates& rates() const noexcept { return rates_; }
  int batch() const noexcept { return batch_; }
  const std::string& name() const noexcept { return name_; }

 private:
  kdist::CostModel collective(const std::map<int, kdist::CostModel>& measured, const AlphaBetaTable& table,
                              int ranks) const;

  std::string name_;
  int batch_ = 0;
  ComputeRates rates_;
  std::map<int, kdist::CostModel> allreduce_measured_, broadcast_measured_;
  AlphaBetaTable allreduce_, broadcast_;
  kdist::CostModel inverse_;
};

}  // namespace kdist_perf
