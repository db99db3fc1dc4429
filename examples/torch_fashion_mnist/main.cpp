// The main job's MLP and CNN written in LibTorch, trained with kdist: gradients averaged in one
// fused all-reduce or parameter deltas combined by Adasum (kdist::torch::GradientReducer), and
// SGD or SGD preconditioned by kdist's SPD-KFAC (kdist::torch::KFAC) - what a LibTorch code adds
// to use kdist. Data, sharding, normalisation and defaults are examples/fashion_mnist's:
//
//   mpiexec -n 2 build/examples/torch_fashion_mnist --model cnn --optimizer kfac --epochs 2
//
// Each rank trains on its shard of every global batch of P x --batch samples (nn::ShardedBatches)
// with one torch thread; a rank with fewer samples in the last batch weights its mean gradient by
// its share, so the average is the global batch's mean gradient, as in the main job. Per epoch
// rank 0 prints the loss, the accuracies and images/s; --log writes the main job's CSV columns
// (its path checked before training). A failure on one rank reaches the others with its reason
// (the data set missing on one rank too, before the Engines exist); every rank that ends with an
// error prints it and exits 1.
#include <kdist/comm/outcome.hpp>
#include <kdist/core/atomic_file.hpp>
#include <kdist/core/host_blas.hpp>
#include <kdist/core/timer.hpp>
#include <kdist/nn/batches.hpp>
#include <kdist/nn/idx.hpp>
#include <kdist/nn/init.hpp>
#include <kdist/torch/gradient_reducer.hpp>
#include <kdist/torch/kfac.hpp>
#include <kdist/torch/tensor_view.hpp>

#include <mpi.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "../common/agree_on_start.hpp"
#include "../common/torch_net.hpp"
#include "../common/training_options.hpp"

namespace {

struct Settings {
  std::string model = "mlp", optimizer = "kfac", reduce = "average", data = kdist::nn::kFashionMnistDefaultDir, log;
  int epochs = 10, batch = 64, limit_batches = 0;
  double lr = -1, momentum = -1, weight_decay = 0;
  kdist::kfac::Options kfac = examples::kfac_job_defaults();  // lr: this job's --lr
  examples::Schedule schedule = examples::Schedule::constant;
  std::uint64_t seed = 1;
  bool quiet = false;
};

/// Rows `idx` of a split as a B x 784 tensor and their labels.
std::pair<at::Tensor, at::Tensor> gather(const kdist::nn::Dataset& d, const std::vector<int>& idx) {
  const int n = static_cast<int>(idx.size()), f = d.features();
  at::Tensor x = ::torch::empty({n, f}), y = ::torch::empty({n}, ::torch::kLong);
  for (int i = 0; i < n; ++i) {
    std::copy_n(d.images.data() + static_cast<std::size_t>(idx[i]) * f, f, x.data_ptr<float>() + i * f);
    y.data_ptr<int64_t>()[i] = d.labels[static_cast<std::size_t>(idx[i])];
  }
  return {x, y};
}

class Job {
 public:
  Job(const Settings& s, const kdist::nn::FashionMnist& data)
      : s_(s),
        data_(data),
        world_(MPI_COMM_WORLD),
        grads_(world_),
        model_(std::make_shared<examples::TorchNet>(s.model == "cnn")),
        reducer_(*model_, grads_, s.reduce == "adasum" ? kdist::torch::Reduce::adasum : kdist::torch::Reduce::average),
        sgd_(model_->parameters(), ::torch::optim::SGDOptions(s.lr).momentum(s.momentum).weight_decay(s.weight_decay)),
        batches_(data.train.count, world_.size(), s.batch, s.seed) {
    model_->initialise(s.seed);
    if (s.optimizer == "kfac") {
      kdist::kfac::Options o = s.kfac;
      o.lr = s.lr;
      // Adasum combines deltas: each rank preconditions its own, unaveraged gradient.
      if (s.reduce == "adasum") o.gradients = kdist::kfac::Gradients::per_rank;
      kfac_engine_ = std::make_unique<kdist::comm::Engine>(world_);
      kfac_ = std::make_unique<kdist::torch::KFAC>(*model_, *kfac_engine_, o);
    }
  }

  std::string describe() const {
    return "torch_fashion_mnist: " + s_.model + ", " + s_.optimizer + ", reduce " + s_.reduce + ", " +
           std::to_string(world_.size()) + " rank(s) x batch " + std::to_string(s_.batch) + ", lr " +
           std::to_string(s_.lr) + " (" + examples::name_of(examples::kScheduleNames, s_.schedule) + ")" +
           ", momentum " + std::to_string(s_.momentum) + ", weight decay " + std::to_string(s_.weight_decay) +
           ", seed " + std::to_string(s_.seed) + (kfac_ ? "\n" + kfac_->describe() : "") +
           "\nhost BLAS: " + kdist::host_blas().summary();
  }

