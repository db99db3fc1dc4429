// adasum/: the all-reduce on a SharedBuffer (in place through the shared window, or through MPI),
// flat and hierarchical, against the same all-reduce on a view; failures while peers read in place.
#include <catch2/catch.hpp>
#include <kdist/adasum/allreduce.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>

#include "adasum_reference.hpp"
#include "adasum_test_util.hpp"
#include "test_space.hpp"

// TestExec, TestVector, Vec, the adasum namespace alias and the shared helpers.
using namespace kdist_test::adasum_util;

TEMPLATE_TEST_CASE("Adasum on a SharedBuffer: in place or through MPI, flat or with nodes, the same bits as a view",
                   "[adasum][mpi]", float, double) {
  using T = TestType;
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  kdist::comm::Engine eng(world);
  const int P = world.size(), me = world.rank();
  const auto bounds = awkward_bounds();
  const std::size_t n = bounds.back();
  adasum::SharedBuffer<T> buf(eng, n);
  REQUIRE(buf.size() == n);
  // Whether every rank shares this one's memory, from MPI itself: the window must agree.
  const std::vector<bool> mates = kdist_test::adasum_util::mpi_node_mates(world.raw());
  const int node_size = static_cast<int>(std::count(mates.begin(), mates.end(), true));
  const bool shares = node_size == P;
  CHECK(buf.window().node_size() == node_size);
  std::unique_ptr<adasum::Topology> pairs(P % 2 == 0 && P > 2 ? new adasum::Topology(eng, 2) : nullptr);
  int pow2 = 1;
  while (pow2 * 2 <= P) pow2 *= 2;
  std::vector<const adasum::Topology*> layouts{nullptr};  // flat, and nodes of two where P allows
  if (pairs) layouts.push_back(pairs.get());
  for (unsigned seed : {41u, 42u}) {  // twice: the buffer is written again right after completion
    const Vec x = input<T>(me, n, seed);
    for (const adasum::Topology* hierarchy : layouts) {
      adasum::Options o;
      o.algorithm = adasum::Algorithm::vhdd;
      o.hierarchy = hierarchy;
      auto v = view_of<T>(x);
      adasum::allreduce(TestExec(), eng, v, bounds, {}, o).wait();
      const auto ref = to_host(v);
      for (bool in_place : {true, false})
        for (std::size_t chunk : {std::size_t(0), std::size_t(7)}) {
          o.in_place = in_place;
          o.chunk_bytes = chunk * sizeof(T);
          adasum::AdasumCounters c;
          o.counters = &c;
          auto h = buf.view();
          for (std::size_t i = 0; i < n; ++i) h(i) = static_cast<T>(x[i]);
          const long long calls0 = eng.stats().payload_calls;
          adasum::allreduce(eng, buf, bounds, {}, o).wait();
          const long long calls = eng.stats().payload_calls - calls0;
          INFO("P " << P << (hierarchy ? " nodes of 2" : " flat") << (in_place ? ", in place" : ", through MPI")
                    << ", chunk " << chunk << ": " << c.in_place_levels << " levels in place");
          CHECK(std::memcmp(h.data(), ref.data(), n * sizeof(T)) == 0);
          // Which path ran: every level reads in place when ranks share the node (they do under
          // mpiexec here), none when in_place is off; nothing is sent for an in-place level.
          const bool folded_away = me < 2 * (P - pow2) && me % 2 == 1;  // takes part in no level
          if (in_place && shares && P > 1 && (!folded_away || hierarchy)) CHECK(c.in_place_levels > 0);
          if (!in_place) CHECK(c.in_place_levels == 0);
          if (in_place && shares && P == pow2 && !hierarchy) {
            CHECK(c.vector_bytes_sent == 0);
            // The messages of the push protocol (a send and a receive each): level l's partials
            // round (l + 1 exchanges), a "ready" token at every level but the first (the
            // check's agreement stands in for it), a "pushed" token per gather level, no more.
            int L = 0;
            while ((2 << L) <= P) ++L;
            if (P > 1) CHECK(calls == L * (L + 1) + 2 * (L - 1) + 2 * L);
          }
        }
    }
  }
  {
    // With the Engine's check off, the first read in place waits for the partner's one-byte
    // message instead of the check's agreement (hear_inputs_final): the same bits.
    kdist::comm::EngineOptions unchecked;
    unchecked.check_consistency = false;
    kdist::comm::Engine quiet(world, unchecked);
    adasum::SharedBuffer<T> qbuf(quiet, n);
    for (unsigned seed : {44u, 45u}) {
      const Vec x = input<T>(me, n, seed);
      adasum::Options o;
      o.algorithm = adasum::Algorithm::vhdd;
      auto v = view_of<T>(x);
      adasum::allreduce(TestExec(), quiet, v, bounds, {}, o).wait();
      const auto ref = to_host(v);
      adasum::AdasumCounters c;
      o.counters = &c;
      auto h = qbuf.view();
      for (std::size_t i = 0; i < n; ++i) h(i) = static_cast<T>(x[i]);
      const long long calls0 = quiet.stats().payload_calls;
      adasum::allreduce(quiet, qbuf, bounds, {}, o).wait();
      const long long unchecked_calls = quiet.stats().payload_calls - calls0;
      INFO("P " << P << ", unchecked Engine, in place: " << c.in_place_levels << " levels in place");
      CHECK(std::memcmp(h.data(), ref.data(), n * sizeof(T)) == 0);
      const bool folded_away = me < 2 * (P - pow2) && me % 2 == 1;
      CHECK(qbuf.window().node_size() == node_size);
      if (shares && P > 1 && !folded_away) CHECK(c.in_place_levels > 0);
      // The checked Engine skips exactly that message (a send and a receive) at a power of two.
      for (std::size_t i = 0; i < n; ++i) buf.view()(i) = static_cast<T>(x[i]);
      const long long calls1 = eng.stats().payload_calls;
      o.counters = nullptr;
      adasum::allreduce(eng, buf, bounds, {}, o).wait();
      CHECK(std::memcmp(buf.data(), ref.data(), n * sizeof(T)) == 0);
      if (shares && P == pow2 && P > 1) CHECK(eng.stats().payload_calls - calls1 == unchecked_calls - 2);
    }
  }
  // NaN on the last rank, in place: every rank names the tensor and the rank.
  auto h = buf.view();
  const Vec x = input<T>(me, n, 43);
  for (std::size_t i = 0; i < n; ++i) h(i) = static_cast<T>(x[i]);
  if (me == P - 1) h(bounds[5] + 3) = std::numeric_limits<T>::quiet_NaN();
  adasum::Options o;
  o.algorithm = adasum::Algorithm::vhdd;
  CHECK_THROWS_WITH(adasum::allreduce(eng, buf, bounds, {}, o).wait(),
                    Catch::Contains("tensor 5") && Catch::Contains("rank " + std::to_string(P - 1)));
  // An empty SharedBuffer of no tensors (bounds {0}) does nothing, in place or not.
  adasum::SharedBuffer<T> empty(eng, 0);
  for (bool in_place : {true, false}) {
    o.in_place = in_place;
    adasum::allreduce(eng, empty, {0}, {}, o).wait();
  }
  if (P > 1) {
    // Ranks that ask for different sizes get an error on every rank.
    CHECK_THROWS_AS(adasum::SharedBuffer<T>(eng, me == 0 ? 10 : 11), kdist::InvalidArgument);
    // Ranks that disagree on reading in place get the Engine's mismatch on every rank, no hang,
    // before anyone reads a peer's block (the last use of this Engine: it refuses work after).
    adasum::Options mixed;
    mixed.algorithm = adasum::Algorithm::vhdd;
    mixed.in_place = me != P - 1;
    CHECK_THROWS_WITH(adasum::allreduce(eng, buf, bounds, {}, mixed).wait(), Catch::Contains("in place"));
  }
}

