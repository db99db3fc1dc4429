// The workers study: fashion_mnist_workers --workers-per-rank K makes P ranks train as P x K SGD
// workers (workers.hpp), for Adasum against averaging at more workers than this machine has cores.
// Worker w of rank r reads shard r x K + w of every global batch of P x K x batch samples; the rest
// (options, model, data, log, output) is the main job's (trainer.hpp, options.hpp). SGD only, no
// checkpoints. K = 1 is the main job with --optimizer sgd.
#include "program.hpp"
#include "workers.hpp"

namespace {

using namespace fmnist;

class WorkersStudy : public Trainer {
 public:
  WorkersStudy(const Settings& s, const nn::FashionMnist& data)
      : Trainer(s, data), workers_(s.workers, model_.parameters(), s.lr, s.momentum, s.weight_decay) {}

 protected:
  void step(int k, int global, EpochStats& st) override {
    if (s_.workers == 1) {
      Trainer::step(k, global, st);
      return;
    }
    Exec exec;
    const int first = world_.rank() * s_.workers;
    const auto worker = [&](int w) { return train_on(k, first + w, st); };
    if (s_.reduce == Reduce::adasum)
      adasum_step([&] { workers_.adasum_local_step(exec, worker); });
    else
      reduce_and_update(workers_.sum_gradients(exec, gradient_views_, worker), global);
  }
  void apply_learning_rate(double lr) override {
    Trainer::apply_learning_rate(lr);
    workers_.set_learning_rate(lr);
  }

 private:
  LocalWorkers<T, Mem> workers_;
};

}  // namespace

int main(int argc, char** argv) {
  return fmnist::run_program<WorkersStudy>(
      argc, argv, fmnist::Program::workers_study,
      "kdist: Fashion-MNIST with K simulated SGD workers per rank (Adasum against averaging at many workers)");
}
