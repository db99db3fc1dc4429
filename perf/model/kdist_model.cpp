// kdist_model: the SPD-KFAC scale model (perf/model/scale_model.hpp) from the command line.
//
//   --part validate     every bench_kfac configuration at the calibrated rank count, from a
//                       bench_kfac --profile (per-layer times) and a kdist_calibrate file; with
//                       --measured BENCH.json (bench_kfac --json of the same setting) the measured
//                       total and model / measured as the last column. It plans (fusion, placement)
//                       with --calibration, the file the run was given, and times the collectives
//                       with --timing FILE when given (a calibration of the same setting taken
//                       another way, e.g. kdist_calibrate --in-flight), else with --calibration.
//   --part strategies   per P: D-KFAC, MPD-KFAC and SPD-KFAC iteration times, SPD-KFAC with the channel
//                       placement (kfac::PlacementKind::channel), SPD / MPD, SPD / D-KFAC, channel / SPD
//   --part ablation     per P: the paper's Table IV against D-KFAC (-Pipe-LBP): +Pipe-LBP (pipelined,
//                       optimal fusion, replicated inverses), -Pipe+LBP, +Pipe+LBP (= spd)
//   --part placement    per P: the inverse phase replayed under replicated (Non-Dist), sequential
//                       (Seq-Dist) and lbp placement; the placement lower bound; sequential's and
//                       LBP's makespan in the placement's own load model (owners in parallel,
//                       broadcasts too: the paper's assumption) and LBP's ratio to the bound; the sum of LBP's
//                       broadcasts (one channel sends them all); the replayed lbp phase / bound; the channel
//                       placement replayed, its own lower bound (kfac::channel_lower_bound), their ratio,
//                       and channel / lbp, both replayed
//   --part fusion       per P: factor communication left exposed by each planner (pipelined), the
//                       unpipelined reduction, the lower bound, and the share optimal hides
// The projections take a network (--network, exact layer shapes from perf/model/networks.hpp) and
// a platform: --cluster FILE (perf/model/clusters/) or --calibration FILE plus --profile FILE (this
// machine: the calibrated collectives and inverse, compute rates fitted to the profile).
// Rank counts the platform does not list are extrapolated (platform.hpp): the "listed" column says.
// Milliseconds; one row per rank count (or configuration), --json FILE writes the same rows.
#include <kdist/core/error.hpp>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "common/bench_table.hpp"
#include "platform.hpp"

