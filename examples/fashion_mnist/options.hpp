// The command line of the main job (fashion_mnist) and of the workers study
// (fashion_mnist_workers), parsed once: every choice (--model, --optimizer, --strategy, --reduce,
// --lr-schedule) becomes an enum here, so the programs switch on enums and never compare strings
// (examples/common/training_options.hpp's add_choice; the K-FAC options and the schedule are
// shared with the LibTorch job there). add_options() declares the options a program takes, in
// --help's order: the workers study is SGD only (its --optimizer takes sgd alone), has no K-FAC
// options and no --checkpoint / --resume, and only it has --workers-per-rank (moved_option_hint()
// points a main-job user there).
// resolve_defaults() fills the optimizer-dependent defaults (lr, momentum) after parsing;
// checkpoint.hpp's resolve_batch() the per-rank batch of --global-batch or of a resumed checkpoint.
#pragma once

#include <kdist/kfac/options.hpp>
#include <kdist/nn/idx.hpp>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../common/training_options.hpp"
#include "model.hpp"

namespace fmnist {

enum class Program { main_job, workers_study };
enum class Optimizer { sgd, kfac };
enum class Reduce { average, adasum };
using examples::add_choice;
using examples::kScheduleNames;
using examples::name_of;
using examples::Names;
using examples::Schedule;

inline const Names<ModelKind> kModelNames{{"mlp", ModelKind::mlp}, {"cnn", ModelKind::cnn}};
inline const Names<Optimizer> kOptimizerNames{{"sgd", Optimizer::sgd}, {"kfac", Optimizer::kfac}};
inline const Names<Reduce> kReduceNames{{"average", Reduce::average}, {"adasum", Reduce::adasum}};

inline const char* program_name(Program p) {
  return p == Program::main_job ? "fashion_mnist" : "fashion_mnist_workers";
}

struct Settings {
  Program program = Program::main_job;
  ModelKind model = ModelKind::mlp;
  Optimizer optimizer = Optimizer::kfac;
  Reduce reduce = Reduce::average;
  Schedule schedule = Schedule::constant;
  int epochs = 10, batch = 64, workers = 1, limit_batches = 0;
  // lr and momentum < 0: the optimizer's default (sgd: 0.05 and 0.9; kfac: 0.1 and 0).
  double lr = -1, momentum = -1, weight_decay = 0.0;
  kdist::kfac::Options kfac = examples::kfac_job_defaults();  // lr and timeline: the Trainer's
  long long global_batch = 0;  // > 0: --global-batch (or a resumed checkpoint's); batch = global / ranks
  bool batch_given = false;    // --batch was on the command line
  int checkpoint_every = 0;    // also save every this many steps (0: at epoch ends only)
  int stop_after = 0;          // > 0: end after this many steps of this run, saving the checkpoint
  std::uint64_t seed = 1;
  std::string data = kdist::nn::kFashionMnistDefaultDir, trace, log, checkpoint, resume, save_model;
  bool quiet = false;
};

/// The optimizer's lr and momentum where the command line left them unset.
inline void resolve_defaults(Settings& s) {
  const bool kfac = s.optimizer == Optimizer::kfac;
  if (s.lr < 0) s.lr = kfac ? 0.1 : 0.05;
  if (s.momentum < 0) s.momentum = kfac ? 0.0 : 0.9;
}

/// The main job's pointer to the program an option given in argv has moved to, or "": printed
/// under CLI11's "The following argument was not expected" (the option is unknown here).
inline std::string moved_option_hint(Program program, int argc, char** argv) {
  if (program != Program::main_job) return "";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--workers-per-rank" || a.rfind("--workers-per-rank=", 0) == 0)
      return "--workers-per-rank: the workers study is its own program now: mpiexec -n P "
             "build/examples/fashion_mnist_workers --workers-per-rank K ... (SGD; docs/main-job.md)";
  }
  return "";
}

inline void add_options(CLI::App& app, Settings& s, Program program) {
  const bool job = program == Program::main_job;
  s.program = program;
  if (!job) {
    s.optimizer = Optimizer::sgd;
    resolve_defaults(s);  // SGD's: shown as the defaults
  }
  add_choice(app, "--model", s.model, kModelNames, "mlp (784-256-128-10) or cnn (2 conv + pooling, 2 dense)");
  if (job) {
    add_choice(app, "--optimizer", s.optimizer, kOptimizerNames, "sgd or kfac (K-FAC preconditioned SGD)");
  } else {  // taken, so that a main-job command line runs here as it is
    add_choice(app, "--optimizer", s.optimizer, Names<Optimizer>{kOptimizerNames.front()}, "sgd only");
  }
  add_choice(app, "--reduce", s.reduce, kReduceNames, "average (gradients) or adasum (parameter deltas)");
  app.add_option("--epochs", s.epochs, "epochs")->check(CLI::PositiveNumber)->capture_default_str();
  CLI::Option* batch =
      app.add_option("--batch", s.batch, job ? "samples per rank per step" : "samples per worker per step")
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
  if (job)
    app.add_option("--global-batch", s.global_batch,
                   "samples per step over all ranks, instead of --batch: each rank takes global / ranks")
        ->check(CLI::PositiveNumber)
        ->excludes(batch);
  if (!job)
    app.add_option("--workers-per-rank", s.workers,
                   "simulate this many SGD workers per rank, each with its own batch (Adasum study)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
  if (job)
    app.add_option("--lr", s.lr, "learning rate [default: 0.05 with sgd, 0.1 with kfac]")->check(CLI::PositiveNumber);
  else
    app.add_option("--lr", s.lr, "learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  examples::add_schedule_option(app, s.schedule);
  if (job)
    app.add_option("--momentum", s.momentum, "SGD momentum [default: 0.9 with sgd, 0 with kfac]")
        ->check(CLI::Range(0.0, 1.0));
  else
    app.add_option("--momentum", s.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--weight-decay", s.weight_decay, "L2 weight decay")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  if (job) examples::add_kfac_options(app, s.kfac);
  app.add_option("--seed", s.seed, "initialisation and shuffling seed")->capture_default_str();
  app.add_option("--data", s.data, "directory with the Fashion-MNIST IDX files")->capture_default_str();
  app.add_option("--trace", s.trace, "write a Chrome trace of the run (chrome://tracing, Perfetto)");
  app.add_option("--log", s.log, "write a CSV line per epoch: loss, accuracies, seconds, images/s");
  if (job) {
    app.add_option("--checkpoint", s.checkpoint, "save the training state to this one file after every epoch");
    app.add_option("--checkpoint-every", s.checkpoint_every, "with --checkpoint: also save every this many steps")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app.add_option("--stop-after", s.stop_after,
                   "end after this many steps of this run, saving the checkpoint there (a job's time limit)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app.add_option("--resume", s.resume,
                   "continue from a checkpoint, at any rank count: the global batch is the checkpoint's");
  }
  app.add_option("--save-model", s.save_model, "write the final parameters (raw float32, rank 0) here");
  app.add_option("--limit-batches", s.limit_batches, "stop each epoch after this many steps (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--quiet", s.quiet, "no per-epoch lines");
}

}  // namespace fmnist
