// comm/: Communicator and Engine against references computed from every rank's inputs.
#include <catch2/catch.hpp>
#include <kdist/comm/engine.hpp>

#include <chrono>
#include <numeric>
#include <thread>

using Host = Kokkos::DefaultHostExecutionSpace;
using kdist::comm::Communicator;
using kdist::comm::Engine;
using kdist::comm::ReduceOp;

namespace {
// Small integers: sums are exact in float and double.
template <class T>
T value(int rank, long long i) {
  return static_cast<T>((rank + 1) * 3 + (i % 17) - 8);
}
}  // namespace

TEMPLATE_TEST_CASE("engine collectives equal references built from all ranks' inputs", "[comm][engine]", float,
                   double) {
  using T = TestType;
  Communicator world(MPI_COMM_WORLD);
  Engine eng(world);
  const int P = world.size(), me = world.rank();
  for (long long n : {1LL, 7LL, 1000LL, 100003LL}) {
    INFO("n " << n);
    Kokkos::View<T*, Kokkos::HostSpace> sum("sum", n), avg("avg", n), bc("bc", n);
    for (long long i = 0; i < n; ++i) sum(i) = avg(i) = bc(i) = value<T>(me, i);
    auto r1 = eng.allreduce(Host(), sum, ReduceOp::sum, "sum");
    auto r2 = eng.allreduce(Host(), avg, ReduceOp::average, "avg");
    auto r3 = eng.broadcast(Host(), bc, P - 1, "bcast");
    r3.wait();  // out of order on purpose
    r1.wait();
    r2.wait();
    bool ok_sum = true, ok_bc = true;
    double worst_avg = 0;
    for (long long i = 0; i < n; ++i) {
      double ref = 0;
      for (int r = 0; r < P; ++r) ref += value<double>(r, i);
      ok_sum = ok_sum && static_cast<double>(sum(i)) == ref;
      worst_avg =
          std::max(worst_avg, std::abs(static_cast<double>(avg(i)) - ref / P) / std::max(1.0, std::abs(ref / P)));
      ok_bc = ok_bc && bc(i) == value<T>(P - 1, i);
    }
    CHECK(ok_sum);
    CHECK(worst_avg <= 1e-6);
    CHECK(ok_bc);

    Kokkos::View<T*, Kokkos::HostSpace> in("in", n * P), out("out", n), gathered("gathered", n * P);
    for (long long i = 0; i < n * P; ++i) in(i) = value<T>(me, i);
    eng.reduce_scatter(Host(), in, out, ReduceOp::sum, "rs").wait();
    Kokkos::View<T*, Kokkos::HostSpace> mine("mine", n);
    for (long long i = 0; i < n; ++i) mine(i) = value<T>(me, i * 5 + 1);
    eng.allgather(Host(), mine, gathered, "ag").wait();
    bool ok_rs = true, ok_ag = true;
    for (long long i = 0; i < n; ++i) {
      double ref = 0;
      for (int r = 0; r < P; ++r) ref += value<double>(r, me * n + i);
      ok_rs = ok_rs && static_cast<double>(out(i)) == ref;
    }
    for (int r = 0; r < P; ++r)
      for (long long i = 0; i < n; ++i) ok_ag = ok_ag && gathered(r * n + i) == value<T>(r, i * 5 + 1);
    CHECK(ok_rs);
    CHECK(ok_ag);
  }
  CHECK(eng.in_flight() == 0);
}

TEST_CASE("send/recv around a ring", "[comm][engine]") {
  Communicator world(MPI_COMM_WORLD);
  Engine eng(world);
  const int P = world.size(), me = world.rank();
  Kokkos::View<double*, Kokkos::HostSpace> out("out", 33), in("in", 33);
  for (int i = 0; i < 33; ++i) out(i) = me * 100 + i;
  auto rr = eng.recv(Host(), in, (me + P - 1) % P, 5);
  auto rs = eng.send(Host(), out, (me + 1) % P, 5);
  rs.wait();
  rr.wait();
  bool ok = true;
  for (int i = 0; i < 33; ++i) ok = ok && in(i) == ((me + P - 1) % P) * 100 + i;
  CHECK(ok);
}

