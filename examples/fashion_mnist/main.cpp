// The main job: distributed Fashion-MNIST training with SGD or K-FAC, gradients averaged or
// combined by Adasum. mpiexec -n P build/examples/fashion_mnist --help lists every option.
//
// Per step, on every rank: its shard of the global batch (nn::ShardedBatches) -> forward (the
// layers call the K-FAC hooks when --optimizer kfac) -> mean loss -> backward ->
//   --reduce average: gradients scaled by (local samples x P / global samples) and averaged in
//                     one fused all-reduce, so the update is the global batch's mean gradient;
//                     then kfac.step (preconditions in place) and the SGD step;
//   --reduce adasum:  each rank preconditions its own gradient and takes its local SGD step; the
//                     parameter deltas are combined by Adasum (docs/architecture.md §3).
// --workers-per-rank K simulates K SGD workers per rank (workers.hpp): the study of Adasum at more
// workers than cores. --lr-schedule cosine decays the rate to 0 over the run, per step.
// A last global batch smaller than the worker count would leave a worker without samples: it is
// skipped, and the job says how many samples that was.
#include <kdist/adasum/delta_optimizer.hpp>
#include <kdist/comm/fused_allreducer.hpp>
#include <kdist/core/atomic_file.hpp>
#include <kdist/kfac/preconditioner.hpp>
#include <kdist/nn/batches.hpp>
#include <kdist/nn/idx.hpp>
#include <kdist/nn/loss.hpp>

#include <mpi.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "checkpoint.hpp"
#include "model.hpp"
#include "progress.hpp"
#include "workers.hpp"

namespace {

using namespace kdist;
using T = float;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Flat = Kokkos::View<T*, Mem>;

struct Settings {
  std::string model = "mlp", optimizer = "kfac", strategy = "spd", reduce = "average", schedule = "constant";
  int epochs = 10, batch = 64, workers = 1, factor_every = 1, inverse_every = 10, limit_batches = 0;
  // lr and momentum < 0: the optimizer's default (sgd: 0.05 and 0.9; kfac: 0.1 and 0).
  double lr = -1, momentum = -1, weight_decay = 0.0, damping = 0.3, factor_decay = 0.95, kl_clip = 0.03;
  std::uint64_t seed = 1;
  std::string data = nn::kFashionMnistDefaultDir, trace, log, checkpoint, resume, save_model;
  bool quiet = false, replicated_precondition = false;
};

void add_options(CLI::App& app, Settings& s) {
  app.add_option("--model", s.model, "mlp (784-256-128-10) or cnn (2 conv + pooling, 2 dense)")
      ->check(CLI::IsMember({"mlp", "cnn"}))
      ->capture_default_str();
  app.add_option("--optimizer", s.optimizer, "sgd or kfac (K-FAC preconditioned SGD)")
      ->check(CLI::IsMember({"sgd", "kfac"}))
      ->capture_default_str();
  app.add_option("--strategy", s.strategy, "K-FAC strategy: spd, mpdkfac or dkfac")
      ->check(CLI::IsMember({"spd", "mpdkfac", "dkfac"}))
      ->capture_default_str();
  app.add_option("--reduce", s.reduce, "average (gradients) or adasum (parameter deltas)")
      ->check(CLI::IsMember({"average", "adasum"}))
      ->capture_default_str();
  app.add_option("--epochs", s.epochs, "epochs")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--batch", s.batch, "samples per rank per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--workers-per-rank", s.workers,
                 "simulate this many SGD workers per rank, each with its own batch (Adasum study)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lr", s.lr, "learning rate [default: 0.05 with sgd, 0.1 with kfac]")->check(CLI::PositiveNumber);
  app.add_option("--lr-schedule", s.schedule,
                 "constant, or cosine: lr * (1 + cos(pi * t)) / 2 at the fraction t of all steps taken")
      ->check(CLI::IsMember({"constant", "cosine"}))
      ->capture_default_str();
  app.add_option("--momentum", s.momentum, "SGD momentum [default: 0.9 with sgd, 0 with kfac]")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--weight-decay", s.weight_decay, "L2 weight decay")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--damping", s.damping, "K-FAC damping gamma")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--factor-decay", s.factor_decay, "K-FAC running-average decay xi in [0, 1)")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  app.add_option("--kl-clip", s.kl_clip, "K-FAC KL clip (0: off)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--factor-every", s.factor_every, "K-FAC factor update period")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--inverse-every", s.inverse_every, "K-FAC inverse update period")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--replicated-precondition", s.replicated_precondition,
               "K-FAC: every rank preconditions every layer (default: split into column blocks, all-gathered)");
  app.add_option("--seed", s.seed, "initialisation and shuffling seed")->capture_default_str();
  app.add_option("--data", s.data, "directory with the Fashion-MNIST IDX files")->capture_default_str();
  app.add_option("--trace", s.trace, "write a Chrome trace of the run (chrome://tracing, Perfetto)");
  app.add_option("--log", s.log, "write a CSV line per epoch: loss, accuracies, seconds, images/s");
  app.add_option("--checkpoint", s.checkpoint, "save the training state here after every epoch");
  app.add_option("--resume", s.resume, "continue from a checkpoint (same options and rank count)");
  app.add_option("--save-model", s.save_model, "write the final parameters (raw float32, rank 0) here");
  app.add_option("--limit-batches", s.limit_batches, "stop each epoch after this many steps (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--quiet", s.quiet, "no per-epoch lines");
}

