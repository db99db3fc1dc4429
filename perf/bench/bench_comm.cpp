// Communication benchmarks (run with mpiexec -n 2; figures are medians of >= 5 repeats of the
// maximum over ranks). --part selects one table; --json FILE writes its rows.
//   allreduce: engine all-reduce vs MPI_Allreduce and MPI_Iallreduce + MPI_Wait, 4 B - 64 MiB
//   overlap:   K all-reduces in flight while a gemm loop computes and polls the engine
//   fusion:    exposed factor communication on ResNet-50's Kronecker factors per fusion plan
#include <CLI/CLI.hpp>
#include <kdist/comm/calibrate.hpp>
#include <kdist/comm/fused_allreducer.hpp>
#include <kdist/core/impl/blas_host.hpp>
#include <kdist/core/products.hpp>

#include <algorithm>
#include <cstdio>

#include "common/bench_mpi.hpp"
#include "common/mpi_main.hpp"

namespace {

using kdist_bench::max_over_ranks;
using kdist_bench::time_median;
using Host = Kokkos::DefaultHostExecutionSpace;
using kdist::Clock;
using namespace kdist::comm;

void part_allreduce(int reps, kdist_bench::Table& table) {
  Communicator world(MPI_COMM_WORLD);
  Engine checked(world), unchecked(world, EngineOptions{false});
  for (std::size_t bytes = 4; bytes <= (64u << 20); bytes *= 4) {
    const int n = static_cast<int>(bytes / sizeof(float));
    Kokkos::View<float*, Kokkos::HostSpace> v("v", n);
    Kokkos::deep_copy(v, 1.0f);
    // Back-to-back operations per timed sample: one operation of a few microseconds timed alone
    // measures the barrier's exit skew between the ranks more than the operation.
    const int batch = static_cast<int>(std::clamp<std::size_t>((64u << 10) / bytes, 1, 256));
    const double t_mpi = time_median(
        reps, [&] { MPI_Allreduce(MPI_IN_PLACE, v.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }, batch);
    const double t_i = time_median(
        reps,
        [&] {
          MPI_Request r;
          MPI_Iallreduce(MPI_IN_PLACE, v.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
          MPI_Wait(&r, MPI_STATUS_IGNORE);
        },
        batch);
    const double t_e = time_median(
        reps, [&] { checked.allreduce(Host(), v).wait(); }, batch);
    const double t_n = time_median(
        reps, [&] { unchecked.allreduce(Host(), v).wait(); }, batch);
    table.row({static_cast<long long>(bytes), t_mpi, t_i, t_n, t_e, t_e / t_i, t_e / t_mpi});
  }
}

// A fixed compute loop: `chunks` dgemms of size d, calling `poll` between them.
template <class Poll>
void compute(int chunks, int d, std::vector<double>& a, std::vector<double>& c, Poll&& poll) {
  for (int k = 0; k < chunks; ++k) {
    kdist::impl::host::gemm<double>('N', 'N', d, d, d, 1.0, a.data(), d, a.data(), d, 0.0, c.data(), d);
    poll();
  }
}

void part_overlap(int reps, int K, kdist_bench::Table& table) {
  Communicator world(MPI_COMM_WORLD);
  Engine eng(world);
  const int d = 160, chunks = 200;
  std::vector<double> a(static_cast<std::size_t>(d) * d, 0.5), c(a.size());
  for (std::size_t bytes : {std::size_t(1) << 20, std::size_t(4) << 20, std::size_t(16) << 20}) {
    const int n = static_cast<int>(bytes / sizeof(float));
    std::vector<Kokkos::View<float*, Kokkos::HostSpace>> bufs;
    for (int k = 0; k < K; ++k) bufs.emplace_back("buf", n);
    const double t_comp = time_median(reps, [&] { compute(chunks, d, a, c, [] {}); });
    const double t_comm = time_median(reps, [&] {
      std::vector<Request> rs;
      for (auto& b : bufs) rs.push_back(eng.allreduce(Host(), b));
      for (auto& r : rs) r.wait();
    });
    // The compute part of each overlapped run and the engine's counts, warm-ups left out.
    std::vector<double> comp_part;
    double last_comp = 0;
    const double t_both = kdist_bench::median(kdist_bench::time_samples(
        reps,
        [&] {
          const double t0 = Clock::local_now();
          std::vector<Request> rs;
          for (auto& b : bufs) rs.push_back(eng.allreduce(Host(), b));
          compute(chunks, d, a, c, [&] { eng.progress(); });
          last_comp = Clock::local_now() - t0;
          for (auto& r : rs) r.wait();
        },
        1,
        [&](bool counted) {
          // The slowest rank's, as t_comp is (every rank runs this callback: collective).
          const double comp = max_over_ranks(last_comp);
          if (counted)
            comp_part.push_back(comp);
          else
            eng.reset_stats();
        }));
    const double hidden = std::max(0.0, (t_comp + t_comm - t_both) / t_comm);
    const double slowdown = kdist_bench::median(comp_part) / t_comp;
    const double before_wait = static_cast<double>(eng.stats().completed_before_wait) /
                               std::max(1.0, double(eng.stats().completed_before_wait + eng.stats().waited));
    table.row({static_cast<long long>(bytes), K, t_comp, t_comm, t_both, hidden, slowdown, before_wait,
               t_both / (t_comp + t_comm)});
  }
}

// torchvision ResNet-50: (input channels * kh * kw, output channels) of every conv layer in
// forward order, then the fc layer (with bias). K-FAC's A factor has dimension C_in*kh*kw
// (+1 with bias), G has C_out; both travel as packed upper triangles.
std::vector<std::pair<int, int>> resnet50_layers() {
  std::vector<std::pair<int, int>> L = {{3 * 49, 64}};
  int in = 64;
  const int planes[] = {64, 128, 256, 512}, blocks[] = {3, 4, 6, 3};
  for (int s = 0; s < 4; ++s)
    for (int b = 0; b < blocks[s]; ++b) {
      const int p = planes[s];
      L.push_back({in, p});                  // 1x1 reduce
      L.push_back({p * 9, p});               // 3x3
      L.push_back({p, 4 * p});               // 1x1 expand
      if (b == 0) L.push_back({in, 4 * p});  // downsample
      in = 4 * p;
    }
  L.push_back({2048 + 1, 1000});  // fc with bias
  return L;
}

void part_fusion(int reps, int rows, kdist_bench::Table& table) {
  Communicator world(MPI_COMM_WORLD);
  Engine eng(world);
  const auto layers = resnet50_layers();
  using FA = FusedAllreducer<float, Kokkos::HostSpace>;
  std::vector<FA::Tensor> specs;
  std::vector<FA::Symmetric> factors;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    specs.push_back({"A[" + std::to_string(l) + "]", static_cast<std::size_t>(layers[l].first), true});
    factors.emplace_back("A", layers[l].first, layers[l].first);
  }
  // Measured compute model: time to compute each A factor from `rows` activation rows here,
  // plus the time ready() takes to pack its upper triangle into the fusion buffer (the factor
  // can be sent only after that).
  std::vector<double> compute_time(layers.size()), pack_time(layers.size());
  for (std::size_t l = 0; l < layers.size(); ++l) {
    Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> X("X", rows, layers[l].first);
    Kokkos::View<float*, Kokkos::HostSpace> packed("packed", specs[l].elements());
    Kokkos::deep_copy(X, 0.01f);
    std::vector<double> s, p;
    for (int r = 0; r < 3; ++r) {
      double t0 = Clock::local_now();
      kdist::factor_product(Host(), X, factors[l], 1.0f / rows);
      s.push_back(Clock::local_now() - t0);
      t0 = Clock::local_now();
      kdist::pack_upper(Host(), factors[l], packed);
      p.push_back(Clock::local_now() - t0);
    }
    compute_time[l] = max_over_ranks(kdist_bench::median(s));
    pack_time[l] = max_over_ranks(kdist_bench::median(p));
  }
  std::vector<FusionTensor> t(layers.size());  // planner input: when each factor can be sent
  std::vector<double> compute_end(layers.size());
  double R = 0;
  std::size_t total = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    R += compute_time[l];
    compute_end[l] = R;
    t[l] = {specs[l].elements() * sizeof(float), R + pack_time[l]};
    total += t[l].bytes;
  }
  CalibrationOptions co;
  co.repeats = 3;
  co.max_bytes = 64u << 20;
  const kdist::CostModel cost = calibrate_collective(eng, kdist::CostOp::allreduce, DType::float32, co);
  const double bound = finish_time_lower_bound(t, cost) - t.back().ready;
  double none_measured = 0;
  for (Planner pl : {Planner::none, Planner::threshold, Planner::mgwfbp, Planner::optimal}) {
    PlannerOptions po;
    po.planner = pl;
    po.threshold_bytes = 64u << 20;
    const FusionPlan plan = decide_plan_on_root(eng, t, cost, po);
    FA fused(eng, specs, FA::average());
    fused.set_plan(plan);
    std::vector<double> exposed, scatter;
    for (int r = 0; r < reps + 1; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      fused.begin();
      const double t0 = Clock::local_now();
      for (std::size_t l = 0; l < layers.size(); ++l) {
        // The layer's compute: wait out its modelled time, polling the engine as hooks would.
        while (Clock::local_now() - t0 < compute_end[l]) eng.progress();
        fused.ready(Host(), static_cast<int>(l), factors[l]);
      }
      fused.wait_reduced();
      const double t_reduced = Clock::local_now() - t0;
      fused.scatter(Host());
      const double t_scatter = Clock::local_now() - t0 - t_reduced;
      const double e = max_over_ranks(t_reduced - t.back().ready);
      const double sc = max_over_ranks(t_scatter);
      if (r > 0) {
        exposed.push_back(e);
        scatter.push_back(sc);
      }
    }
    const double measured = kdist_bench::median(exposed);
    if (pl == Planner::none) none_measured = measured;
    const double modelled = plan_finish_time(t, plan, cost) - t.back().ready;
    table.row({static_cast<long long>(total), to_string(pl), plan.groups(), measured, modelled, bound,
               kdist_bench::median(scatter), measured / none_measured});
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdist communication benchmarks"};
  std::string part = "allreduce", json;
  int reps = 5, K = 8, rows = 256;
  app.add_option("--part", part, "allreduce | overlap | fusion")
      ->check(CLI::IsMember({"allreduce", "overlap", "fusion"}));
  app.add_option("--reps", reps, "timed repeats (median reported)");
  app.add_option("--inflight", K, "overlap: all-reduces in flight");
  app.add_option("--rows", rows, "fusion: activation rows per factor in the compute model");
  app.add_option("--json", json, "write the rows to this JSON file");
  return kdist_perf::mpi_main(argc, argv, app, "bench_comm", [&](int rank) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::unique_ptr<kdist_bench::Table> table;
    if (part == "allreduce")
      table.reset(new kdist_bench::Table(
          "bench_comm.allreduce", {"bytes", "MPI_Allreduce_s", "Iallreduce_wait_s", "engine_nocheck_s", "engine_s",
                                   "engine/Iallreduce", "engine/MPI_Allreduce"}));
    else if (part == "overlap")
      table.reset(new kdist_bench::Table("bench_comm.overlap",
                                         {"bytes", "inflight", "compute_s", "comm_s", "both_s", "hidden_frac",
                                          "compute_slowdown", "done_before_wait", "both/(compute+comm)"}));
    else
      table.reset(new kdist_bench::Table(
          "bench_comm.fusion", {"total_bytes", "plan", "groups", "exposed_s", "modelled_exposed_s", "lower_bound_s",
                                "scatter_s", "exposed/none"}));
    table->set_print(rank == 0);
    table->context("ranks", size);
    table->context("consistency_check", part == "allreduce" ? "engine_s: on, engine_nocheck_s: off" : "on");
    if (rank == 0) {
      std::printf("# %s, %d ranks, medians of %d (max over ranks)\n", part.c_str(), size, reps);
      table->print_header();
    }
    if (part == "allreduce") part_allreduce(reps, *table);
    if (part == "overlap") part_overlap(reps, K, *table);
    if (part == "fusion") part_fusion(reps, rows, *table);
    if (rank == 0) table->write_json(json);
  });
}