TEST_CASE("engine works on node and cross-node sub-communicators", "[comm][engine]") {
  Communicator world(MPI_COMM_WORLD);
  const int P = world.size(), me = world.rank();
  const int node_size = P % 2 == 0 ? 2 : 1;
  Communicator node = world.node(node_size);
  Communicator cross = world.cross_node(node_size);
  CHECK(node.size() == node_size);
  CHECK(cross.size() == P / node_size);
  CHECK(node.rank() == me % node_size);
  Engine en(node), ec(cross);
  Kokkos::View<int*, Kokkos::HostSpace> a("a", 3), b("b", 3);
  Kokkos::deep_copy(a, me);
  Kokkos::deep_copy(b, me);
  en.allreduce(Host(), a).wait();
  ec.allreduce(Host(), b).wait();
  int ref_node = 0, ref_cross = 0;
  for (int r = 0; r < P; ++r) {
    if (r / node_size == me / node_size) ref_node += r;
    if (r % node_size == me % node_size) ref_cross += r;
  }
  CHECK(a(2) == ref_node);
  CHECK(b(0) == ref_cross);
  if (P == 4) REQUIRE_THROWS_WITH(world.node(3), Catch::Contains("does not divide") && Catch::Contains("4"));
}

TEST_CASE("composite schedule: ring all-gather with local work between rounds", "[comm][engine][composite]") {
  Communicator world(MPI_COMM_WORLD);
  Engine eng(world);
  const int P = world.size(), me = world.rank();
  // Each round passes the block received last round to the right neighbour and adds it into a
  // running total: P-1 rounds of point-to-point, local work between rounds.
  const int n = 50;
  std::vector<double> block(n), incoming(n), total(n);
  for (int i = 0; i < n; ++i) block[i] = total[i] = me * 1000 + i;
  kdist::comm::Schedule s("ring-sum");
  for (int round = 0; round < P - 1; ++round) {
    s.step()
        .send((me + 1) % P, kdist::comm::Buffer::host(block.data(), n), round)
        .recv((me + P - 1) % P, kdist::comm::Buffer::host(incoming.data(), n), round)
        .then([&] {
          for (int i = 0; i < n; ++i) {
            total[i] += incoming[i];
            block[i] = incoming[i];
          }
        });
  }
  const long long sent_before = eng.stats().bytes_sent;
  eng.submit(std::move(s),
             {kdist::comm::OpKind::composite, kdist::DType::float64, n, -1, kdist::comm::ReduceOp::sum, "ring-sum", {}})
      .wait();
  bool ok = true;
  for (int i = 0; i < n; ++i) {
    double ref = 0;
    for (int r = 0; r < P; ++r) ref += r * 1000 + i;
    ok = ok && total[i] == ref;
  }
  CHECK(ok);
  CHECK(eng.stats().bytes_sent - sent_before == static_cast<long long>(P - 1) * n * 8);
}

