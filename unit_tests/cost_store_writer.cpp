// Saves a CostModelStore of ENTRIES entries of POINTS points each (default 16) to PATH: the program
// check_disk_full.sh runs against a full tmpfs. Exit 0 when save() reports success, 1 (with the
// message) otherwise.
#include <kdist/core/cost_model.hpp>
#include <kdist/core/error.hpp>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: cost_store_writer PATH ENTRIES [POINTS]\n");
    return 2;
  }
  const int points = argc == 4 ? std::atoi(argv[3]) : 16;
  kdist::CostModelStore store;
  for (int e = 1; e <= std::atoi(argv[2]); ++e) {
    std::vector<double> x, t;
    for (int i = 0; i < points; ++i) {
      x.push_back(4.0 * (1 << i));
      t.push_back(1e-5 * e + 1e-9 * x.back());
    }
    store.set({kdist::CostOp::allreduce, kdist::DType::float32, e, "world"}, kdist::CostModel::from_measurements(x, t));
  }
  try {
    store.save(argv[1]);
  } catch (const kdist::Error& err) {
    std::fprintf(stderr, "cost_store_writer: %s\n", err.what());
    return 1;
  }
  return 0;
}