double sum_over_ranks(double x) {
  double y = 0;
  MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return y;
}

// One rank's batch copied to the device: rows of `images` and their labels.
struct Batch {
  nn::Tensor2<T, Mem> x;
  Kokkos::View<int*, Mem> y;
};
Batch gather(const nn::Dataset& d, const std::vector<int>& idx) {
  Batch b{nn::Tensor2<T, Mem>("x", idx.size(), 784), Kokkos::View<int*, Mem>("y", idx.size())};
  auto hx = Kokkos::create_mirror_view(b.x);
  auto hy = Kokkos::create_mirror_view(b.y);
  for (std::size_t i = 0; i < idx.size(); ++i) {
    std::copy_n(d.images.data() + static_cast<std::size_t>(idx[i]) * 784, 784, &hx(i, 0));
    hy(i) = d.labels[static_cast<std::size_t>(idx[i])];
  }
  Kokkos::deep_copy(b.x, hx);
  Kokkos::deep_copy(b.y, hy);
  return b;
}

// A free function: nvcc takes no KOKKOS_LAMBDA inside a private member function.
void scale_by(const Exec& exec, const Flat& g, T factor) {
  Kokkos::parallel_for(
      "scale_gradient", Kokkos::RangePolicy<Exec>(exec, 0, g.extent(0)),
      KOKKOS_LAMBDA(const int j) { g(j) *= factor; });
}

class Trainer {
 public:
  Trainer(const Settings& s, const nn::FashionMnist& data)
      : s_(s),
        data_(data),
        world_(MPI_COMM_WORLD),
        model_(s.model, s.seed),
        sgd_(model_.parameters(), s.lr, s.momentum, s.weight_decay),
        grads_(world_),
        timeline_(world_.rank()),
        batches_(data.train.count, world_.size() * s.workers, s.batch, s.seed) {
    timeline_.enable(!s.trace.empty());
    if (s.workers > 1) {
      if (s.optimizer != "sgd" || !s.checkpoint.empty() || !s.resume.empty())
        throw InvalidArgument("fashion_mnist: --workers-per-rank " + std::to_string(s.workers) +
                              " simulates SGD workers only, without --checkpoint or --resume");
      workers_ = std::make_unique<fmnist::LocalWorkers<T, Mem>>(s.workers, model_.parameters(), s.lr, s.momentum,
                                                                s.weight_decay);
    }
    if (s.optimizer == "kfac") {
      kfac::Options o;
      kfac::parse_strategy(s.strategy, &o.strategy);
      o.damping = s.damping;
      o.factor_decay = s.factor_decay;
      o.factor_every = s.factor_every;
      o.inverse_every = s.inverse_every;
      o.kl_clip = s.kl_clip;
      o.split_preconditioning = !s.replicated_precondition;
      o.lr = s.lr;
      o.timeline = &timeline_;
      kfac_ = std::make_unique<kfac::Preconditioner<T, Mem>>(world_, model_.kfac_layers(), o);
      model_.attach(kfac_.get());
    }
    std::vector<Flat> params, grads;
    std::vector<typename comm::FusedAllreducer<T, Mem>::Tensor> tensors;
    for (const auto& p : model_.parameters()) {
      params.push_back(p.value);
      tensors.push_back({p.name, p.value.extent(0), false});
      gradient_views_.push_back(Flat(const_cast<T*>(p.gradient.data()), p.gradient.extent(0)));
    }
    if (s.reduce == "adasum")
      adasum_ = std::make_unique<adasum::DeltaOptimizer<T, Mem>>(grads_, params);
    else
      fused_ = std::make_unique<comm::FusedAllreducer<T, Mem>>(grads_, tensors);
  }

