// The training loop of the main job (main.cpp) and of the workers study (workers_study.cpp):
// distributed Fashion-MNIST training with SGD or K-FAC, gradients averaged or combined by Adasum.
//
// Per step, on every rank: its shard of the global batch (nn::ShardedBatches) -> forward (the
// layers call the K-FAC hooks when --optimizer kfac) -> mean loss -> backward ->
//   --reduce average: gradients scaled by (local samples x P / global samples) and averaged in
//                     one fused all-reduce, so the update is the global batch's mean gradient;
//                     then kfac.step (preconditions in place) and the SGD step;
//   --reduce adasum:  each rank preconditions its own gradient and takes its local SGD step; the
//                     parameter deltas are combined by Adasum (docs/architecture.md §3).
// --lr-schedule cosine decays the rate to 0 over the run, per step. The model's input and output
// sizes are the data set's (image rows x cols, kFashionMnistClasses).
// A last global batch smaller than the worker count would leave a worker without samples: it is
// skipped, and the job says how many samples that was.
//
// Trainer is the main job. A program that trains differently per step derives from it and
// overrides step() (its shards: Settings::workers per rank, so the batches are cut into P x
// workers shards) and apply_learning_rate(); run() and everything it prints and writes (lines,
// CSV log, checkpoint, model, trace) stay the base's; program.hpp's run_program() is the whole
// main() around it.
#pragma once

#include <kdist/adasum/delta_optimizer.hpp>
#include <kdist/comm/fused_allreducer.hpp>
#include <kdist/comm/outcome.hpp>
#include <kdist/core/atomic_file.hpp>
#include <kdist/core/host_blas.hpp>
#include <kdist/kfac/preconditioner.hpp>
#include <kdist/nn/batches.hpp>
#include <kdist/nn/idx.hpp>
#include <kdist/nn/loss.hpp>

#include <mpi.h>
#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint.hpp"
#include "model.hpp"
#include "options.hpp"
#include "progress.hpp"

namespace fmnist {

using T = float;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Flat = Kokkos::View<T*, Mem>;

// One rank's batch copied to the device: rows of `images` and their labels.
struct Batch {
  nn::Tensor2<T, Mem> x;
  Kokkos::View<int*, Mem> y;
};

// The buffers one kind of batch is gathered into, kept from batch to batch: a GPU build would
// otherwise allocate and free device memory every step, and freeing it waits for the whole device.
// gather()'s batch stays valid until the next gather (the 2-argument deep_copy fences before it
// overwrites a batch the device may still read).
class BatchBuffer {
 public:
  const Batch& gather(const nn::Dataset& d, const std::vector<int>& idx) {
    const std::size_t features = static_cast<std::size_t>(d.features());
    if (b_.x.data() == nullptr || b_.x.extent(0) != idx.size() || b_.x.extent(1) != features) {
      hx_ = {};  // on the host the mirrors are the batch: let go of it before it is replaced
      hy_ = {};
      nn::impl::ensure(Exec(), b_.x, "x", idx.size(), features);
      nn::impl::ensure(Exec(), b_.y, "y", idx.size());
      hx_ = Kokkos::create_mirror_view(b_.x);
      hy_ = Kokkos::create_mirror_view(b_.y);
    }
    for (std::size_t i = 0; i < idx.size(); ++i) {
      std::copy_n(d.images.data() + static_cast<std::size_t>(idx[i]) * features, features, &hx_(i, 0));
      hy_(i) = d.labels[static_cast<std::size_t>(idx[i])];
    }
    Kokkos::deep_copy(b_.x, hx_);
    Kokkos::deep_copy(b_.y, hy_);
    return b_;
  }