  void run() {
    try {
      train();
    } catch (...) {  // the peers learn why
      grads_.fail(std::current_exception());
      if (kfac_engine_) kfac_engine_->fail(std::current_exception());
      throw;
    }
  }

 private:
  /// --lr-schedule: the rate at the fraction of all steps taken, as in the main job.
  void set_learning_rate(double progress) {
    if (s_.schedule == examples::Schedule::constant) return;
    const double lr = examples::learning_rate(s_.schedule, s_.lr, progress);
    for (auto& group : sgd_.param_groups()) static_cast<::torch::optim::SGDOptions&>(group.options()).lr(lr);
    if (kfac_) kfac_->preconditioner().set_learning_rate(lr);
  }

  void step(int k) {
    const auto [x, y] = gather(data_.train, batches_.indices(k, world_.rank()));
    sgd_.zero_grad();
    const at::Tensor logits = model_->forward(x, kfac_.get());
    const at::Tensor loss = ::torch::nn::functional::cross_entropy(logits, y);
    loss.backward();
    if (reducer_.reduce() != kdist::torch::Reduce::adasum) weight_by_share(x.size(0), batches_.global_size(k));
    loss_ += loss.item<double>() * x.size(0);
    correct_ += logits.argmax(1).eq(y).sum().item<double>();
    samples_ += static_cast<double>(x.size(0));
    if (reducer_.reduce() == kdist::torch::Reduce::adasum) {
      reducer_.step([&] {
        if (kfac_) kfac_->step();
        sgd_.step();
      });
      return;
    }
    if (s_.reduce == "mpi")
      examples::mpi_average_gradients(*model_, world_.size());
    else
      reducer_.allreduce();
    if (kfac_) kfac_->step();
    sgd_.step();
  }

  /// The global batch's mean gradient from an average of the ranks' means: each rank's mean
  /// weighted by its share of the samples (uneven only in a last batch that P does not divide).
  /// The gradients, not the loss: K-FAC's G factor keeps seeing the rank's mean loss.
  void weight_by_share(std::int64_t local, int global) {
    const double scale = static_cast<double>(local) * world_.size() / global;
    if (scale == 1.0) return;
    ::torch::NoGradGuard no_grad;
    for (auto& p : model_->parameters()) p.mutable_grad().mul_(scale);
  }

  /// --log's path, before any training: rank 0 writes it, every rank learns the outcome.
  void check_outputs() {
    kdist::comm::agree_on_outcome_of(grads_, "torch_fashion_mnist --log", [&] {
      if (world_.rank() == 0 && !s_.log.empty()) kdist::check_file_writable(s_.log, "torch_fashion_mnist --log");
    });
  }

  /// Rank 0 rewrites the log; every rank learns the outcome, so none ends well alone.
  void write_log(const std::string& csv) {
    if (s_.log.empty()) return;
    kdist::comm::agree_on_outcome_of(grads_, "torch_fashion_mnist --log", [&] {
      if (world_.rank() == 0) kdist::write_file_atomically(s_.log, csv, "torch_fashion_mnist --log");
    });
  }

  double test_accuracy() {
    ::torch::NoGradGuard no_grad;
    model_->eval();
    const int n = data_.test.count, P = world_.size(), r = world_.rank();
    double correct = 0;
    for (int first = r * n / P, end = (r + 1) * n / P; first < end; first += 1000) {
      std::vector<int> idx;
      for (int i = first; i < std::min(end, first + 1000); ++i) idx.push_back(i);
      const auto [x, y] = gather(data_.test, idx);
      correct += model_->forward(x, nullptr).argmax(1).eq(y).sum().item<double>();
    }
    model_->train();
    return grads_.allreduce_values<double>({correct}, kdist::comm::ReduceOp::sum, "torch_fashion_mnist test")[0] / n;
  }