TEST_CASE("consistency check: mismatches are caught before data moves, on every rank", "[comm][engine][check]") {
  Communicator world(MPI_COMM_WORLD);
  const int P = world.size(), me = world.rank();
  if (P < 2) return;
  Kokkos::View<double*, Kokkos::HostSpace> v("grad[3]", 10 + (me == P - 1 ? 1 : 0));
  Kokkos::deep_copy(v, 7.0);
  SECTION("count") {
    Engine eng(world);
    eng.allreduce(Host(), Kokkos::View<double*, Kokkos::HostSpace>("warm", 4)).wait();
    try {
      eng.allreduce(Host(), v, ReduceOp::sum, "grad[3]").wait();
      FAIL("no mismatch raised");
    } catch (const kdist::comm::MismatchError& e) {
      const std::string w = e.what();
      CHECK_THAT(w, Catch::Contains("operation #1") && Catch::Contains("'grad[3]'") &&
                        Catch::Contains("rank 0: allreduce 'grad[3]' op=sum dtype=float64 count=10") &&
                        Catch::Contains("count=11"));
    }
    CHECK(v(0) == 7.0);                                                       // untouched: no payload moved
    REQUIRE_THROWS_AS(eng.allreduce(Host(), v), kdist::comm::MismatchError);  // engine refuses further work
  }
  SECTION("dtype") {
    Engine eng(world);
    Kokkos::View<float*, Kokkos::HostSpace> f("f", 10);
    Kokkos::View<double*, Kokkos::HostSpace> d("d", 10);
    auto run = [&] {
      return me == 0 ? eng.allreduce(Host(), f, ReduceOp::sum, "x") : eng.allreduce(Host(), d, ReduceOp::sum, "x");
    };
    REQUIRE_THROWS_WITH(run().wait(), Catch::Contains("dtype=float32") && Catch::Contains("dtype=float64"));
  }
  SECTION("root") {
    Engine eng(world);
    Kokkos::View<double*, Kokkos::HostSpace> b("inverse[0]", 10);
    REQUIRE_THROWS_WITH(eng.broadcast(Host(), b, me == 0 ? 1 : 0, "inverse[0]").wait(),
                        Catch::Contains("root=0") && Catch::Contains("root=1") && Catch::Contains("'inverse[0]'"));
  }
  SECTION("order") {
    Engine eng(world);
    Kokkos::View<double*, Kokkos::HostSpace> a("A", 10), b("B", 10);
    try {
      if (me == 0) {
        auto r1 = eng.allreduce(Host(), a, ReduceOp::sum, "A");
        auto r2 = eng.broadcast(Host(), b, 0, "B");
        r1.wait();
        r2.wait();
      } else {
        auto r1 = eng.broadcast(Host(), b, 0, "B");
        auto r2 = eng.allreduce(Host(), a, ReduceOp::sum, "A");
        r1.wait();
        r2.wait();
      }
      FAIL("no mismatch raised");
    } catch (const kdist::comm::MismatchError& e) {
      CHECK_THAT(e.what(), Catch::Contains("operation #0") && Catch::Contains("allreduce 'A'") &&
                               Catch::Contains("broadcast 'B'"));
    }
  }
}

TEST_CASE("overlap: operations complete while the caller computes and polls", "[comm][engine]") {
  Communicator world(MPI_COMM_WORLD);
  Engine eng(world);
  Kokkos::View<double*, Kokkos::HostSpace> v("v", 1 << 12);
  auto r = eng.allreduce(Host(), v);
  for (int i = 0; i < 2000 && !r.test(); ++i) std::this_thread::sleep_for(std::chrono::microseconds(200));
  r.wait();
  CHECK(eng.stats().completed_before_wait >= 1);
}

TEST_CASE("block collectives reject wrongly sized views before any MPI call", "[comm][engine]") {
  Communicator world(MPI_COMM_WORLD);
  Engine eng(world);
  const int P = world.size();
  Kokkos::View<float*, Kokkos::HostSpace> whole("grads", 4 * P + 1), block("slice", 4);
  REQUIRE_THROWS_WITH(eng.reduce_scatter(Host(), whole, block),
                      Catch::Contains("reduce_scatter") && Catch::Contains("input 'grads'") &&
                          Catch::Contains("expected 4 x " + std::to_string(P)));
  REQUIRE_THROWS_WITH(eng.allgather(Host(), block, whole),
                      Catch::Contains("allgather") && Catch::Contains("output 'grads'"));
  CHECK(eng.stats().operations == 0);
}

TEST_CASE("Communicator requires an initialised MPI of sufficient thread level", "[comm]") {
  REQUIRE_NOTHROW(kdist::comm::require_thread_level(MPI_THREAD_FUNNELED, "test"));
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE)
    REQUIRE_THROWS_WITH(kdist::comm::require_thread_level(MPI_THREAD_MULTIPLE, "kdist::x"),
                        Catch::Contains("MPI_THREAD_MULTIPLE"));
  Communicator world(MPI_COMM_WORLD);
  REQUIRE_THROWS_WITH(world.require_size(world.size() + 1, "kdist::adasum"),
                      Catch::Contains("kdist::adasum") && Catch::Contains("needs " + std::to_string(world.size() + 1)));
}
