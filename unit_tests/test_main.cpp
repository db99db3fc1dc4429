// One Catch2 main for serial and MPI tests. It initialises MPI (THREAD_MULTIPLE: the comm layer
// may run a communication thread) and Kokkos, and makes a failure visible on every rank:
//  - each failed assertion is printed to stderr with a "[rank r]" prefix;
//  - after every test case the ranks agree (on a private communicator) whether it failed
//    anywhere, so the run fails on every rank;
//  - a rank whose test case was aborted (REQUIRE or exception) may have left peers blocked in a
//    collective: if they do not reach the end of the test case within KDIST_TEST_ABORT_AFTER
//    seconds (default 30) it calls MPI_Abort, so mpiexec exits non-zero instead of hanging.
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

namespace {

MPI_Comm g_harness_comm = MPI_COMM_NULL;
int g_rank = 0;
int g_size = 1;
bool g_case_failed = false;
bool g_case_aborted = false;
int g_failures_elsewhere = 0;

double abort_after_seconds() {
  const char* env = std::getenv("KDIST_TEST_ABORT_AFTER");
  return env ? std::atof(env) : 30.0;
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
  static void agree_on_failure(const std::string& name) {
    int mine = g_case_failed ? 1 : 0, any = 0;
    MPI_Request req;
    MPI_Iallreduce(&mine, &any, 1, MPI_INT, MPI_MAX, g_harness_comm, &req);
    const auto start = std::chrono::steady_clock::now();
    const double limit = abort_after_seconds();
    int done = 0;
    while (!done) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) break;
      if (g_case_aborted) {
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (waited > limit) {
          std::ostringstream os;
          os << "[rank " << g_rank << "] test case '" << name << "' was aborted on this rank and the other ranks "
             << "did not finish it within " << limit << " s (likely blocked in a collective): calling MPI_Abort\n";
          std::cerr << os.str() << std::flush;
          // Give mpiexec's output forwarding a moment before the job is killed.
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          MPI_Abort(MPI_COMM_WORLD, 3);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (any && !mine) {
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
