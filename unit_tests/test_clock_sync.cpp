// comm/clock_sync under MPI: ranks share one machine here, so the true offset is ~0 and the
// estimate must lie within its own uncertainty bound; with each rank's clock shifted by a known
// amount the estimate must find the shift; merged timelines hold every rank.
#include <mpi.h>
#include <catch2/catch.hpp>
#include <kdist/comm/clock_sync.hpp>
#include <kdist/comm/communicator.hpp>
#include <kdist/core/timeline.hpp>

#include <nlohmann/json.hpp>
#include <set>

TEST_CASE("synchronize_clock: offset to rank 0 within its bound", "[comm][clock]") {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  kdist::Clock clock;
  kdist::comm::Engine engine{kdist::comm::Communicator(MPI_COMM_WORLD)};
  const kdist::ClockOffset off = kdist::comm::synchronize_clock(engine, clock, 8);
  if (rank == 0) {
    CHECK(off.offset == 0.0);
    CHECK(off.uncertainty == 0.0);
  } else {
    // steady_clock is CLOCK_MONOTONIC, shared by processes of one machine: true offset 0.
    CHECK(std::abs(off.offset) <= off.uncertainty + 1e-6);
    CHECK(off.uncertainty < 0.05);
  }
  CHECK(clock.offset() == off.offset);
}

TEST_CASE("synchronize_clock: finds a known shift between the ranks' clocks", "[comm][clock]") {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  kdist::Clock clock;
  kdist::comm::Engine engine{kdist::comm::Communicator(MPI_COMM_WORLD)};
  // Rank r reads the machine's clock 5 r seconds ahead: its offset to rank 0 is -5 r. A sample
  // whose times were mixed up (rank 0's answer read as this rank's send time) would give ~0.
  const double shift = 5.0 * rank;
  const kdist::ClockOffset off =
      kdist::comm::synchronize_clock(engine, clock, 8, [shift] { return kdist::Clock::local_now() + shift; });
  CHECK(std::abs(off.offset + shift) <= off.uncertainty + 1e-6);
  CHECK(off.uncertainty < 0.05);
  CHECK(clock.offset() == off.offset);
}

TEST_CASE("per-rank timelines merge into one trace with a process per rank", "[comm][timeline]") {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  kdist::Clock clock;
  kdist::comm::Engine engine{kdist::comm::Communicator(MPI_COMM_WORLD)};
  kdist::comm::synchronize_clock(engine, clock, 4);
  kdist::Timeline tl(rank, &clock);
  tl.enable();
  const int t = tl.track("compute");
  { kdist::Timeline::Scope s(tl, t, "work"); }
  const std::string doc = tl.to_json();
  int len = static_cast<int>(doc.size());
  std::vector<int> lens(size);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<int> displs(size, 0);
  for (int r = 1; r < size; ++r) displs[r] = displs[r - 1] + lens[r - 1];
  std::string all(rank == 0 ? static_cast<std::size_t>(displs[size - 1] + lens[size - 1]) : 0, '\0');
  MPI_Gatherv(doc.data(), len, MPI_CHAR, &all[0], lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    std::vector<std::string> docs;
    for (int r = 0; r < size; ++r) docs.push_back(all.substr(displs[r], lens[r]));
    const auto merged = nlohmann::json::parse(kdist::Timeline::merge(docs));
    std::set<int> pids;
    for (const auto& e : merged.at("traceEvents"))
      if (e.at("ph") == "X") pids.insert(e.at("pid").get<int>());
    CHECK(static_cast<int>(pids.size()) == size);
  }
}

TEST_CASE("synchronize_clock: a rank that fails instead is named on rank 0, no hang", "[comm][clock]") {
  kdist::comm::Engine engine{kdist::comm::Communicator(MPI_COMM_WORLD)};
  const int P = engine.size(), me = engine.rank();
  if (P < 2) return;
  kdist::Clock clock;
  if (me == P - 1) {
    engine.fail(std::runtime_error("no clock here"));
    return;
  }
  // Rank 0 waits for the failed rank's ping and must learn why; the others may finish their own
  // exchanges first, but if they raise, it names the failed rank too.
  const std::string why = "rank " + std::to_string(P - 1) + " failed";
  try {
    kdist::comm::synchronize_clock(engine, clock, 4);
    CHECK(me != 0);
  } catch (const kdist::comm::RemoteError& e) {
    CHECK_THAT(e.what(), Catch::Contains(why) && Catch::Contains("no clock here"));
  }
}
