#include <kdist/core/packed.hpp>

#include <limits>
#include <string>

namespace kdist {

namespace {

/// packed_size(n), or false when it does not fit in size_t (no intermediate overflows).
bool checked_packed_size(std::size_t n, std::size_t* out) {
  std::size_t a = n, b = n + 1;  // n + 1 cannot wrap: callers keep n below 2^(digits/2 + 1)
  if (a % 2 == 0)
    a /= 2;
  else
    b /= 2;
  if (a != 0 && b > std::numeric_limits<std::size_t>::max() / a) return false;
  *out = a * b;
  return true;
}

}  // namespace

// The largest n with packed_size(n) <= size, by bisection on [0, 2^(digits/2 + 1)): packed_size
// of the upper end exceeds every size_t, so the answer lies inside, and checked_packed_size
// never wraps. About 33 steps for 64-bit size_t, whatever the size.
std::size_t packed_dim(std::size_t size) {
  std::size_t lo = 0;                                                                     // packed_size(lo) <= size
  std::size_t hi = std::size_t(1) << (std::numeric_limits<std::size_t>::digits / 2 + 1);  // > size
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    std::size_t t = 0;
    if (checked_packed_size(mid, &t) && t <= size)
      lo = mid;
    else
      hi = mid;
  }
  if (packed_size(lo) != size)
    impl::throw_invalid("kdist::packed_dim", std::to_string(size) + " is not n(n+1)/2 for any n");
  return lo;
}

}  // namespace kdist