  std::string describe() const {
    std::ostringstream os;
    os << "fashion_mnist: " << s_.model << ", " << s_.optimizer << ", reduce " << s_.reduce << ", " << world_.size()
       << " rank(s) x " << s_.workers << " worker(s) x batch " << s_.batch << ", lr " << s_.lr << " (" << s_.schedule
       << ")"
       << ", momentum " << s_.momentum << ", seed " << s_.seed;
    if (kfac_) os << "\n" << kfac_->describe();
    return os.str();
  }

  void run();

 private:
  struct EpochStats {
    double loss = 0, samples = 0, correct = 0, seconds = 0, skipped = 0;
  };
  EpochStats epoch(int e, fmnist::Progress& progress);
  int forward_backward(const Batch& b, EpochStats& st);
  void step(int k, int global, EpochStats& st);
  void reduce_and_update(int local, int global);
  void set_learning_rate(double progress);
  double test_accuracy();
  void save(int next_epoch, const std::vector<std::string>& log_lines);

  Settings s_;
  const nn::FashionMnist& data_;
  comm::Communicator world_;
  fmnist::Model<T, Mem> model_;
  nn::SGD<T, Mem> sgd_;
  comm::Engine grads_;
  Timeline timeline_;
  nn::ShardedBatches batches_;
  std::unique_ptr<kfac::Preconditioner<T, Mem>> kfac_;
  std::unique_ptr<comm::FusedAllreducer<T, Mem>> fused_;
  std::unique_ptr<adasum::DeltaOptimizer<T, Mem>> adasum_;
  std::unique_ptr<fmnist::LocalWorkers<T, Mem>> workers_;
  std::vector<Flat> gradient_views_;
  nn::SoftmaxCrossEntropy<T, Mem> loss_;
  nn::Tensor2<T, Mem> dlogits_;
};

// Forward and backward of one batch; returns its sample count.
int Trainer::forward_backward(const Batch& b, EpochStats& st) {
  Exec exec;
  const int local = static_cast<int>(b.x.extent(0));
  nn::ConstTensor2<T, Mem> logits;
  {
    Phase p("forward", &timeline_, "model");
    logits = model_.forward(exec, b.x);
    st.loss += loss_.forward(exec, logits, b.y) * local;
    st.correct += loss_.correct(exec, logits, b.y);
    st.samples += local;
  }
  Phase p("backward", &timeline_, "model");
  if (dlogits_.extent(0) != static_cast<std::size_t>(local)) dlogits_ = nn::Tensor2<T, Mem>("dlogits", local, 10);
  loss_.backward(exec, dlogits_);
  model_.backward(exec, dlogits_);
  return local;
}

