// Helpers shared by the Adasum tests: inputs, TestMem views and the serial operator tree.
#pragma once

#include <kdist/adasum/operator.hpp>
#include <kdist/comm/engine.hpp>

#include <mpi.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "test_space.hpp"

namespace kdist_test {
namespace adasum_util {

using kdist_test::TestExec;
using kdist_test::TestVector;
using kdist_test::to_host;
using kdist_test::Vec;
namespace adasum = kdist::adasum;

/// Which ranks of `comm` share this rank's memory node, as MPI itself reports it
/// (MPI_Comm_split_type SHARED and a group translation, no kdist code): the reference the tests
/// hold kdist's node detection to, and the only thing a layout test may skip on. Collective.
inline std::vector<bool> mpi_node_mates(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Group node_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_Comm_group(node, &node_group);
  MPI_Comm_group(comm, &group);
  int n = 0;
  MPI_Group_size(node_group, &n);
  std::vector<int> local(static_cast<std::size_t>(n)), ranks(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) local[static_cast<std::size_t>(i)] = i;
  MPI_Group_translate_ranks(node_group, n, local.data(), group, ranks.data());
  std::vector<bool> mates(static_cast<std::size_t>(size), false);
  for (int r : ranks) mates[static_cast<std::size_t>(r)] = true;
  MPI_Group_free(&node_group);
  MPI_Group_free(&group);
  MPI_Comm_free(&node);
  return mates;
}

inline std::vector<std::size_t> bounds_of(const std::vector<std::size_t>& sizes) {
  std::vector<std::size_t> b{0};
  for (auto s : sizes) b.push_back(b.back() + s);
  return b;
}

/// A TestMem vector holding x rounded to T.
template <class T>
TestVector<T> view_of(const Vec& x, const std::string& label = "x") {
  TestVector<T> v(label, x.size());
  kdist_test::fill(v, [&x](std::size_t i) { return x[i]; });
  return v;
}

/// A TestMem vector of n elements, element i = f(i) (built on the host).
template <class T, class F>
TestVector<T> view_from(const std::string& label, std::size_t n, F f) {
  TestVector<T> v(label, n);
  kdist_test::fill(v, f);
  return v;
}

/// The values of a TestMem vector, read through a host mirror.
template <class T>
Vec vec_of(const TestVector<T>& v) {
  const auto h = to_host(v);
  Vec x(h.extent(0));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(h(i));
  return x;
}

/// Balanced tree of the kdist operator over many vectors (serial).
template <class T>
Vec operator_tree(std::vector<Vec> xs, const std::vector<std::size_t>& bounds) {
  std::vector<TestVector<T>> level;
  for (auto& x : xs) level.push_back(view_of<T>(x));
  while (level.size() > 1) {
    decltype(level) next;
    for (std::size_t i = 0; i + 1 < level.size(); i += 2) {
      adasum::combine(TestExec(), level[i], level[i + 1], bounds);
      next.push_back(level[i]);
    }
    if (level.size() % 2) next.push_back(level.back());
    level = next;
  }
  return vec_of<T>(level[0]);
}

// Rank r's input: deterministic, different per rank, exactly representable in T.
template <class T>
Vec input(int rank, std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed * 1000 + rank);
  std::normal_distribution<double> g;
  Vec x(n);
  for (auto& v : x) v = static_cast<double>(static_cast<T>(g(rng)));
  return x;
}

// The last rank fails its Engine with `why` instead of calling run(); every other rank's run()
// must throw naming it, no hang. Returns true on the ranks that ran.
inline bool last_rank_fails_instead(kdist::comm::Engine& eng, const std::function<void()>& run,
                                    const std::string& why) {
  const int P = eng.size(), me = eng.rank();
  if (me == P - 1) {
    eng.fail(std::runtime_error(why));
    CHECK_FALSE(eng.healthy());
    return false;
  }
  CHECK_THROWS_WITH(run(), Catch::Contains("rank " + std::to_string(P - 1) + " failed") && Catch::Contains(why));
  return true;
}

// Tensors of 0 to 300 elements, so that blocks, chunks and halves end inside and between them.
inline std::vector<std::size_t> awkward_bounds() {
  return bounds_of({5, 0, 130, 1, 64, 300, 0, 77, 129});
}

}  // namespace adasum_util
}  // namespace kdist_test
