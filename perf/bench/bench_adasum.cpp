// Adasum all-reduce against MPI_Allreduce(SUM) on the same buffers (float32), as one tensor and
// as 64 fused tensors; medians of >= 5 repeats of the maximum over ranks. Both algorithms are
// timed (vhdd_s, doubling_s); adasum_s is what a caller gets by default (Algorithm::automatic,
// doubling below --small-bytes) and the last column is its ratio to the sum.
// Memory-traffic bounds, from copy / read / triad rates measured in the same run at each size (on
// arrays of n', the size of the arrays each pass streams) with every rank running them at once
// (perf/common/bandwidth.hpp: ranks on one node share the memory bus, as in the collective), for
// P' = the power of two at or below P and n' = n (1 - 1/P') bytes moved per rank by the halving
// levels together:
//   sum (reduce-scatter + all-gather)  receive n' (a copy), add n' (a triad), receive n' (a copy)
//   Adasum (VHDD)                      receive n', partial sums over both halves (read 2 n'),
//                                      apply (triad n'), all-gather n'
// i.e. time >= 2 (2 n') / copy + 3 n' / triad, plus 2 n' / read for Adasum: the extra pass. A
// receive counted as one copy is generous to MPI's shared-memory path (two copies through its
// cells) and exact for a zero-copy one; the network is not in the bound.
// In place (in_place_s, a SharedBuffer read where it lies by ranks on one node): the same minus
// both receive copies, and the all-gather's pushes as copies, less the read of the last level's,
// which the apply writes from L1: (2 n' - n / P') / copy + 3 n' / triad + 2 n' / read
// (in_place_stream_bound_s). That formula takes every byte at a private array's rate, but half of
// them are lines the partner core has just written; in_place_bound_s is measured instead with the
// passes' own access pattern on the same shared window, one sample after each repeat of the
// operation (perf/bench/in_place_bound.hpp), and in_place/bound is held against it.
//   mpiexec -n 2 bench_adasum [--reps N] [--series K] [--json FILE] [--costs FILE] [--drain-bytes N]
//   mpiexec -n 4 bench_adasum --part traffic     (bytes and rounds per rank, not time)
#include <CLI/CLI.hpp>
#include <kdist/adasum/allreduce.hpp>
#include <kdist/core/timer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>

#include "common/bandwidth.hpp"
#include "common/bench_mpi.hpp"
#include "common/mpi_main.hpp"
#include "in_place_bound.hpp"