 private:
  Batch b_;
  typename nn::Tensor2<T, Mem>::HostMirror hx_;
  typename Kokkos::View<int*, Mem>::HostMirror hy_;
};

// A free function: nvcc takes no KOKKOS_LAMBDA inside a private member function.
inline void scale_by(const Exec& exec, const Flat& g, T factor) {
  Kokkos::parallel_for(
      "scale_gradient", Kokkos::RangePolicy<Exec>(exec, 0, g.extent(0)),
      KOKKOS_LAMBDA(const std::size_t j) { g(j) *= factor; });
}

class Trainer {
 public:
  Trainer(const Settings& s, const nn::FashionMnist& data)
      : s_(s),
        world_(MPI_COMM_WORLD),
        model_(s.model, data.train.rows, data.train.cols, nn::kFashionMnistClasses, s.seed),
        data_(data),
        sgd_(model_.parameters(), s.lr, s.momentum, s.weight_decay),
        grads_(world_),
        timeline_(world_.rank()),
        batches_(data.train.count, world_.size() * s.workers, s.batch, s.seed) {
    timeline_.enable(!s.trace.empty());
    if (s.optimizer == Optimizer::kfac) {
      kfac::Options o = s.kfac;
      o.lr = s.lr;
      o.timeline = &timeline_;
      // Adasum combines deltas: each rank preconditions its own, unaveraged gradient.
      if (s.reduce == Reduce::adasum) o.gradients = kfac::Gradients::per_rank;
      kfac_engine_ = std::make_unique<comm::Engine>(world_);  // K-FAC's own stream, beside grads_
      kfac_ = std::make_unique<kfac::Preconditioner<T, Mem>>(*kfac_engine_, model_.kfac_layers(), o);
      model_.attach(kfac_.get());
    }
    std::vector<Flat> params, grads;
    std::vector<typename comm::FusedAllreducer<T, Mem>::Tensor> tensors;
    for (const auto& p : model_.parameters()) {
      params.push_back(p.value);
      tensors.push_back({p.name, p.value.extent(0), false});
      gradient_views_.push_back(Flat(const_cast<T*>(p.gradient.data()), p.gradient.extent(0)));
    }
    if (s.reduce == Reduce::adasum) {
      adasum_ = std::make_unique<adasum::DeltaOptimizer<T, Mem>>(grads_, params);
    } else {
      fused_ = std::make_unique<comm::FusedAllreducer<T, Mem>>(grads_, tensors);
      // Every gradient is ready when backward returns, so nothing is gained by sending early:
      // groups of up to 64 MiB (Horovod's fusion threshold), one all-reduce for these models.
      fused_->set_plan(comm::plan_threshold(fused_->measured(), comm::kDefaultFusionBytes));
      // The model keeps its gradients in one block in parameters() order: the fusion buffer
      // itself, so they are reduced where backward wrote them, with no copy in or out.
      fused_->use_storage(model_.gradient_storage());
      for (std::size_t i = 0; i < gradient_views_.size(); ++i)
        if (gradient_views_[i].data() != fused_->slot_data(static_cast<int>(i)))
          throw kdist::Error("fmnist::Trainer: gradient " + tensors[i].label +
                             " is not in its slot of the model's gradient storage (parameters() order)");
    }
  }
  virtual ~Trainer() = default;
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  std::string describe() const {
    std::ostringstream os;
    os << program_name(s_.program) << ": " << name_of(kModelNames, s_.model) << ", "
       << name_of(kOptimizerNames, s_.optimizer) << ", reduce " << name_of(kReduceNames, s_.reduce) << ", "
       << world_.size() << " rank(s) x " << s_.workers << " worker(s) x batch " << s_.batch << ", lr " << s_.lr << " ("
       << name_of(kScheduleNames, s_.schedule) << ")"
       << ", momentum " << s_.momentum << ", seed " << s_.seed;
    if (kfac_) os << "\n" << kfac_->describe();
    os << "\nhost BLAS: " << kdist::host_blas().summary();
    return os.str();
  }

  /// Trains (resuming from --resume, saving to --checkpoint). `saved`: --resume's checkpoint
  /// when the caller has read it already (open_checkpoint), released once resumed; null: read
  /// here. A failure on this rank reaches every other rank with its reason (Engine::fail) before
  /// it propagates.
  void run(std::unique_ptr<const kdist::StateReader> saved = nullptr);

 protected:
  using EpochStats = fmnist::EpochStats;
  /// Global batch k: this rank's shard, then the update (global: the batch's sample count).
  virtual void step(int k, int global, EpochStats& st) { reduce_and_update(train_on(k, world_.rank(), st), global); }
  /// The schedule's rate `lr` into every optimizer.
  virtual void apply_learning_rate(double lr) {
    sgd_.set_learning_rate(lr);
    if (kfac_) kfac_->set_learning_rate(lr);
  }

  /// Forward and backward of shard `shard` of global batch k; returns its sample count.
  int train_on(int k, int shard, EpochStats& st) {
    return forward_backward(train_batch_.gather(data_.train, batches_.indices(k, shard)), st);
  }
  /// --reduce average: the gradients averaged over the ranks (this rank's from `local` of the
  /// `global` samples), preconditioned, and the SGD step. --reduce adasum: adasum_step().
  void reduce_and_update(int local, int global);
  /// --reduce adasum: `local_step` moves this rank's parameters; the ranks' deltas are combined.
  void adasum_step(const std::function<void()>& local_step) {
    Phase p("adasum step", &timeline_, "optimizer");
    adasum_->step(Exec(), gradient_views_, local_step);
  }

  const Settings s_;
  comm::Communicator world_;
  Model<T, Mem> model_;
  std::vector<Flat> gradient_views_;  // the parameters' gradients, writable