// Hidden: run by test_adasum_in_place.straddle.np8 with MPIR_CVAR_NUM_CLIQUES=2 (MPICH splits the
// world round-robin into shared-memory "machines" {0,2,4,6} and {1,3,5,7}); reordered, they are
// {0,1,2,5} and {3,4,6,7}. Imposed nodes of two: {0,1} lies on one machine, {2,3} straddles both.
// Cross partners 0 and 2 share a machine: decided per rank, 0 read 2's block in place while 2
// (its node straddling) sent through MPI, and both waited for ever.
TEST_CASE("Adasum in place: imposed nodes that straddle shared-memory nodes, no hang, same bits",
          "[.straddle][adasum]") {
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  REQUIRE(world_size == 8);
  const int keys[8] = {0, 3, 1, 4, 2, 6, 5, 7};
  MPI_Comm reordered = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, 0, keys[world_rank], &reordered);
  kdist::comm::Communicator world(reordered);
  MPI_Comm_free(&reordered);  // the Communicator holds its own duplicate
  kdist::comm::Engine eng(world);
  const int P = world.size(), me = world.rank();
  const bool on_a = me == 0 || me == 1 || me == 2 || me == 5;
  // The layout this test needs, as MPI reports it; kdist's node detection must then agree.
  const std::vector<bool> mates = kdist_test::adasum_util::mpi_node_mates(world.raw());
  bool mine = true;
  for (int r = 0; r < P; ++r)
    mine = mine && mates[static_cast<std::size_t>(r)] == (on_a == (r == 0 || r == 1 || r == 2 || r == 5));
  if (eng.allreduce_values<int>({mine ? 1 : 0}, kdist::comm::ReduceOp::min, "layout")[0] == 0) {
    if (me == 0)
      std::printf("SKIPPED: no shared-memory nodes {0,1,2,5} and {3,4,6,7} (needs MPICH, MPIR_CVAR_NUM_CLIQUES=2)\n");
    return;
  }
  for (int r = 0; r < P; ++r) CHECK(eng.shares_node(r) == mates[static_cast<std::size_t>(r)]);
  adasum::Topology pairs(eng, 2);
  CHECK(!pairs.nodes_share_memory());
  const auto bounds = awkward_bounds();
  const std::size_t n = bounds.back();
  const Vec x = input<float>(me, n, 43);
  adasum::Options o;
  o.algorithm = adasum::Algorithm::vhdd;
  o.hierarchy = &pairs;
  auto v = view_of<float>(x);
  adasum::allreduce(TestExec(), eng, v, bounds, {}, o).wait();
  const auto ref = to_host(v);
  adasum::SharedBuffer<float> buf(eng, n);
  auto h = buf.view();
  for (std::size_t i = 0; i < n; ++i) h(i) = static_cast<float>(x[i]);
  o.in_place = true;
  adasum::allreduce(eng, buf, bounds, {}, o).wait();
  CHECK(std::memcmp(h.data(), ref.data(), n * sizeof(float)) == 0);
  // The shared-memory nodes themselves as the Topology's nodes: in place stays allowed.
  adasum::Topology machine_pairs(eng, 0);
  CHECK(machine_pairs.nodes_share_memory());
}

