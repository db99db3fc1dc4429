// Self-tests of the MPI test harness. Every test here is meant to FAIL (ctest WILL_FAIL), and
// check_selftest.cmake also checks how: prefixes, every rank failing, and no hang.
#include <mpi.h>
#include <catch2/catch.hpp>

#include <climits>
#include <cstdlib>

TEST_CASE("selftest: fails only on the last rank", "[selftest][last-rank]") {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECK(rank != size - 1);
  int one = 1, sum = 0;  // the other ranks go on to a collective: the CHECK failure must not hang it
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(sum == size);
}

TEST_CASE("selftest: fails in the middle of a collective", "[selftest][collective]") {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // The last rank leaves the test case; the others block in MPI_Allreduce forever unless the
  // harness aborts.
  REQUIRE(rank != size - 1);
  int one = 1, sum = 0;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(sum == size);
}

TEST_CASE("selftest: one rank stuck in a collective, no failed assertion", "[selftest][stuck]") {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  // The last rank waits in a barrier nobody else enters; the others end the test case cleanly and
  // wait for it at the harness's agreement, which must give up and abort. (dup is never freed: the
  // job ends in MPI_Abort.)
  if (rank == size - 1) MPI_Barrier(dup);
  CHECK(true);
}

// Hidden ([.]): run only by the sanitizer build's checks, which expect each report to fail the run.
namespace {
void* volatile g_sink = nullptr;
}

TEST_CASE("selftest: a leak fails the sanitizer run", "[.][sanitizer-leak]") {
  g_sink = std::malloc(64);
  g_sink = nullptr;
  CHECK(true);
}

TEST_CASE("selftest: undefined behaviour fails the sanitizer run", "[.][sanitizer-ubsan]") {
  volatile int big = INT_MAX;
  const int sum = big + 1;
  CHECK(sum != 0);
}

TEST_CASE("selftest: a heap overflow fails the sanitizer run", "[.][sanitizer-asan]") {
  char* p = static_cast<char*>(std::malloc(8));
  volatile int i = 8;
  p[i] = 1;
  std::free(p);
  CHECK(true);
}
