#include <kdist/core/packed.hpp>

#include <cmath>

namespace kdist {

std::size_t packed_dim(std::size_t size) {
  auto n = static_cast<std::size_t>((std::sqrt(8.0 * static_cast<double>(size) + 1.0) - 1.0) / 2.0);
  while (packed_size(n) < size) ++n;
  while (n > 0 && packed_size(n) > size) --n;
  if (packed_size(n) != size)
    impl::throw_invalid("kdist::packed_dim", std::to_string(size) + " is not n(n+1)/2 for any n");
  return n;
}

}  // namespace kdist
