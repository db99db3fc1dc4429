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

// mlp: 784-256-128-10; cnn: Conv(1,16,5x5,pad 2) ReLU MaxPool2 Conv(16,32,5x5,pad 2) ReLU MaxPool2
// Dense(1568,128) ReLU Dense(128,10) - examples/fashion_mnist/model.hpp's layers.
struct Net : ::torch::nn::Module {
  explicit Net(bool cnn) : cnn_(cnn) {
    if (cnn_) {
      conv1 = register_module("conv1", ::torch::nn::Conv2d(::torch::nn::Conv2dOptions(1, 16, 5).padding(2)));
      conv2 = register_module("conv2", ::torch::nn::Conv2d(::torch::nn::Conv2dOptions(16, 32, 5).padding(2)));
    }
    const int features = cnn_ ? 32 * 7 * 7 : 28 * 28;
    for (const int width : cnn_ ? std::vector<int>{128, 10} : std::vector<int>{256, 128, 10}) {
      dense.push_back(register_module("fc" + std::to_string(dense.size() + 1),
                                      ::torch::nn::Linear(dense.empty() ? features : last_width_, width)));
      last_width_ = width;
    }
  }
  /// examples/fashion_mnist's initialisation, value for value: He normal weights drawn from
  /// (seed, seed + 1, ...) in layer order (nn/init.hpp), zero biases.
  void initialise(std::uint64_t seed) {
    ::torch::NoGradGuard no_grad;
    const auto init = [&](at::Tensor& weight, at::Tensor& bias) {
      const int fan_in = static_cast<int>(weight.numel() / weight.size(0));
      kdist::nn::he_normal(Kokkos::DefaultHostExecutionSpace(),
                           kdist::torch::flat_view_of<float, Kokkos::HostSpace>(weight, "weight"), fan_in, seed++);
      bias.zero_();
    };
    if (cnn_)
      for (auto* c : {&conv1, &conv2}) init((*c)->weight, (*c)->bias);
    for (auto& d : dense) init(d->weight, d->bias);
  }
  /// Logits of x (B x 784); with `kfac` its layers run through kfac.forward.
  at::Tensor forward(at::Tensor x, kdist::torch::KFAC* kfac) {
    const auto run = [&](auto& layer, const at::Tensor& in) { return kfac ? kfac->forward(layer, in) : layer(in); };
    if (cnn_) {
      x = x.view({-1, 1, 28, 28});
      x = ::torch::max_pool2d(::torch::relu(run(conv1, x)), 2);
      x = ::torch::max_pool2d(::torch::relu(run(conv2, x)), 2);
      x = x.flatten(1);
    }
    for (std::size_t k = 0; k < dense.size(); ++k) {
      x = run(dense[k], x);
      if (k + 1 < dense.size()) x = ::torch::relu(x);
    }
    return x;
  }
  bool cnn_;
  int last_width_ = 0;
  ::torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  std::vector<::torch::nn::Linear> dense;
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
        model_(std::make_shared<Net>(s.model == "cnn")),
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
           ", seed " + std::to_string(s_.seed) + (kfac_ ? "\n" + kfac_->describe() : "");
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
      mpi_average();
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

  /// --reduce mpi, the baseline without kdist: one blocking MPI_Allreduce per gradient tensor.
  void mpi_average() {
    for (const auto& p : model_->parameters()) {
      at::Tensor g = p.grad();
      MPI_Allreduce(MPI_IN_PLACE, g.data_ptr<float>(), static_cast<int>(g.numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      g.div_(world_.size());
    }
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
  std::shared_ptr<Net> model_;
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