namespace {

using namespace kdist_perf;
using nlohmann::json;

struct Settings {
  std::string part = "strategies", network = "resnet50", cluster, calibration, timing, profile, measured, json;
  std::vector<int> ranks = {2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  int batch = 0;
  kdist::comm::Planner gradient_planner = kdist::comm::Planner::threshold;
};

struct Profile {
  std::vector<LayerShape> shapes;
  std::vector<LayerTimes> times;
  std::vector<double> inverse_x, inverse_s;  ///< d^3 and seconds, every distinct factor dimension
  int batch = 0, ranks = 0;
};

Profile read_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw kdist::Error("cannot read the profile '" + path + "'");
  Profile p;
  try {
    const json j = json::parse(in);
    p.batch = j.at("batch").get<int>();
    p.ranks = j.at("ranks").get<int>();
    for (const json& l : j.at("layers")) {
      LayerShape s;
      s.label = l.at("label").get<std::string>();
      s.dense = l.at("dense").get<bool>();
      s.bias = l.at("bias").get<bool>();
      s.c_in = l.at("c_in").get<int>();
      s.c_out = l.at("c_out").get<int>();
      s.k_h = s.k_w = l.at("k").get<int>();
      s.stride = l.at("stride").get<int>();
      s.pad_h = s.pad_w = l.at("padding").get<int>();
      s.in_h = s.in_w = l.at("side").get<int>();
      p.shapes.push_back(s);
      p.times.push_back({s.label, l.at("a_dim").get<int>(), l.at("g_dim").get<int>(),
                         l.at("gradient_elements").get<std::size_t>(), l.at("forward_s").get<double>(),
                         l.at("backward_s").get<double>(), l.at("factor_a_s").get<double>(),
                         l.at("factor_g_s").get<double>(), l.at("precondition_s").get<double>(),
                         l.at("precondition_copy_s").get<double>()});
    }
    std::map<int, std::pair<double, double>> packing;
    for (const json& i : j.at("inverses")) {
      const double d = i.at("dim").get<double>();
      p.inverse_x.push_back(d * d * d);
      p.inverse_s.push_back(i.at("seconds").get<double>());
      packing[i.at("dim").get<int>()] = {i.at("pack_s").get<double>(), i.at("unpack_s").get<double>()};
    }
    for (std::size_t i = 0; i < p.times.size(); ++i) {
      const json& l = j.at("layers")[i];
      p.times[i].factor_a_pipelined = l.at("factor_a_pipelined_s").get<double>();
      p.times[i].factor_g_pipelined = l.at("factor_g_pipelined_s").get<double>();
      p.times[i].forward_pipelined = l.value("forward_pipelined_s", 0.0);  // profiles before these fields: 0
      p.times[i].backward_pipelined = l.value("backward_pipelined_s", 0.0);
    }
    for (LayerTimes& l : p.times) {
      std::tie(l.pack_a, l.unpack_a) = packing.at(l.a_dim);
      std::tie(l.pack_g, l.unpack_g) = packing.at(l.g_dim);
    }
  } catch (const json::exception& e) {
    throw kdist::Error("the profile '" + path + "' is not a bench_kfac --profile file: " + e.what());
  }
  return p;
}

// bench_kfac's configurations, by the names it prints.
std::vector<std::pair<std::string, kdist::kfac::Resolved>> bench_configs() {
  using kdist::comm::Planner;
  using kdist::kfac::PlacementKind;
  std::vector<std::pair<std::string, kdist::kfac::Resolved>> c;
  for (auto st : {kdist::kfac::Strategy::dkfac, kdist::kfac::Strategy::mpdkfac, kdist::kfac::Strategy::spd}) {
    kdist::kfac::Options o;
    o.strategy = st;
    c.push_back({kdist::kfac::to_string(st), kdist::kfac::resolve(o)});
  }
  for (bool pipelined : {false, true})
    for (auto pl : {PlacementKind::replicated, PlacementKind::sequential, PlacementKind::lbp})
      for (auto pn : {Planner::none, Planner::threshold, Planner::mgwfbp, Planner::optimal})
        c.push_back({std::string(pipelined ? "pipe" : "nopipe") + "/" + kdist::kfac::to_string(pl) + "/" +
                         kdist::comm::to_string(pn),
                     {pipelined, pn, pl}});
  return c;
}

kdist::kfac::Resolved strategy(kdist::kfac::Strategy s) {
  kdist::kfac::Options o;
  o.strategy = s;
  return kdist::kfac::resolve(o);
}

double ms(double s) {
  return s * 1e3;
}

void validate(const Settings& s, kdist_bench::Table& table) {
  const Profile prof = read_profile(s.profile);
  const Platform platform =
      Platform::from_calibration(kdist::CostModelStore::load(s.calibration), {1, 1, 1, 1}, "this machine");
  std::map<std::string, double> measured;
  if (!s.measured.empty()) {
    std::ifstream in(s.measured);
    if (!in) throw kdist::Error("cannot read '" + s.measured + "'");
    const json doc = json::parse(in);  // named: a range-for over a temporary's member dangles
    for (const json& r : doc.at("rows")) measured[r.at("config").get<std::string>()] = r.at("total_ms").get<double>();
  }
  // The run planned with the calibration; its inverses cost what the profile measured.
  const CommModels planning = platform.at(prof.ranks);
  CommModels actual = planning;
  if (!s.timing.empty()) {
    const CommModels timed =
        Platform::from_calibration(kdist::CostModelStore::load(s.timing), {1, 1, 1, 1}, "this machine (timing)")
            .at(prof.ranks);
    actual.allreduce = timed.allreduce;
    actual.placement.broadcast = timed.placement.broadcast;
  }
  actual.placement.inverse = kdist::CostModel::from_measurements(prof.inverse_x, prof.inverse_s);
  table.context("profile", s.profile);
  table.context("calibration", s.calibration);
  if (!s.timing.empty()) table.context("timing", s.timing);
  table.context("ranks", prof.ranks);
  table.print_header();
  for (const auto& [name, switches] : bench_configs()) {
    Scenario sc;
    sc.ranks = prof.ranks;
    sc.switches = switches;
    sc.gradient_planner = kdist::comm::Planner::none;  // bench_kfac's gradient reducer never replans
    const Breakdown b = predict(prof.times, planning, sc, &actual).phases;
    const auto m = measured.find(name);
    const double meas = m == measured.end() ? 0.0 : m->second;
    table.row({name, ms(b.fwd_bwd), ms(b.grad_comm), ms(b.factors), ms(b.factor_comm), ms(b.inverses),
               ms(b.inverse_comm), ms(b.precondition), ms(b.total), meas, meas > 0 ? ms(b.total) / meas : 0.0});
  }
}

Platform platform_of(const Settings& s, int* batch) {
  if (!s.cluster.empty()) {
    Platform p = Platform::from_file(s.cluster);
    *batch = s.batch > 0 ? s.batch : p.batch();
    return p;
  }
  if (s.calibration.empty() || s.profile.empty())
    throw kdist::Error("a projection needs --cluster FILE, or --calibration FILE and --profile FILE");
  const Profile prof = read_profile(s.profile);
  const ComputeRates rates = fit_rates(prof.shapes, prof.batch, prof.times);
  *batch = s.batch > 0 ? s.batch : prof.batch;
  return Platform::from_calibration(kdist::CostModelStore::load(s.calibration), rates,
                                    "this machine (rates from " + s.profile + ")");
}

Scenario scenario(const Settings& s, int P, kdist::kfac::Resolved switches) {
  Scenario sc;
  sc.ranks = P;
  sc.switches = switches;
  sc.gradient_planner = s.gradient_planner;
  return sc;
}

void project(const Settings& s, kdist_bench::Table& table) {
  using kdist::kfac::PlacementKind;
  using kdist::kfac::Strategy;
  const std::vector<LayerShape> shapes = network_layers(s.network);
  int batch = 0;
  const Platform platform = platform_of(s, &batch);
  const std::vector<LayerTimes> times = network_times(shapes, batch, platform.rates());
  table.context("network", s.network);
  table.context("platform", platform.name());
  table.context("batch_per_rank", batch);
  table.print_header();
  for (int P : s.ranks) {
    const CommModels models = platform.at(P);
    const std::string listed = platform.extrapolated(P) ? "no" : "yes";
    auto run = [&](kdist::kfac::Resolved sw) { return predict(times, models, scenario(s, P, sw)); };
    if (s.part == "strategies") {
      const double d = run(strategy(Strategy::dkfac)).phases.total, m = run(strategy(Strategy::mpdkfac)).phases.total,
                   p = run(strategy(Strategy::spd)).phases.total,
                   c = run({true, kdist::comm::Planner::optimal, PlacementKind::channel}).phases.total;
      table.row({P, listed, ms(d), ms(m), ms(p), ms(c), p / m, p / d, c / p});
    } else if (s.part == "ablation") {
      using kdist::comm::Planner;
      const double base = run(strategy(Strategy::dkfac)).phases.total;
      const double pipe = run({true, Planner::optimal, PlacementKind::replicated}).phases.total;
      const double lbp = run({false, Planner::threshold, PlacementKind::lbp}).phases.total;
      const double both = run(strategy(Strategy::spd)).phases.total;
      table.row({P, listed, ms(base), ms(pipe), ms(lbp), ms(both), pipe / base, lbp / base, both / base});
    } else if (s.part == "placement") {
      auto inverse_phase = [&](PlacementKind k) { return run({true, kdist::comm::Planner::optimal, k}).inverse_phase; };
      const Prediction lbp = run(strategy(Strategy::spd));
      const double r = inverse_phase(PlacementKind::replicated), q = inverse_phase(PlacementKind::sequential),
                   l = inverse_phase(PlacementKind::lbp), ch = inverse_phase(PlacementKind::channel);
      int nct = 0;
      for (int o : lbp.placement.owner) nct += o < 0;
      double sent = 0;
      for (std::size_t f = 0; f < lbp.placement.owner.size(); ++f)
        if (lbp.placement.owner[f] >= 0) sent += lbp.placement.broadcast_s[f];
      const double seq_makespan = run(strategy(Strategy::mpdkfac)).placement.modelled_time;
      const kdist::kfac::Placement cp = run({true, kdist::comm::Planner::optimal, PlacementKind::channel}).placement;
      table.row({P, listed, nct, ms(r), ms(q), ms(l), ms(lbp.placement.lower_bound), l / std::min(r, q),
                 ms(seq_makespan), ms(lbp.placement.modelled_time),
                 lbp.placement.modelled_time / lbp.placement.lower_bound, ms(sent), l / lbp.placement.lower_bound,
                 ms(ch), ms(cp.lower_bound), ch / cp.lower_bound, ch / l});
    } else {
      std::vector<json> row{P, listed};
      double unpipelined = 0, optimal = 0, bound = 0;
      for (auto pn : {kdist::comm::Planner::none, kdist::comm::Planner::threshold, kdist::comm::Planner::mgwfbp,
                      kdist::comm::Planner::optimal}) {
        const Prediction pr = run({true, pn, PlacementKind::lbp});
        row.push_back(ms(pr.phases.factor_comm));
        unpipelined = pr.factor_comm_unpipelined;
        optimal = pr.phases.factor_comm;
        bound = pr.factor_comm_bound;
      }
      row.push_back(ms(unpipelined));
      row.push_back(ms(bound));
      row.push_back(unpipelined > 0 ? 1 - optimal / unpipelined : 0.0);
      table.row(row);
    }
  }
}

std::vector<std::string> columns(const std::string& part) {
  if (part == "validate")
    return {"config",          "fwd_bwd_ms", "grad_comm_ms", "factors_ms",  "factor_comm_ms", "inverses_ms",
            "inverse_comm_ms", "precond_ms", "total_ms",     "measured_ms", "model/measured"};
  if (part == "strategies")
    return {"ranks",          "listed",  "dkfac_ms",  "mpdkfac_ms",     "spd_ms",
            "spd_channel_ms", "spd/mpd", "spd/dkfac", "spd_channel/spd"};
  if (part == "ablation")
    return {"ranks",  "listed",     "dkfac_ms",  "pipe_only_ms", "lbp_only_ms",
            "spd_ms", "pipe/dkfac", "lbp/dkfac", "spd/dkfac"};
  if (part == "placement")
    return {"ranks",
            "listed",
            "nct",
            "replicated_ms",
            "sequential_ms",
            "lbp_ms",
            "lower_bound_ms",
            "lbp/best_other",
            "seq_makespan_ms",
            "makespan_ms",
            "makespan/bound",
            "broadcasts_ms",
            "lbp/bound",
            "channel_ms",
            "channel_bound_ms",
            "channel/channel_bound",
            "channel/lbp"};
  return {"ranks",      "listed",         "none_ms",  "threshold_ms",  "mgwfbp_ms",
          "optimal_ms", "unpipelined_ms", "bound_ms", "hidden_optimal"};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdist_model: the SPD-KFAC scale model (validation against bench_kfac, projection to P ranks)"};
  Settings s;
  app.add_option("--part", s.part, "validate, strategies, ablation, placement or fusion")
      ->check(CLI::IsMember({"validate", "strategies", "ablation", "placement", "fusion"}))
      ->capture_default_str();
  app.add_option("--network", s.network, "projection network")
      ->check(CLI::IsMember(network_names()))
      ->capture_default_str();
  app.add_option("--cluster", s.cluster, "cluster description (perf/model/clusters/*.json)");
  app.add_option("--calibration", s.calibration, "kdist_calibrate output of this machine");
  app.add_option("--timing", s.timing, "validate: time the collectives with this calibration (default --calibration)");
  app.add_option("--profile", s.profile, "bench_kfac --profile output (per-layer times)");
  app.add_option("--measured", s.measured, "bench_kfac --json output to compare with (validate)");
  app.add_option("--ranks", s.ranks, "rank counts to project")->check(CLI::PositiveNumber);
  app.add_option("--batch", s.batch, "images per rank (default: the cluster's or the profile's)")
      ->check(CLI::PositiveNumber);
  std::map<std::string, kdist::comm::Planner> planners{{"none", kdist::comm::Planner::none},
                                                       {"threshold", kdist::comm::Planner::threshold}};
  app.add_option("--gradient-fusion", s.gradient_planner, "gradient all-reduce fusion in projections")
      ->transform(CLI::CheckedTransformer(planners, CLI::ignore_case));
  app.add_option("--json", s.json, "write the rows to this JSON file");
  CLI11_PARSE(app, argc, argv);
  try {
    kdist_bench::Table table("kdist_model_" + s.part, columns(s.part));
    if (s.part == "validate") {
      if (s.profile.empty() || s.calibration.empty())
        throw kdist::Error("kdist_model --part validate needs --profile FILE and --calibration FILE");
      validate(s, table);
    } else {
      project(s, table);
    }
    table.write_json(s.json);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kdist_model: %s\n", e.what());
    return 1;
  }
  return 0;
}