TEST_CASE("Adasum in place: a rank that fails instead of submitting is named on every rank, nobody reads its block",
          "[adasum][mpi]") {
  // With the check on, the first read of a partner's block waits for the check's agreement, not
  // a message of its own: a partner that never submits must stop everyone before that read.
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  const int P = world.size(), me = world.rank();
  if (P < 2) return;
  kdist::comm::Engine eng(world);
  const auto bounds = awkward_bounds();
  adasum::SharedBuffer<float> buf(eng, bounds.back());
  for (std::size_t i = 0; i < buf.size(); ++i) buf.data()[i] = 1.0f + static_cast<float>(me);
  adasum::Options o;
  o.algorithm = adasum::Algorithm::vhdd;
  if (last_rank_fails_instead(
          eng, [&] { adasum::allreduce(eng, buf, bounds, {}, o).wait(); },
          "rank gave up before its in-place all-reduce"))  // nothing ran: the block is as written
    CHECK(std::all_of(buf.data(), buf.data() + buf.size(), [me](float x) { return x == 1.0f + me; }));
}

// [leaks-comm]: the peers' Engines may be destroyed with their part of the all-reduce posted.
TEST_CASE("a rank that throws with a SharedBuffer alive: RemoteError on every peer, no hang",
          "[adasum][mpi][leaks-comm]") {
  // The window's collective free ran first during unwinding, before the Engine's destructor could
  // tell the peers: they waited in the all-reduce for this rank, and it in the free for them.
  kdist::comm::Communicator world(MPI_COMM_WORLD);
  const int P = world.size(), me = world.rank();
  if (P < 2) return;
  bool local_error = false, remote_error = false;
  std::string remote_text;
  try {
    kdist::comm::Engine eng(world);
    adasum::SharedBuffer<float> buf(eng, 64);
    for (std::size_t i = 0; i < buf.size(); ++i) buf.data()[i] = 1.0f + static_cast<float>(me);
    if (me == P - 1) throw std::logic_error("the user's backward failed on purpose");
    adasum::allreduce(eng, buf, {0, 64}, {"w"}, adasum::Options{}).wait();
  } catch (const kdist::comm::RemoteError& e) {
    remote_error = true;
    remote_text = e.what();
  } catch (const std::logic_error&) {
    local_error = true;
  }
  if (me == P - 1) {
    CHECK(local_error);
  } else {
    INFO(remote_text);
    CHECK(remote_error);
    CHECK_THAT(remote_text, Catch::Contains("rank " + std::to_string(P - 1)) && Catch::Contains("SharedWindow"));
  }
}
