// kdist::torch::GradientReducer (averaged, fused: comm::FusedAllreducer) against the gradient
// averaging a LibTorch code writes without kdist (one blocking MPI_Allreduce per gradient tensor,
// examples/common/torch_net.hpp), inside LibTorch SGD steps of the main job's MLP and CNN:
// forward, backward, the reduction, SGD with momentum, one torch thread, random inputs (the speed
// does not depend on the data). The two reductions take turns in blocks of --steps steps, in
// ABBA order, in one process on one model; every step is timed alone and its time is the maximum
// over ranks. Each row gives the median step of each side and their ratio: medians of single
// steps rather than a run's images/s, because on a shared machine whole runs stall for seconds
// at random and single runs then spread by tens of percent (docs/torch.md).
//
//   mpiexec -n 2 build/perf/bench_torch_reducer [--blocks 16] [--steps 20] [--batch 64]
//       [--models mlp,cnn] [--json FILE]
//
// Columns: parameters (floats reduced a step), model, steps timed per side, mpi_ms (the
// baseline's median step), kdist_ms, kdist/mpi (the step time ratio: below 1 is kdist faster).
#include <kdist/comm/engine.hpp>
#include <kdist/core/timer.hpp>
#include <kdist/torch/gradient_reducer.hpp>

#include <mpi.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/bench_table.hpp"
#include "common/mpi_main.hpp"
#include "examples/common/torch_net.hpp"

namespace {

struct Settings {
  int blocks = 16, steps = 20, batch = 64, warmup = 5;
  std::vector<std::string> models{"mlp", "cnn"};
  std::string json;
};

enum class Side { mpi, kdist };

/// One model's SGD steps with either reduction.
class Steps {
 public:
  Steps(const std::string& model, int batch, kdist::comm::Engine& engine, int rank)
      : net_(std::make_shared<examples::TorchNet>(model == "cnn")),
        reducer_(*net_, engine),
        sgd_(net_->parameters(), ::torch::optim::SGDOptions(0.05).momentum(0.9)),
        ranks_(engine.communicator().size()) {
    net_->initialise(1);
    ::torch::manual_seed(static_cast<std::uint64_t>(1000 + rank));
    x_ = ::torch::randn({batch, 28 * 28});
    y_ = ::torch::randint(0, 10, {batch}, ::torch::kLong);
  }

  long long parameters() const {
    long long n = 0;
    for (const auto& p : net_->parameters()) n += p.numel();
    return n;
  }

  /// One step; its local seconds.
  double step(Side side) {
    const double t0 = kdist::Clock::local_now();
    sgd_.zero_grad();
    const at::Tensor loss = ::torch::nn::functional::cross_entropy(net_->forward(x_, nullptr), y_);
    loss.backward();
    if (side == Side::kdist)
      reducer_.allreduce();
    else
      examples::mpi_average_gradients(*net_, ranks_);
    sgd_.step();
    return kdist::Clock::local_now() - t0;
  }

 private:
  std::shared_ptr<examples::TorchNet> net_;
  kdist::torch::GradientReducer reducer_;
  ::torch::optim::SGD sgd_;
  int ranks_;
  at::Tensor x_, y_;
};

/// Each step's maximum over ranks (every rank ran the same steps).
std::vector<double> max_over_ranks(std::vector<double> t) {
  MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

void run(const Settings& s, int rank) {
  ::torch::set_num_threads(1);
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine engine(world);
  kdist_bench::Table table("bench_torch_reducer", {"parameters", "model", "steps", "mpi_ms", "kdist_ms", "kdist/mpi"});
  table.set_print(rank == 0);
  table.context("ranks", world.size());
  table.context("batch_per_rank", s.batch);
  table.context("blocks", s.blocks);
  table.context("steps_per_block", s.steps);
  table.context("torch_threads", 1);
  table.print_header();
  for (const auto& model : s.models) {
    Steps steps(model, s.batch, engine, rank);
    for (int i = 0; i < s.warmup; ++i) steps.step(Side::mpi), steps.step(Side::kdist);
    std::vector<double> mpi, kdist;
    for (int b = 0; b < s.blocks; ++b) {
      // ABBA: each side goes first in half the blocks, so a drift within a block pair cancels.
      const bool mpi_first = (b % 4 == 0 || b % 4 == 3);
      for (const Side side : {mpi_first ? Side::mpi : Side::kdist, mpi_first ? Side::kdist : Side::mpi}) {
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < s.steps; ++i) (side == Side::mpi ? mpi : kdist).push_back(steps.step(side));
      }
    }
    const double mpi_ms = 1e3 * kdist_bench::median(max_over_ranks(mpi));
    const double kdist_ms = 1e3 * kdist_bench::median(max_over_ranks(kdist));
    table.row({steps.parameters(), model, static_cast<long long>(mpi.size()), mpi_ms, kdist_ms, kdist_ms / mpi_ms});
  }
  if (rank == 0) table.write_json(s.json);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdist::torch::GradientReducer against one MPI_Allreduce per gradient, in LibTorch SGD steps"};
  Settings s;
  app.add_option("--blocks", s.blocks, "blocks of steps per side (taking turns)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--steps", s.steps, "steps per block")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch", s.batch, "samples per rank per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", s.warmup, "untimed steps per side first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--models", s.models, "mlp, cnn (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"mlp", "cnn"}))
      ->capture_default_str();
  app.add_option("--json", s.json, "write the rows as JSON");
  return kdist_perf::mpi_main(argc, argv, app, "bench_torch_reducer", [&](int rank) { run(s, rank); });
}