 private:
  void train(std::unique_ptr<const kdist::StateReader> saved);
  /// The files rank 0 will write, probed before any training (collective): a bad path ends the
  /// run on every rank now, with its reason, not after the epochs it would have cost.
  void check_outputs();
  int forward_backward(const Batch& b, EpochStats& st);
  /// Epoch e from `from` (its step and sums so far); returns its sums over all ranks.
  EpochStats epoch(int e, const Position& from, Progress& progress);
  void set_learning_rate(double progress);
  double test_accuracy();
  /// `mine` (this rank's since `before`) summed over the ranks, added to `before`.
  EpochStats totals(const EpochStats& mine, const EpochStats& before, double seconds);
  void save(const Position& at);
  Position resume(const kdist::StateReader& saved);
  std::vector<std::string> parameter_names() const;
  /// Every rank's momentum buffers, rank after rank, each rank's concatenated (collective).
  Flat all_ranks_velocities();

  const nn::FashionMnist& data_;
  nn::SGD<T, Mem> sgd_;
  comm::Engine grads_;
  Timeline timeline_;
  nn::ShardedBatches batches_;
  BatchBuffer train_batch_, test_batch_;
  std::unique_ptr<comm::Engine> kfac_engine_;  // outlives kfac_
  std::unique_ptr<kfac::Preconditioner<T, Mem>> kfac_;
  std::unique_ptr<comm::FusedAllreducer<T, Mem>> fused_;
  std::unique_ptr<adasum::DeltaOptimizer<T, Mem>> adasum_;
  nn::SoftmaxCrossEntropy<T, Mem> loss_;
  nn::Tensor2<T, Mem> dlogits_;
  std::vector<std::string> log_lines_;  // the CSV lines so far
  int steps_run_ = 0;                   // steps taken by this run (--stop-after)
  bool stopped_ = false;                // --stop-after ended the run inside an epoch
};

inline int Trainer::forward_backward(const Batch& b, EpochStats& st) {
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
  if (dlogits_.extent(0) != static_cast<std::size_t>(local))
    dlogits_ = nn::Tensor2<T, Mem>("dlogits", local, model_.classes());
  loss_.backward(exec, dlogits_);
  model_.backward(exec, dlogits_);
  return local;
}

inline void Trainer::reduce_and_update(int local, int global) {
  Exec exec;
  auto grads = model_.gradients();
  if (adasum_) {
    adasum_step([&] {
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
inline void Trainer::set_learning_rate(double progress) {
  if (s_.schedule == Schedule::constant) return;
  apply_learning_rate(examples::learning_rate(s_.schedule, s_.lr, progress));
}

inline Trainer::EpochStats Trainer::epoch(int e, const Position& from, Progress& progress) {
  EpochStats st;  // this rank's, since `from`
  batches_.set_epoch(e);
  const double t0 = Clock::local_now();
  int steps = batches_.batches();
  if (s_.limit_batches > 0) steps = std::min(steps, s_.limit_batches);
  for (int k = from.batch; k < steps; ++k) {
    set_learning_rate((e + static_cast<double>(k) / steps) / s_.epochs);
    const int global = batches_.global_size(k);
    if (global < world_.size() * s_.workers) {  // some worker would have no sample
      st.skipped += global;
      continue;
    }
    step(k, global, st);
    progress.update(k + 1, steps, st.samples * world_.size(), st.loss / st.samples, Clock::local_now() - t0);
    stopped_ = s_.stop_after > 0 && ++steps_run_ == s_.stop_after;
    if (stopped_ || (s_.checkpoint_every > 0 && (k + 1) % s_.checkpoint_every == 0 && k + 1 < steps)) {
      const Position here{e, k + 1, totals(st, from.so_far, Clock::local_now() - t0), log_lines_};
      save(here);
      if (stopped_) return here.so_far;
    }
  }
  Kokkos::fence();
  return totals(st, from.so_far, Clock::local_now() - t0);
}

inline Trainer::EpochStats Trainer::totals(const EpochStats& mine, const EpochStats& before, double seconds) {
  const std::vector<double> x = grads_.allreduce_values<double>({mine.loss, mine.samples, mine.correct},
                                                                comm::ReduceOp::sum, "fashion_mnist sums");
  EpochStats all;
  all.loss = before.loss + x[0];
  all.samples = before.samples + x[1];
  all.correct = before.correct + x[2];
  all.seconds = before.seconds + seconds;
  all.skipped = before.skipped + mine.skipped;  // the same on every rank: whole global batches
  return all;
}

inline double Trainer::test_accuracy() {
  Exec exec;
  const int n = data_.test.count, P = world_.size(), r = world_.rank();
  model_.attach(nullptr);  // evaluation is no training step: no K-FAC hooks
  double correct = 0;
  // In chunks of the training batch, so that the layers' buffers (a convolution's patches) keep
  // their training shapes: chunks of 1 000 made the CNN reallocate about 400 MB of patches at each
  // test, and fault every page of them in, then shrink them back at the next training step.
  const int chunk = s_.batch;
  for (int first = r * n / P, end = (r + 1) * n / P; first < end; first += chunk) {
    std::vector<int> idx;
    for (int i = first; i < std::min(end, first + chunk); ++i) idx.push_back(i);
    const Batch& b = test_batch_.gather(data_.test, idx);
    correct += loss_.correct(exec, model_.forward(exec, b.x), b.y);
  }
  model_.attach(kfac_.get());
  return grads_.allreduce_values<double>({correct}, comm::ReduceOp::sum, "fashion_mnist test accuracy")[0] / n;
}

inline void Trainer::run(std::unique_ptr<const kdist::StateReader> saved) {
  try {
    if (!saved) saved = open_checkpoint(s_);
    train(std::move(saved));
  } catch (...) {  // tell the peers why, before the Engines go (docs/comm.md, fail)
    grads_.fail(std::current_exception());
    if (kfac_engine_) kfac_engine_->fail(std::current_exception());
    throw;
  }
}

inline void Trainer::check_outputs() {
  const std::string program = program_name(s_.program);
  comm::agree_on_outcome_of(grads_, program + " outputs", [&] {
    if (world_.rank() != 0) return;
    const std::pair<const std::string&, const char*> outputs[] = {
        {s_.checkpoint, " --checkpoint"}, {s_.save_model, " --save-model"}, {s_.log, " --log"}, {s_.trace, " --trace"}};
    for (const auto& out : outputs)
      if (!out.first.empty()) check_file_writable(out.first, (program + out.second).c_str());
  });
}

inline void Trainer::train(std::unique_ptr<const kdist::StateReader> saved) {
  check_outputs();
  const Position start = saved ? resume(*saved) : Position{};
  saved.reset();  // the checkpoint's bytes are in the model now
  log_lines_ = start.log_lines;
  const bool root = world_.rank() == 0;
  Progress progress(root && !s_.quiet && isatty(STDOUT_FILENO));
  double total_seconds = 0, last_test = 0;
  for (int e = start.epoch; e < s_.epochs; ++e) {
    progress.start("epoch " + std::to_string(e + 1) + "/" + std::to_string(s_.epochs));
    const EpochStats st = epoch(e, e == start.epoch ? start : Position{e, 0, {}, {}}, progress);
    if (stopped_) {
      progress.finish();
      if (root && !s_.quiet)
        std::printf("stopped after %d step(s) of this run, in epoch %d%s\n", steps_run_, e + 1,
                    s_.checkpoint.empty() ? "" : (": resume with --resume " + s_.checkpoint).c_str());
      break;
    }
    last_test = test_accuracy();
    total_seconds += st.seconds;
    const double ips = st.samples / st.seconds;
    char line[256];
    std::snprintf(line, sizeof line, "%d,%.6f,%.4f,%.4f,%.3f,%.0f", e + 1, st.loss / st.samples,
                  st.correct / st.samples, last_test, st.seconds, ips);
    log_lines_.push_back(line);
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
      for (const auto& l : log_lines_) csv += l + "\n";
      write_file_atomically(s_.log, csv, (std::string(program_name(s_.program)) + " --log").c_str());
    }
    save(Position{e + 1, 0, {}, log_lines_});
  }
  // The model while the Engine can still tell every rank that it could not be written.
  if (!s_.save_model.empty())
    comm::agree_on_outcome_of(grads_, std::string(program_name(s_.program)) + " --save-model", [&] {
      if (root) save_model(s_.save_model, model_.parameters());
    });
  // Every rank agrees that training ended well before the rank-0-only outputs and the trace's
  // plain MPI gather (a peer's failure raises here, with its reason).
  grads_.finish();
  if (kfac_engine_) kfac_engine_->finish();
  if (!s_.trace.empty()) write_trace(s_.trace, timeline_);
  if (root && kfac_ && !s_.quiet) {
    const kfac::Stats k = kfac_->stats();
    std::printf(
        "K-FAC on rank 0 (s): factors %.2f, factor all-reduce exposed %.2f, inverses %.2f, inverse broadcast "
        "exposed %.2f, preconditioning %.2f\n",
        k.factor_compute, k.factor_comm_exposed, k.inverse_compute, k.inverse_comm_exposed, k.precondition);
  }
  if (root && !stopped_)
    std::printf("test accuracy %.2f %% after %d epoch(s), %.1f s of training%s%s\n", 100 * last_test, s_.epochs,
                total_seconds, s_.log.empty() ? "" : (", log " + s_.log).c_str(),
                s_.trace.empty() ? "" : (", trace " + s_.trace).c_str());
}

}  // namespace fmnist

#include "trainer_state.hpp"
