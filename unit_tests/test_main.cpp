// One Catch2 main for serial and MPI tests. It initialises MPI and Kokkos. MPI_THREAD_MULTIPLE:
// nothing in kdist or in this main starts a thread; one test ("two threads on one Engine get an
// error, not a crash", test_reliability.cpp) calls into an Engine from a second thread on purpose.
// The main makes a failure visible on every rank, and a divergence ends the run instead of hanging:
//  - each failed assertion is printed to stderr with a "[rank r]" prefix;
//  - after every test case the ranks agree (point to point, on a private communicator) whether it
//    failed anywhere, so the run fails on every rank;
//  - if that agreement does not complete within KDIST_TEST_ABORT_AFTER seconds, the ranks that
//    reached it print the test case and the ranks that did not arrive, and call MPI_Abort, so
//    mpiexec exits non-zero instead of waiting for ctest's timeout. Default 30 s on a rank whose
//    test case was aborted (REQUIRE or exception: it may have left its peers blocked in a
//    collective), 60 s on a rank that finished it normally (a peer blocked in a collective or in a
//    wait that never completes, with no failed assertion anywhere).
#define CATCH_CONFIG_RUNNER
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <mpi.h>
#include <catch2/catch.hpp>

#include <Kokkos_Core.hpp>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

namespace {

MPI_Comm g_harness_comm = MPI_COMM_NULL;
int g_rank = 0;
int g_size = 1;
bool g_case_failed = false;
bool g_case_aborted = false;
int g_failures_elsewhere = 0;
int g_case_index = 0;  // test cases ended so far, the same on every rank

double abort_after_seconds(bool aborted_here) {
  const char* env = std::getenv("KDIST_TEST_ABORT_AFTER");
  if (env && *env) return std::atof(env);
  return aborted_here ? 30.0 : 60.0;
}

class MpiListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    TestEventListenerBase::testCaseStarting(info);
    g_case_failed = false;
    g_case_aborted = false;
  }

  bool assertionEnded(Catch::AssertionStats const& stats) override {
    const Catch::AssertionResult& r = stats.assertionResult;
    if (!r.isOk()) {
      g_case_failed = true;
      // CHECK-style failures let the test case go on (collectives stay matched); REQUIRE-style
      // failures and exceptions end it on this rank only.
      const bool continues = r.getResultType() != Catch::ResultWas::ThrewException &&
                             Catch::shouldContinueOnFailure(r.m_info.resultDisposition);
      if (!continues) g_case_aborted = true;
      std::ostringstream os;
      os << "[rank " << g_rank << "] " << r.getSourceInfo().file << ":" << r.getSourceInfo().line << ": FAILED "
         << r.getTestMacroName() << "(" << r.getExpression() << ")";
      if (r.hasExpandedExpression()) os << " with expansion " << r.getExpandedExpression();
      if (r.hasMessage()) os << " : " << r.getMessage();
      for (const auto& m : stats.infoMessages) os << " [" << m.message << "]";
      os << " in test case '" << currentTestCaseInfo->name << "'\n";
      std::cerr << os.str() << std::flush;
    }
    return true;
  }

  void testCaseEnded(Catch::TestCaseStats const& stats) override {
    if (g_size > 1) agree_on_failure(stats.testInfo.name);
    TestEventListenerBase::testCaseEnded(stats);
  }

 private:
  // Every rank sends {case index, failed} to every other rank and waits for theirs: unlike an
  // all-reduce, the pending receives say which ranks have not reached the end of the test case.
  static void agree_on_failure(const std::string& name) {
    ++g_case_index;
    const int mine[2] = {g_case_index, g_case_failed ? 1 : 0};
    std::vector<int> theirs(2 * static_cast<std::size_t>(g_size), 0);
    std::vector<MPI_Request> recvs(g_size, MPI_REQUEST_NULL), sends(g_size, MPI_REQUEST_NULL);
    for (int r = 0; r < g_size; ++r) {
      if (r == g_rank) continue;
      MPI_Irecv(&theirs[2 * r], 2, MPI_INT, r, 0, g_harness_comm, &recvs[r]);
      MPI_Isend(mine, 2, MPI_INT, r, 0, g_harness_comm, &sends[r]);
    }
    const auto start = std::chrono::steady_clock::now();
    const double limit = abort_after_seconds(g_case_aborted);
    for (;;) {
      std::vector<int> missing;
      for (int r = 0; r < g_size; ++r) {
        if (recvs[r] == MPI_REQUEST_NULL) continue;
        int done = 0;
        MPI_Test(&recvs[r], &done, MPI_STATUS_IGNORE);  // sets it to MPI_REQUEST_NULL once done
        if (!done) missing.push_back(r);
      }
      if (missing.empty()) break;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > limit) {
        std::ostringstream os;
        os << "[rank " << g_rank << "] test case '" << name << "' " << (g_case_aborted ? "was aborted" : "ended")
           << " on this rank, but rank" << (missing.size() > 1 ? "s" : "");
        for (std::size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : " ") << missing[i];
        os << " did not arrive at its end within " << limit << " s (KDIST_TEST_ABORT_AFTER; likely blocked in a "
           << "collective or a wait the others left): calling MPI_Abort\n";
        std::cerr << os.str() << std::flush;
        // Give mpiexec's output forwarding a moment before the job is killed.
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        MPI_Abort(MPI_COMM_WORLD, 3);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    MPI_Waitall(g_size, sends.data(), MPI_STATUSES_IGNORE);  // every peer has posted its receive
    bool any = false;
    for (int r = 0; r < g_size; ++r) {
      if (r == g_rank) continue;
      if (theirs[2 * r] != g_case_index) {
        std::ostringstream os;
        os << "[rank " << g_rank << "] test case '" << name << "' is test case " << g_case_index << " on this rank but "
           << theirs[2 * r] << " on rank " << r << ": the ranks run different test cases\n";
        std::cerr << os.str() << std::flush;
        any = true;
      }
      if (theirs[2 * r + 1]) any = true;
    }
    if (any && !g_case_failed) {
      ++g_failures_elsewhere;
      std::ostringstream os;
      os << "[rank " << g_rank << "] test case '" << name << "' failed on another rank\n";
      std::cerr << os.str() << std::flush;
    }
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(MpiListener)

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  MPI_Comm_dup(MPI_COMM_WORLD, &g_harness_comm);
  int result = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    Catch::Session session;
    if (int rc = session.applyCommandLine(argc, argv)) {
      MPI_Abort(MPI_COMM_WORLD, rc);
    }
    // Only rank 0 prints the full report; every rank prints its own failures (listener).
    if (g_rank != 0) session.configData().outputFilename = "/dev/null";
    result = session.run();
  }
  int mine = (result != 0 || g_failures_elsewhere != 0) ? 1 : 0, any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, g_harness_comm);
  if (any && g_rank == 0) std::cerr << "kdist tests: failures on at least one of " << g_size << " ranks\n";
  MPI_Comm_free(&g_harness_comm);
  MPI_Finalize();
  return any ? 1 : 0;
}
