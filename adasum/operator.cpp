#include <kdist/adasum/operator.hpp>

namespace kdist {
namespace adasum {
namespace impl {

void check_bounds(const char* func, const std::vector<std::size_t>& bounds, std::size_t n) {
  // {0}: an empty buffer of no tensors.
  if (bounds.empty() || bounds.front() != 0 || bounds.back() != n)
    kdist::impl::throw_invalid(func, "tensor bounds must run from 0 to the buffer size " + std::to_string(n) +
                                         " (got " + std::to_string(bounds.size()) + " offsets ending at " +
                                         std::to_string(bounds.empty() ? 0 : bounds.back()) + ")");
  for (std::size_t t = 1; t < bounds.size(); ++t)
    if (bounds[t] < bounds[t - 1])
      kdist::impl::throw_invalid(func, "tensor bounds decrease at tensor " + std::to_string(t - 1));
}

}  // namespace impl
}  // namespace adasum
}  // namespace kdist
