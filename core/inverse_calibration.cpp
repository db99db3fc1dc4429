#include <kdist/core/inverse_calibration.hpp>

namespace kdist {

CostModel calibrate_inverse(int max_d, double budget_seconds, int repeats) {
  return calibrate_inverse(Kokkos::DefaultExecutionSpace(), max_d, budget_seconds, repeats);
}

}  // namespace kdist
