// The main job: distributed Fashion-MNIST training with SGD or K-FAC, gradients averaged or
// combined by Adasum (trainer.hpp). mpiexec -n P build/examples/fashion_mnist --help lists every
// option (options.hpp). The study of Adasum at more workers than cores is its own program,
// fashion_mnist_workers (workers_study.cpp).
#include "program.hpp"

int main(int argc, char** argv) {
  return fmnist::run_program<fmnist::Trainer>(argc, argv, fmnist::Program::main_job,
                                              "kdist: distributed Fashion-MNIST training with SGD, K-FAC and Adasum");
}