namespace {
using Host = Kokkos::DefaultHostExecutionSpace;

using kdist::Clock;
using kdist_bench::max_over_ranks;

std::vector<std::size_t> even_bounds(std::size_t n, std::size_t tensors) {
  std::vector<std::size_t> b{0};
  for (std::size_t t = 1; t <= tensors; ++t) b.push_back(n * t / tensors);
  return b;
}

void fill(std::vector<float>& v, int rank) {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.001f * static_cast<float>((i * 7 + rank * 13) % 101) - 0.05f;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdist Adasum all-reduce vs MPI_Allreduce(SUM)"};
  std::string part = "time", json;
  int reps = 5;
  std::size_t small_bytes = kdist::adasum::kDefaultSmallBytes;
  app.add_option("--small-bytes", small_bytes, "automatic: recursive doubling below this many bytes")
      ->capture_default_str();
  std::size_t drain_bytes = 0;
  app.add_option("--drain-bytes", drain_bytes,
                 "before each variant's repeats, exchange this many bytes with rank ^ 1 (untimed): on the emulated "
                 "link (perf/run_netns.sh, a tbf with a 1 MB burst) every series then starts with an empty bucket");
  std::string costs;
  app.add_option("--costs", costs,
                 "cost models from kdist_calibrate (--adasum-max-bytes): automatic switches where they cross "
                 "(adasum::small_bytes_from), unless --small-bytes is given")
      ->check(CLI::ExistingFile);
  std::size_t chunk_bytes = 0;
  app.add_option("--chunk-bytes", chunk_bytes,
                 "VHDD exchange chunk on every level (0: the library default, adasum::kDefaultChunkBytes "
                 "to partners on other nodes)")
      ->capture_default_str();
  std::size_t max_bytes = 64u << 20;
  app.add_option("--max-bytes", max_bytes, "largest buffer")->capture_default_str();
  bool no_check = false;
  app.add_flag("--no-check", no_check, "run the engine without its consistency check (EngineOptions)");
  app.add_option("--part", part, "time | traffic")->check(CLI::IsMember({"time", "traffic"}));
  app.add_option("--reps", reps, "timed repeats (median reported)");
  int series_count = 1;
  app.add_option("--series", series_count,
                 "time each variant's repeats in this many series, the variants taking turns (in order, then "
                 "shuffled; after a drain each, with --drain-bytes); the median is over all of them")
      ->check(CLI::PositiveNumber);
  app.add_option("--json", json, "write the rows to this JSON file");
  return kdist_perf::mpi_main(argc, argv, app, "bench_adasum", [&](int) {
    kdist::comm::Communicator world(MPI_COMM_WORLD);
    if (!costs.empty() && app.count("--small-bytes") == 0)
      small_bytes =
          kdist::adasum::small_bytes_from(kdist::CostModelStore::load(costs), kdist::DType::float32, world.size());
    kdist::comm::EngineOptions engine_options;
    engine_options.check_consistency = !no_check;
    kdist::comm::Engine engine(world, engine_options);
    const int me = world.rank(), P = world.size();
    std::unique_ptr<kdist_bench::Table> table;
    if (part == "time")
      table.reset(new kdist_bench::Table("bench_adasum.time", {"bytes",
                                                               "tensors",
                                                               "copy_GBs",
                                                               "read_GBs",
                                                               "triad_GBs",
                                                               "MPI_Allreduce_s",
                                                               "sum_bound_s",
                                                               "sum/bound",
                                                               "vhdd_unchunked_s",
                                                               "vhdd_s",
                                                               "vhdd_bound_s",
                                                               "vhdd/bound",
                                                               "in_place_s",
                                                               "in_place_stream_bound_s",
                                                               "in_place_bound_s",
                                                               "in_place/bound",
                                                               "in_place/MPI_Allreduce",
                                                               "doubling_s",
                                                               "adasum_s",
                                                               "adasum/MPI_Allreduce"}));
    else
      table.reset(new kdist_bench::Table(
          "bench_adasum.traffic", {"bytes", "rank", "vector_bytes_sent", "vector_bytes_bound", "vector_exchanges",
                                   "exchange_bound", "partial_reductions", "partial_bytes_sent", "sent/bound"}));
    table->set_print(me == 0);
    table->context("ranks", P);
    table->context("dtype", "float32");
    table->context("consistency_check", no_check ? "off" : "on");
    table->context("small_bytes", static_cast<long long>(small_bytes));
    table->context("drain_bytes", static_cast<long long>(drain_bytes));
    table->context("series", series_count);
    table->context("chunk_bytes", static_cast<long long>(chunk_bytes));
    table->context("default_chunk_bytes", static_cast<long long>(kdist::adasum::kDefaultChunkBytes));
    if (me == 0) {
      std::printf("# %s, %d ranks, float32%s\n", part.c_str(), P, part == "time" ? ", medians of max over ranks" : "");
      table->print_header();
    }
    if (part == "time") {
      int Pp = 1;
      while (Pp * 2 <= P) Pp *= 2;
      const kdist_bench::Bandwidth one = kdist_bench::measure_bandwidth<Host>(64u << 20, reps, MPI_COMM_WORLD, true);
      table->context("one_core_GBs", {{"copy", one.copy / 1e9}, {"read", one.read / 1e9}, {"triad", one.triad / 1e9}});
      if (me == 0)
        std::printf("# one core alone, 64 MiB arrays: copy %.1f, read %.1f, triad %.1f GB/s\n", one.copy / 1e9,
                    one.read / 1e9, one.triad / 1e9);
      for (std::size_t bytes = 256; bytes <= max_bytes; bytes *= 4) {
        const std::size_t n = bytes / sizeof(float);
        const double moved = static_cast<double>(bytes) * (1.0 - 1.0 / Pp);
        // Rates at the passes' working set: every pass streams arrays of n' (the halves at 2 ranks).
        const kdist_bench::Bandwidth bw = kdist_bench::measure_bandwidth<Host>(
            std::max<std::size_t>(static_cast<std::size_t>(moved), 64), reps, MPI_COMM_WORLD);
        const double sum_bound = P == 1 ? 0.0 : 4 * moved / bw.copy + 3 * moved / bw.triad;
        // Reading is never slower than copying per counted byte; the measured reduction can be (it
        // is not vectorised in cache), and a bound must take the faster rate.
        const double vhdd_bound = P == 1 ? 0.0 : sum_bound + 2 * moved / std::max(bw.read, bw.copy);
        // In place (SharedBuffer): no receive copies; the partials read both halves where they
        // lie, apply, and the all-gather pushes the results (copies of n' in all, the last
        // level's, n / P', written by the apply without a read).
        const double pushed = 2 * moved - static_cast<double>(bytes) / Pp;
        const double in_place_stream_bound =
            P == 1 ? 0.0 : pushed / bw.copy + 3 * moved / bw.triad + 2 * moved / std::max(bw.read, bw.copy);
        kdist::adasum::SharedBuffer<float> shared(engine, n);
        kdist_bench::InPlaceBound pattern(shared);
        std::vector<float> a(n), b(n);
        Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> bv(b.data(), n);
        for (std::size_t tensors : {std::size_t(1), std::size_t(64)}) {
          fill(a, me);
          fill(b, me);
          const auto bounds = even_bounds(n, tensors);
          auto adasum_run = [&](kdist::adasum::Algorithm alg, std::size_t chunk_of = 0) {
            kdist::adasum::Options o;
            o.algorithm = alg;
            o.small_bytes = small_bytes;
            o.chunk_bytes = chunk_of ? chunk_of : chunk_bytes;  // 0: the library default
            return [&, o] { kdist::adasum::allreduce(Host(), engine, bv, bounds, {}, o).wait(); };
          };
          for (std::size_t i = 0; i < n; ++i) shared.data()[i] = a[i];
          kdist::adasum::Options in_place;
          in_place.algorithm = kdist::adasum::Algorithm::vhdd;
          in_place.chunk_bytes = chunk_bytes;
          // Each variant's repeats run back to back, after a drain (--drain-bytes) on the emulated
          // link: every series then starts with an empty tbf bucket and settles into its own
          // steady state, instead of inheriting the burst a compute-heavy variant left behind.
          auto drain = [&] {
            std::vector<char> out(drain_bytes), in(drain_bytes);
            const int peer = (me ^ 1) < P ? me ^ 1 : MPI_PROC_NULL;
            MPI_Sendrecv(out.data(), static_cast<int>(drain_bytes), MPI_BYTE, peer, 7, in.data(),
                         static_cast<int>(drain_bytes), MPI_BYTE, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          };
          // --series N: each variant's series N times, the variants in turn, and the median of
          // all its repeats. On the emulated link a series settles in one of two states (at
          // 64 KiB MPI's own median was 83 us in one series and 247 us in the next), so one
          // series per variant compares states, not algorithms.
          const std::vector<std::function<void()>> variants = {
              [&] { MPI_Allreduce(MPI_IN_PLACE, a.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
              [&] { kdist::adasum::allreduce(engine, shared, bounds, {}, in_place).wait(); },
              adasum_run(kdist::adasum::Algorithm::vhdd, bytes),
              adasum_run(kdist::adasum::Algorithm::vhdd),
              adasum_run(kdist::adasum::Algorithm::doubling),
              adasum_run(kdist::adasum::Algorithm::automatic)};
          std::vector<std::vector<double>> pooled(variants.size());
          std::vector<double> bound_samples;  // in place's bound, one after each of its repeats
          const std::function<void(bool)> sample_bound = [&](bool counted) {
            const double b = pattern.sample();
            if (counted) bound_samples.push_back(b);
          };
          // The first turn in order, later ones shuffled (the same seed, so the same order, on
          // every rank): on the emulated link a series inherits TCP's state from the one before,
          // and automatic, always right after forced doubling's whole-vector bursts, once took
          // 22.6 ms for 4 MiB where VHDD, the same code at that size, took 16.8.
          std::vector<std::size_t> order(variants.size());
          std::iota(order.begin(), order.end(), std::size_t(0));
          std::mt19937 turns(12345u);
          for (int k = 0; k < series_count; ++k) {
            if (k > 0) std::shuffle(order.begin(), order.end(), turns);
            for (std::size_t v : order) {
              if (drain_bytes) drain();
              const std::vector<double> s =
                  kdist_bench::time_samples(reps, variants[v], 1, v == 1 && pattern.usable() ? sample_bound : nullptr);
              pooled[v].insert(pooled[v].end(), s.begin(), s.end());
            }
          }
          const double in_place_bound = bound_samples.empty() ? 0.0 : kdist_bench::median(bound_samples);
          const double t_mpi = kdist_bench::median(pooled[0]), t_in_place = kdist_bench::median(pooled[1]),
                       t_whole = kdist_bench::median(pooled[2]), t_vhdd = kdist_bench::median(pooled[3]),
                       t_doubling = kdist_bench::median(pooled[4]), t_ada = kdist_bench::median(pooled[5]);
          auto ratio = [](double t, double bound) { return bound > 0 ? t / bound : 0.0; };
          table->row({static_cast<long long>(bytes),
                      static_cast<long long>(tensors),
                      bw.copy / 1e9,
                      bw.read / 1e9,
                      bw.triad / 1e9,
                      t_mpi,
                      sum_bound,
                      ratio(t_mpi, sum_bound),
                      t_whole,
                      t_vhdd,
                      vhdd_bound,
                      ratio(t_vhdd, vhdd_bound),
                      t_in_place,
                      in_place_stream_bound,
                      in_place_bound,
                      ratio(t_in_place, in_place_bound),
                      t_in_place / t_mpi,
                      t_doubling,
                      t_ada,
                      t_ada / t_mpi});
        }
      }
    } else {
      int Pp = 1, L = 0;
      while (Pp * 2 <= P) {
        Pp *= 2;
        ++L;
      }
      const int q = P - Pp;
      for (std::size_t bytes : {std::size_t(1) << 20, std::size_t(16) << 20}) {
        const std::size_t n = bytes / sizeof(float);
        std::vector<float> a(n);
        fill(a, me);
        Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> av(a.data(), n);
        kdist::adasum::AdasumCounters c;
        kdist::adasum::Options o;
        o.algorithm = kdist::adasum::Algorithm::vhdd;  // the bound is VHDD's
        o.counters = &c;
        kdist::adasum::allreduce(Host(), engine, av, even_bounds(n, 64), {}, o).wait();
        const double bound =
            (2.0 * (Pp - 1) / Pp * static_cast<double>(n) + (me < 2 * q ? static_cast<double>(n) : 0.0)) * 4;
        const long long mine[] = {c.vector_bytes_sent, c.vector_exchanges, c.partial_reductions, c.partial_bytes_sent};
        std::vector<long long> all(4 * static_cast<std::size_t>(P));
        MPI_Gather(mine, 4, MPI_LONG_LONG, all.data(), 4, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
        std::vector<double> bounds_all(static_cast<std::size_t>(P));
        MPI_Gather(&bound, 1, MPI_DOUBLE, bounds_all.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        if (me == 0)
          for (int r = 0; r < P; ++r) {
            const long long* x = &all[4 * static_cast<std::size_t>(r)];
            const double bd = bounds_all[static_cast<std::size_t>(r)];
            table->row({static_cast<long long>(bytes), r, x[0], bd, x[1], 2 * L + 2, x[2], x[3],
                        bd > 0 ? static_cast<double>(x[0]) / bd : (x[0] == 0 ? 1.0 : HUGE_VAL)});
          }
      }
    }
    if (me == 0) table->write_json(json);
  });
}
