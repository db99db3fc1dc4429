// Whether a value each rank computed on its own is the same on every rank of MPI_COMM_WORLD, bit
// for bit: what "agrees across ranks" means in the tests (a cost model, a reduced vector).
#pragma once

#include <mpi.h>

#include <cstring>
#include <type_traits>
#include <vector>

namespace kdist_test {

/// Collective: true on every rank when every rank's `mine` has the same size and bytes as this one's.
template <class T>
bool same_on_every_rank(const std::vector<T>& mine) {
  static_assert(std::is_trivially_copyable<T>::value, "compared as bytes");
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long long counts[2] = {static_cast<long long>(mine.size()), -static_cast<long long>(mine.size())};
  MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  if (counts[0] != -counts[1]) return false;  // the sizes differ
  const int bytes = static_cast<int>(mine.size() * sizeof(T));
  std::vector<unsigned char> all(static_cast<std::size_t>(bytes) * static_cast<std::size_t>(size));
  MPI_Allgather(mine.data(), bytes, MPI_BYTE, all.data(), bytes, MPI_BYTE, MPI_COMM_WORLD);
  bool same = true;
  for (int r = 0; r < size; ++r) same = same && std::memcmp(all.data() + r * bytes, mine.data(), bytes) == 0;
  return same;
}

}  // namespace kdist_test