// Global batch k: this rank's shard (or its simulated workers' shards), then the update.
void Trainer::step(int k, int global, EpochStats& st) {
  const int K = s_.workers, r = world_.rank();
  if (!workers_) {
    reduce_and_update(forward_backward(gather(data_.train, batches_.indices(k, r)), st), global);
    return;
  }
  Exec exec;
  const auto worker = [&](int w) { return forward_backward(gather(data_.train, batches_.indices(k, r * K + w)), st); };
  if (adasum_) {
    Phase p("adasum step", &timeline_, "optimizer");
    adasum_->step(exec, gradient_views_, [&] { workers_->adasum_local_step(exec, worker); });
    return;
  }
  reduce_and_update(workers_->sum_gradients(exec, gradient_views_, worker), global);
}

void Trainer::reduce_and_update(int local, int global) {
  Exec exec;
  auto grads = model_.gradients();
  if (adasum_) {
    Phase p("adasum step", &timeline_, "optimizer");
    adasum_->step(exec, gradient_views_, [&] {
      if (kfac_) kfac_->step(exec, grads);
      sgd_.step(exec);
    });
    return;
  }
  {
    Phase p("gradient all-reduce", &timeline_, "communication");
    // The global batch's mean gradient: each rank's mean weighted by its share of the samples.
    const T scale = static_cast<T>(static_cast<double>(local) * world_.size() / global);
    fused_->begin();
    for (std::size_t i = 0; i < gradient_views_.size(); ++i) {
      const Flat g = gradient_views_[i];
      if (scale != T(1)) scale_by(exec, g, scale);
      fused_->ready(exec, static_cast<int>(i), g);
    }
    fused_->wait(exec);
  }
  if (kfac_) kfac_->step(exec, grads);
  Phase p("sgd", &timeline_, "optimizer");
  sgd_.step(exec);
}

// The schedule's rate at `progress`, the fraction of all steps taken (from the epoch and step,
// so a resumed run follows the same schedule).
void Trainer::set_learning_rate(double progress) {
  if (s_.schedule == "constant") return;
  const double lr = s_.lr * 0.5 * (1 + std::cos(M_PI * progress));
  sgd_.set_learning_rate(lr);
  if (workers_) workers_->set_learning_rate(lr);
  if (kfac_) kfac_->set_learning_rate(lr);
}

Trainer::EpochStats Trainer::epoch(int e, fmnist::Progress& progress) {
  EpochStats st;
  batches_.set_epoch(e);
  const double t0 = Clock::local_now();
  int steps = batches_.batches();
  if (s_.limit_batches > 0) steps = std::min(steps, s_.limit_batches);
  for (int k = 0; k < steps; ++k) {
    set_learning_rate((e + static_cast<double>(k) / steps) / s_.epochs);
    const int global = batches_.global_size(k);
    if (global < world_.size() * s_.workers) {  // some worker would have no sample
      st.skipped += global;
      continue;
    }
    step(k, global, st);
    progress.update(k + 1, steps, st.samples * world_.size(), st.loss / st.samples, Clock::local_now() - t0);
  }
  Kokkos::fence();
  st.seconds = Clock::local_now() - t0;
  st.loss = sum_over_ranks(st.loss);
  st.correct = sum_over_ranks(st.correct);
  st.samples = sum_over_ranks(st.samples);
  return st;
}

double Trainer::test_accuracy() {
  Exec exec;
  const int n = data_.test.count, P = world_.size(), r = world_.rank();
  model_.attach(nullptr);  // evaluation is no training step: no K-FAC hooks
  double correct = 0;
  for (int first = r * n / P, end = (r + 1) * n / P; first < end; first += 1000) {
    std::vector<int> idx;
    for (int i = first; i < std::min(end, first + 1000); ++i) idx.push_back(i);
    const Batch b = gather(data_.test, idx);
    correct += loss_.correct(exec, model_.forward(exec, b.x), b.y);
  }
  model_.attach(kfac_.get());
  return sum_over_ranks(correct) / n;
}

void Trainer::save(int next_epoch, const std::vector<std::string>& log_lines) {
  if (s_.checkpoint.empty()) return;
  fmnist::save_checkpoint(s_.checkpoint, world_.rank(), next_epoch, model_.parameters(), sgd_, log_lines);
  if (kfac_) kfac_->save(s_.checkpoint + ".kfac");
}

