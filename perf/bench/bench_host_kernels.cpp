// bench_host_kernels: the two host passes of the Adasum all-reduce (adasum/host_kernels.hpp) on
// one core, against a plain read of the same bytes measured in the same run.
//
// For each size (float pairs a[i], b[i], summed as one tensor's piece): the partial sums
// [a.b, a.a, b.b] on every instruction set this CPU runs (AVX-512 also with Locality::cache: four
// blocks interleaved, as passes that fit in L2 take them), the apply pass (out = ca a + cb b,
// written twice as the in-place push does) on the widest, and the baseline: s += a[i] + b[i]
// over the same arrays (the pattern bound's read pass, perf/bench/in_place_bound.hpp). Medians of
// --reps repeats, each on arrays left in cache by the repeat before (up to 128 Ki pairs they fit
// in a 1 MiB L2). The last column is the widest partial sums (Locality::memory) over the read:
// what the arithmetic costs beyond moving the bytes.
//   build/perf/bench_host_kernels --reps 301 --json F
#include <kdist/adasum/host_kernels.hpp>
#include <kdist/core/timer.hpp>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/bench_table.hpp"
#include "in_place_bound.hpp"

namespace {

using kdist::adasum::impl::Isa;

template <class F>
double median_time(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = kdist::Clock::local_now();
    f();
    t.push_back(kdist::Clock::local_now() - t0);
  }
  return kdist_bench::median(t);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdist Adasum host kernels vs a plain read of the same bytes"};
  int reps = 301;
  app.add_option("--reps", reps, "timed repeats per kernel (median reported)")->capture_default_str();
  std::string json;
  app.add_option("--json", json, "write the rows to this JSON file");
  CLI11_PARSE(app, argc, argv);

  const Isa widest = kdist::adasum::impl::host_isa();
  kdist_bench::Table table("bench_host_kernels",
                           {"pairs", "read_s", "partials_scalar_s", "partials_avx2_s", "partials_avx512_s",
                            "partials_avx512_cache_s", "apply_s", "partials/read"});
  table.context("widest_isa", kdist::adasum::impl::to_string(widest));
  table.print_header();
  float sink = 0;
  for (std::size_t n : {std::size_t(4) << 10, std::size_t(32) << 10, std::size_t(128) << 10, std::size_t(1) << 20,
                        std::size_t(4) << 20}) {
    std::vector<float> a(n), b(n), out(n), also(n);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = static_cast<float>(std::sin(0.1 * static_cast<double>(i)));
      b[i] = static_cast<float>(std::cos(0.3 * static_cast<double>(i)));
    }
    const double t_read = median_time(reps, [&] { sink += kdist_bench::impl::read_pair(a.data(), b.data(), n); });
    std::vector<nlohmann::json> row = {static_cast<long long>(n), t_read};
    double t_widest = 0;
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
      if (static_cast<int>(isa) > static_cast<int>(widest)) {
        row.push_back(0.0);  // this CPU does not run it
        continue;
      }
      double v[3] = {};
      t_widest = median_time(reps, [&] { kdist::adasum::impl::add_blocks_isa(isa, a.data(), b.data(), 0, n, v); });
      sink += static_cast<float>(v[0]);
      row.push_back(t_widest);
    }
    double v[3] = {};  // AVX-512 with Locality::cache: four blocks interleaved
    const auto cached = [&] {
      kdist::adasum::impl::add_blocks_isa(Isa::avx512, a.data(), b.data(), 0, n, v,
                                          kdist::adasum::impl::Locality::cache);
    };
    row.push_back(widest == Isa::avx512 ? median_time(reps, cached) : 0.0);
    sink += static_cast<float>(v[0]);
    row.push_back(median_time(
        reps, [&] { kdist::adasum::impl::apply_host(out.data(), a.data(), b.data(), n, 0.5, 0.25, also.data()); }));
    row.push_back(t_widest / t_read);
    table.row(row);
  }
  table.context("checksum", sink);  // keeps the reads alive
  table.write_json(json);
  return 0;
}