  void train() {
    check_outputs();
    std::string csv = "epoch,loss,train_accuracy,test_accuracy,seconds,images_per_second\n";
    for (int e = 0; e < s_.epochs; ++e) {
      batches_.set_epoch(static_cast<std::uint64_t>(e));
      loss_ = correct_ = samples_ = 0;
      int steps = batches_.batches();
      if (s_.limit_batches > 0) steps = std::min(steps, s_.limit_batches);
      const double t0 = kdist::Clock::local_now();
      for (int k = 0; k < steps; ++k) {
        set_learning_rate((e + static_cast<double>(k) / steps) / s_.epochs);
        if (batches_.global_size(k) >= world_.size()) step(k);  // a rank without samples: skip the batch
      }
      const double seconds = kdist::Clock::local_now() - t0;
      const std::vector<double> sums = grads_.allreduce_values<double>(
          {loss_, correct_, samples_}, kdist::comm::ReduceOp::sum, "torch_fashion_mnist sums");
      const double loss = sums[0], correct = sums[1], samples = sums[2], test = test_accuracy();
      char line[256];
      std::snprintf(line, sizeof line, "%d,%.6f,%.4f,%.4f,%.3f,%.0f", e + 1, loss / samples, correct / samples, test,
                    seconds, samples / seconds);
      csv += std::string(line) + "\n";
      if (world_.rank() == 0 && !s_.quiet) {
        std::printf("epoch %d/%d: loss %.4f, train %.2f %%, test %.2f %%, %.1f s, %.0f images/s\n", e + 1, s_.epochs,
                    loss / samples, 100 * correct / samples, 100 * test, seconds, samples / seconds);
        std::fflush(stdout);
      }
      write_log(csv);
    }
  }

  const Settings s_;
  const kdist::nn::FashionMnist& data_;
  kdist::comm::Communicator world_;
  kdist::comm::Engine grads_;
  std::shared_ptr<examples::TorchNet> model_;
  kdist::torch::GradientReducer reducer_;
  ::torch::optim::SGD sgd_;
  kdist::nn::ShardedBatches batches_;
  std::unique_ptr<kdist::comm::Engine> kfac_engine_;  // outlives kfac_
  std::unique_ptr<kdist::torch::KFAC> kfac_;
  double loss_ = 0, correct_ = 0, samples_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, rc = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    ::torch::set_num_threads(1);
    CLI::App app{"kdist from LibTorch: Fashion-MNIST with SGD, K-FAC and Adasum"};
    Settings s;
    app.add_option("--model", s.model, "mlp or cnn")->check(CLI::IsMember({"mlp", "cnn"}))->capture_default_str();
    app.add_option("--optimizer", s.optimizer, "sgd or kfac")
        ->check(CLI::IsMember({"sgd", "kfac"}))
        ->capture_default_str();
    app.add_option("--reduce", s.reduce,
                   "average or adasum (kdist::torch::GradientReducer), or mpi: one MPI_Allreduce per gradient, "
                   "the baseline without kdist")
        ->check(CLI::IsMember({"average", "adasum", "mpi"}))
        ->capture_default_str();
    app.add_option("--epochs", s.epochs, "epochs")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--batch", s.batch, "samples per rank per step")->check(CLI::PositiveNumber)->capture_default_str();
    app.add_option("--lr", s.lr, "learning rate [default: 0.05 with sgd, 0.1 with kfac]")->check(CLI::PositiveNumber);
    app.add_option("--momentum", s.momentum, "SGD momentum [default: 0.9 with sgd, 0 with kfac]")
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--weight-decay", s.weight_decay, "L2 weight decay (in the optimizer, after K-FAC)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    examples::add_schedule_option(app, s.schedule);
    examples::add_kfac_options(app, s.kfac);
    app.add_option("--seed", s.seed, "initialisation and shuffling seed")->capture_default_str();
    app.add_option("--data", s.data, "directory with the Fashion-MNIST IDX files")->capture_default_str();
    app.add_option("--log", s.log, "CSV, one line per epoch (the main job's columns)");
    app.add_option("--limit-batches", s.limit_batches, "stop each epoch after this many steps (0: all)")
        ->check(CLI::NonNegativeNumber);
    app.add_flag("--quiet", s.quiet, "no per-epoch lines");
    try {
      app.parse(argc, argv);
      const bool kfac = s.optimizer == "kfac";
      if (s.lr < 0) s.lr = kfac ? 0.1 : 0.05;
      if (s.momentum < 0) s.momentum = kfac ? 0.0 : 0.9;
      kdist::nn::FashionMnist data;
      examples::agree_on_start([&] { data = kdist::nn::load_fashion_mnist(s.data); });
      Job job(s, data);
      if (rank == 0 && !s.quiet) std::printf("%s\n", job.describe().c_str());
      job.run();
    } catch (const CLI::ParseError& e) {
      rc = rank == 0 ? app.exit(e) : (e.get_exit_code() != 0 ? 2 : 0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torch_fashion_mnist (rank %d): %s\n", rank, e.what());
      rc = 1;
    }
  }
  MPI_Finalize();
  return rc;
}