void Trainer::run() {
  int first_epoch = 0;
  std::vector<std::string> log_lines;
  if (!s_.resume.empty()) {
    first_epoch = fmnist::load_checkpoint(s_.resume, model_.parameters(), sgd_, &log_lines);
    if (kfac_) kfac_->load(s_.resume + ".kfac");
  }
  const bool root = world_.rank() == 0;
  fmnist::Progress progress(root && !s_.quiet && isatty(STDOUT_FILENO));
  double total_seconds = 0, last_test = 0;
  for (int e = first_epoch; e < s_.epochs; ++e) {
    progress.start("epoch " + std::to_string(e + 1) + "/" + std::to_string(s_.epochs));
    const EpochStats st = epoch(e, progress);
    last_test = test_accuracy();
    total_seconds += st.seconds;
    const double ips = st.samples / st.seconds;
    char line[256];
    std::snprintf(line, sizeof line, "%d,%.6f,%.4f,%.4f,%.3f,%.0f", e + 1, st.loss / st.samples,
                  st.correct / st.samples, last_test, st.seconds, ips);
    log_lines.push_back(line);
    progress.finish();
    if (root && !s_.quiet)
      std::printf(
          "epoch %d/%d: loss %.4f, train %.2f %%, test %.2f %%, %.1f s, %.0f images/s%s\n", e + 1, s_.epochs,
          st.loss / st.samples, 100 * st.correct / st.samples, 100 * last_test, st.seconds, ips,
          st.skipped > 0
              ? (", skipped the last " + std::to_string(int(st.skipped)) + " samples (fewer than ranks)").c_str()
              : "");
    std::fflush(stdout);
    if (root && !s_.log.empty()) {
      std::string csv = "epoch,loss,train_accuracy,test_accuracy,seconds,images_per_second\n";
      for (const auto& l : log_lines) csv += l + "\n";
      write_file_atomically(s_.log, csv, "fashion_mnist --log");
    }
    save(e + 1, log_lines);
  }
  if (!s_.trace.empty()) fmnist::write_trace(s_.trace, timeline_);
  if (root && kfac_ && !s_.quiet) {
    const kfac::Stats k = kfac_->stats();
    std::printf(
        "K-FAC on rank 0 (s): factors %.2f, factor all-reduce exposed %.2f, inverses %.2f, inverse broadcast "
        "exposed %.2f, preconditioning %.2f\n",
        k.factor_compute, k.factor_comm_exposed, k.inverse_compute, k.inverse_comm_exposed, k.precondition);
  }
  if (root && !s_.save_model.empty()) fmnist::save_model(s_.save_model, model_.parameters());
  if (root)
    std::printf("test accuracy %.2f %% after %d epoch(s), %.1f s of training%s%s\n", 100 * last_test, s_.epochs,
                total_seconds, s_.log.empty() ? "" : (", log " + s_.log).c_str(),
                s_.trace.empty() ? "" : (", trace " + s_.trace).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    CLI::App app{"kdist: distributed Fashion-MNIST training with SGD, K-FAC and Adasum"};
    Settings s;
    // An option given twice takes the last value, so a wrapper's defaults (scripts/demo.sh) can be
    // overridden by arguments appended after them.
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    add_options(app, s);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    bool train = true;
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {  // --help, an unknown option or a bad value
      train = false;
      rc = rank == 0 ? app.exit(e) : (e.get_exit_code() != 0 ? 2 : 0);
    }
    if (train) {
      const bool kfac = s.optimizer == "kfac";
      if (s.lr < 0) s.lr = kfac ? 0.1 : 0.05;
      if (s.momentum < 0) s.momentum = kfac ? 0.0 : 0.9;
      try {
        const nn::FashionMnist data = nn::load_fashion_mnist(s.data);
        Trainer trainer(s, data);
        if (rank == 0 && !s.quiet) std::printf("%s\n", trainer.describe().c_str());
        trainer.run();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "fashion_mnist (rank %d): %s\n", rank, e.what());
        rc = 1;
      }
    }
  }
  MPI_Finalize();
  return rc;
}
