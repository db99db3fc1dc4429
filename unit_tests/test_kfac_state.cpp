// kfac::Preconditioner: resume from a state file at the same and at other rank counts, damaged
// and foreign states, failed saves, bad input on every rank, and the hook-order checker.
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <catch2/catch.hpp>
#include <climits>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <kdist/core/atomic_file.hpp>
#include <kdist/kfac/preconditioner.hpp>
#include <vector>

#include "kfac_network.hpp"

using namespace kfac_test;

namespace {
/// Inverses every 2 steps: a run resumed after step 3 first uses the saved inverses.
Options resume_options() {
  Options o = base_options();
  o.kl_clip = 1e-3;
  o.inverse_every = 2;
  return o;
}
/// Factor f of `kfac` as a dense symmetric matrix (its upper triangle mirrored).
template <class P>
Mat dense_factor(const P& kfac, int f) {
  const auto h = kdist_test::to_host(kfac.factor(f));
  const int d = static_cast<int>(h.extent(0));
  Mat m = zeros(d, d);
  for (int i = 0; i < d; ++i)
    for (int j = i; j < d; ++j) m[i][j] = m[j][i] = h(i, j);
  return m;
}
/// Every step's updates, one after the other.
std::vector<double> flatten(const std::vector<std::vector<double>>& steps) {
  std::vector<double> all;
  for (const auto& s : steps) all.insert(all.end(), s.begin(), s.end());
  return all;
}
}  // namespace

namespace {
/// 3 steps under `saved_with`, saved to `path`, then a new preconditioner under `resumed_with`
/// loads it: the next 3 updates must equal the uninterrupted run's bit for bit. `inspect(resumed,
/// its placement before the load, the saving run)` runs between the load and those steps.
template <class Inspect>
void check_bit_identical_resume(const Options& saved_with, const Options& resumed_with, const std::string& path,
                                const Inspect& inspect) {
  const auto layers = network();
  comm::Engine straight_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> straight(straight_engine, layers, saved_with);
  train(straight, layers, 0, 3);
  straight.save(path);
  const auto want = train(straight, layers, 3, 3);
  comm::Engine resumed_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> resumed(resumed_engine, layers, resumed_with);
  const Placement own = resumed.placement();
  resumed.load(path);
  inspect(resumed, own, straight);
  CHECK(train(resumed, layers, 3, 3) == want);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::remove(path.c_str());
}
}  // namespace

TEST_CASE("kfac: a resumed run makes bit-identical updates", "[kfac]") {
  check_bit_identical_resume(resume_options(), resume_options(), "test_kfac_state.bin",
                             [](const auto& resumed, const Placement&, const auto&) { CHECK(resumed.steps() == 3); });
}

TEST_CASE("kfac: a state resumed under another strategy keeps this run's placement and plan", "[kfac]") {
  const auto layers = network();
  Options spd = resume_options(), dkfac = resume_options();
  spd.cost_models = expensive_inverse_models();  // CT factors in the saved plan at P > 1
  dkfac.strategy = Strategy::dkfac;
  const std::string path = "test_kfac_state_strategy.bin";
  std::vector<int> saved_owners;
  {
    comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
    Preconditioner<double, TestMem> saved(engine, layers, spd);
    saved_owners = saved.placement().owner;
    train(saved, layers, 0, 3);
    saved.save(path);
  }
  comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> resumed(engine, layers, dkfac);
  const auto placement = resumed.placement().owner;
  CHECK((world_size() == 1 || saved_owners != placement));  // so that the next check can fail
  resumed.load(path);
  CHECK(resumed.placement().owner == placement);  // replicated: every factor inverted everywhere
  CHECK_THAT(resumed.describe(), Catch::Contains("saved with pipelined yes, planner optimal, placement lbp (this run: "
                                                 "pipelined no, planner threshold, placement replicated)"));
  const auto dense = flatten(reference(layers, dkfac, 6));
  const auto got = flatten(train(resumed, layers, 3, 3));
  CHECK(max_relative(got, std::vector<double>(dense.end() - static_cast<std::ptrdiff_t>(got.size()), dense.end())) <
        1e-6);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::remove(path.c_str());
}

// Saved with CT factors (inverses costed high), resumed at the same count and strategy with the
// default models (which would make every factor NCT): the saved owners, their packed broadcast
// buffers and the broadcasts after the resume, bit for bit; the plan's loads are the adopted ones.
TEST_CASE("kfac: a state with CT factors resumes them bit for bit", "[kfac]") {
  Options saved_with = resume_options();
  saved_with.cost_models = expensive_inverse_models();
  check_bit_identical_resume(
      saved_with, resume_options(), "test_kfac_state_ct.bin",
      [](const auto& resumed, const Placement& own, const auto& straight) {
        const Placement& adopted = resumed.placement();
        CHECK(adopted.owner == straight.placement().owner);
        if (world_size() > 1) {
          CHECK(adopted.owner != own.owner);
          CHECK(std::count(adopted.owner.begin(), adopted.owner.end(), -1) == 0);
        }
        std::vector<PlacementItem> items;  // this run's models, the adopted owners
        for (int f = 0; f < resumed.factors(); ++f)
          items.push_back({"f", static_cast<int>(resumed.factor(f).extent(0)),
                           resumed.holds_cholesky(f) ? kdist::kfac::kCholeskyFactorWork : 1.0});
        std::vector<double> load;
        const PlacementModels models = PlacementModels::from_store(CostModelStore{}, DType::float64, world_size());
        CHECK(adopted.modelled_time == placement_time(items, models, world_size(), adopted.owner, &load));
        CHECK(adopted.load == load);
        CHECK(adopted.lower_bound == own.lower_bound);
      });
}

// Damping is not in the factors, so a state resumed with another damping must not keep the
// inverses made with the saved one: the next step makes them again, with this run's damping.
TEST_CASE("kfac: a state resumed with another damping makes its inverses again", "[kfac]") {
  const auto layers = network();
  Options saved_with = resume_options(), resumed_with = resume_options();
  resumed_with.damping = 10 * saved_with.damping;
  const std::string path = "test_kfac_state_damping.bin";
  {
    comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
    Preconditioner<double, TestMem> saved(engine, layers, saved_with);
    train(saved, layers, 0, 3);
    saved.save(path);
  }
  comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> resumed(engine, layers, resumed_with);
  resumed.load(path);
  CHECK_THAT(resumed.restored(), Catch::Contains("damping 0.05 (this run: 0.5)") &&
                                     Catch::Contains("its inverses made again at the next step"));
  train(resumed, layers, 3, 1);  // step 3: not an inverse step (every 2), yet inverses are made
  for (int f = 0; f < resumed.factors(); ++f) {
    Mat damped = dense_factor(resumed, f);
    for (std::size_t i = 0; i < damped.size(); ++i) damped[i][i] += resumed_with.damping;
    // An inverse against the dense one; a Cholesky factor R by R^T R against the damped factor.
    const bool cholesky = resumed.holds_cholesky(f);
    const Mat want = cholesky ? damped : inverse(damped);
    const auto got = kdist_test::to_host(resumed.inverse(f));
    std::vector<double> g, w;
    for (std::size_t i = 0; i < want.size(); ++i)
      for (std::size_t j = 0; j < want.size(); ++j) {
        double rtr = 0;
        for (std::size_t k = 0; k <= std::min(i, j) && cholesky; ++k) rtr += got(k, i) * got(k, j);
        g.push_back(cholesky ? rtr : got(i, j));
        w.push_back(want[i][j]);
      }
    INFO("factor " << f);
    CHECK(max_relative(g, w) < 1e-9);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::remove(path.c_str());
}

namespace {
/// The first `ranks` ranks of the world (MPI_COMM_NULL on the others); the caller frees it.
MPI_Comm first_ranks(int ranks) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < ranks ? 0 : MPI_UNDEFINED, world_rank(), &comm);
  return comm;
}
}  // namespace

// Saved at 2 ranks (1 in a 1-rank world) after 3 steps, resumed at every rank count up to the
// world's: the next 3 updates are the uninterrupted run's up to floating-point order. Inverses
// every 2 steps, so the resumed run's first step uses the saved inverses, not fresh ones.
TEST_CASE("kfac: a state saved at 2 ranks resumes at 1, 2, 3 and 4 ranks with the same updates", "[kfac]") {
  const auto layers = network();
  const Options o = resume_options();
  const std::string path = "test_kfac_state_cross.bin";
  const int saved_at = std::min(2, world_size());
  std::vector<double> want;
  MPI_Comm save_group = first_ranks(saved_at);
  if (save_group != MPI_COMM_NULL) {
    DataOn data(save_group);
    comm::Engine engine{comm::Communicator(save_group)};
    Preconditioner<double, TestMem> straight(engine, layers, o);
    train(straight, layers, 0, 3);
    straight.save(path);
    want = flatten(train(straight, layers, 3, 3));
    MPI_Comm_free(&save_group);
  }
  int length = static_cast<int>(want.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  want.resize(static_cast<std::size_t>(length));
  MPI_Bcast(want.data(), length, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  const auto dense = flatten(reference(layers, o, 6));  // steps 3-5 of the dense reference
  const std::vector<double> dense_tail(dense.end() - static_cast<std::ptrdiff_t>(want.size()), dense.end());
  CHECK(max_relative(want, dense_tail) < 1e-9);
  for (int ranks = 1; ranks <= world_size(); ++ranks) {
    MPI_Comm group = first_ranks(ranks);
    if (group == MPI_COMM_NULL) continue;
    DataOn data(group);
    comm::Engine engine{comm::Communicator(group)};
    Preconditioner<double, TestMem> resumed(engine, layers, o);
    resumed.load(path);
    CHECK(resumed.steps() == 3);
    const std::string text = resumed.describe();
    CHECK_THAT(text, Catch::Contains("saved at " + std::to_string(saved_at) + " rank(s)"));
    if (ranks != saved_at)
      CHECK_THAT(text, Catch::Contains("made for " + std::to_string(ranks) + " rank(s)"));
    else
      CHECK_THAT(text, Catch::Contains("placement and fusion plan kept"));
    // The splits, and with them which factors are kept as Cholesky factors, change with the rank
    // count (test_kfac.cpp): 3 of the 6 between 1 and 2 ranks, all between 2 and 3, none between 2
    // and 4. The saved ones are converted, not made again, so the updates stay the same.
    const int converted = saved_at == 1 ? 0 : ranks == 1 ? 3 : ranks == 3 ? 6 : 0;
    if (converted > 0)
      CHECK_THAT(text, Catch::Contains(std::to_string(converted) + " inverse(s) converted"));
    else
      CHECK_THAT(text, !Catch::Contains("converted"));
    const std::vector<double> got = flatten(train(resumed, layers, 3, 3));
    INFO("resumed at " << ranks << " rank(s)");
    CHECK(max_relative(got, want) < 1e-5);
    CHECK(max_relative(got, dense_tail) < 1e-6);
    if (ranks == saved_at) CHECK(got == want);
    MPI_Comm_free(&group);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::remove(path.c_str());
}

namespace {
/// Rank 0 rewrites `path` with `edit` applied to its bytes; every rank waits for it.
void edit_file(const std::string& path, const std::function<void(std::string&)>& edit) {
  if (world_rank() == 0) {
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    edit(all);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << all;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

/// Rank 0 rewrites the K-FAC state at `path` (of `layers`, double) with `edit(section, matrix, d)`
/// applied to each factor and inverse section (row-major as stored: they are symmetric), the
/// fields kept; every rank waits for it.
void rewrite_sections(const std::string& path, const std::vector<Layer>& layers,
                      const std::function<void(const std::string&, std::vector<double>&, std::size_t)>& edit) {
  if (world_rank() == 0) {
    const StateReader saved(path, Preconditioner<double, TestMem>::kStateKind, "test");
    kfac::impl::StateShape shape;
    shape.dtype = DType::float64;
    shape.ranks = world_size();
    for (const Layer& l : layers) shape.layers.push_back(l.describe());
    const std::vector<std::string> labels = {"A0", "A1", "A2", "G2", "G1", "G0"};
    for (const std::string& f : labels) {
      const Layer& l = layers[static_cast<std::size_t>(f[1] - '0')];
      shape.dims.push_back(f[0] == 'A' ? l.a_dim() : l.g_dim());
    }
    const kfac::impl::StateCounters counters = kfac::impl::read_state_fields(saved, "", shape);
    StateWriter out(Preconditioner<double, TestMem>::kStateKind);
    kfac::impl::write_state_fields(out, "", shape, counters);
    for (std::size_t f = 0; f < labels.size(); ++f) {
      const std::size_t d = static_cast<std::size_t>(shape.dims[f]);
      for (const std::string kind : {"factor.", "inverse."}) {
        std::vector<double> m(d * d);
        saved.read(kind + labels[f], m.data(), m.size());
        edit(kind + labels[f], m, d);
        out.add(kind + labels[f], m.data(), m.size());
      }
    }
    out.write(path, "test");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
}  // namespace

// Item by item: what a damaged, foreign or mistyped state says on every rank (the file, the
// field or section, the byte offset), and that the preconditioner is left as it was.
TEST_CASE("kfac: a damaged or foreign state is refused on every rank, naming the field and offset", "[kfac]") {
  const auto layers = network();
  const Options o = base_options();
  const std::string good = "test_kfac_state_good.bin", bad = "test_kfac_state_bad.bin";
  comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
  {
    Preconditioner<double, TestMem> trained(engine, layers, o);
    train(trained, layers, 0, 2);
    trained.save(good);
  }
  Preconditioner<double, TestMem> kfac(engine, layers, o);
  const auto fresh_updates = [&] {
    comm::Engine other{comm::Communicator(MPI_COMM_WORLD)};
    Preconditioner<double, TestMem> fresh(other, layers, o);
    return train(fresh, layers, 0, 1);
  }();
  const auto refused = [&](const std::function<void(std::string&)>& edit) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::remove(bad.c_str());
    edit_file(good, [&](std::string& all) {
      std::string copy = all;
      edit(copy);
      std::ofstream(bad, std::ios::binary) << copy;
    });
    std::string message;
    try {
      kfac.load(bad);
    } catch (const Error& e) {
      message = e.what();
    }
    CHECK(kfac.steps() == 0);
    return message;
  };
  SECTION("truncated") {
    const std::string m = refused([](std::string& all) { all.resize(all.size() - 100); });
    CHECK_THAT(m,
               Catch::Contains(bad) && Catch::Contains("section 'factor.G0' (bytes") && Catch::Contains("(truncated)"));
  }
  SECTION("a flipped bit in a section") {
    const std::string m = refused([](std::string& all) { all[all.size() - 5] ^= 4; });
    CHECK_THAT(m, Catch::Contains("section 'inverse.G0' (bytes") && Catch::Contains("checksum does not match"));
  }
  SECTION("a changed byte in the header") {
    const std::string m = refused([](std::string& all) {
      const std::size_t at = all.find("\"step\":") + 7;
      all[at] = all[at] == '9' ? '8' : static_cast<char>(all[at] + 1);
    });
    CHECK_THAT(m, Catch::Contains("header (bytes") && Catch::Contains("checksum does not match"));
  }
  SECTION("not a state file") {
    const std::string m = refused([](std::string& all) { all = "epoch,loss\n1,0.5\n"; });
    CHECK_THAT(m, Catch::Contains(bad) && Catch::Contains("byte 0: no \"KDIST-STATE\" magic"));
  }
  SECTION("another model") {
    comm::Engine other_engine{comm::Communicator(MPI_COMM_WORLD)};
    Preconditioner<double, TestMem> other(other_engine, {Dense(7, 4, true)}, o);
    CHECK_THROWS_WITH(other.load(good), Catch::Contains(good) && Catch::Contains("field 'layers' (byte ") &&
                                            Catch::Contains("Dense(7, 4, bias)"));
    CHECK(other.steps() == 0);
  }
  SECTION("another dtype") {
    comm::Engine other_engine{comm::Communicator(MPI_COMM_WORLD)};
    Preconditioner<float, TestMem> other(other_engine, layers, o);
    CHECK_THROWS_WITH(other.load(good), Catch::Contains("field 'dtype' (byte ") &&
                                            Catch::Contains("the state holds float64, this preconditioner is float32"));
  }
  SECTION("other options: this run's apply, and describe() names what the state was saved with") {
    Options other_options = o;
    other_options.damping = 0.1;
    comm::Engine other_engine{comm::Communicator(MPI_COMM_WORLD)};
    Preconditioner<double, TestMem> other(other_engine, layers, other_options);
    other.load(good);
    CHECK(other.steps() == 2);
    CHECK_THAT(other.describe(), Catch::Contains("saved with damping 0.05 (this run: 0.1)"));
  }
  SECTION("nothing changed: the refused preconditioner trains like a fresh one") {
    refused([](std::string& all) { all[all.size() - 5] ^= 4; });
    CHECK(train(kfac, layers, 0, 1) == fresh_updates);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::remove(good.c_str()), std::remove(bad.c_str());
}

namespace {
std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
}  // namespace

TEST_CASE("kfac: a failed save leaves the previous file intact and every rank learns rank 0's reason", "[kfac]") {
  const auto layers = network();
  const std::string path = "test_kfac_state_failed_save.bin", tmp = kdist::impl::atomic_temporary_path(path);
  comm::Engine kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> kfac(kfac_engine, layers, base_options());
  kfac.save(path);  // the previous file: step 0
  const std::string before = file_bytes(path);
  train(kfac, layers, 0, 1);
  // A directory where rank 0's temporary goes: open(O_CREAT) fails, even for root.
  if (world_rank() == 0) REQUIRE(::mkdir(tmp.c_str(), 0755) == 0);
  const std::string m = message_of([&] { kfac.save(path); });
  CHECK_THAT(m, Catch::Contains("cannot write '" + path + "'"));
  if (world_rank() != 0) CHECK_THAT(m, Catch::Contains("kdist::kfac::Preconditioner::save: rank 0 failed:"));
  CHECK(file_bytes(path) == before);
  train(kfac, layers, 1, 1);  // still usable: the Engine did not fail
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) ::rmdir(tmp.c_str()), std::remove(path.c_str());
}

namespace {
/// One run under base_options(), its state saved after each (steps, path) in turn.
void save_states(const std::vector<Layer>& layers, const std::vector<std::pair<int, std::string>>& saves) {
  comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> run(engine, layers, base_options());
  int done = 0;
  for (const auto& [steps, path] : saves) {
    train(run, layers, done, steps - done);
    done = steps;
    run.save(path);
  }
}
}  // namespace

TEST_CASE("kfac: a load that fails on one rank fails on every rank with that rank's reason, nothing changed",
          "[kfac]") {
  const auto layers = network();
  const std::string good = "test_kfac_state_partial.bin", missing = "test_kfac_state_missing.bin";
  save_states(layers, {{2, good}});
  comm::Engine kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> kfac(kfac_engine, layers, base_options());
  const int last = world_size() - 1;  // the rank whose node lacks the file
  const std::string m = message_of([&] { kfac.load(world_rank() == last ? missing : good); });
  CHECK_THAT(m, Catch::Contains(missing));
  if (world_rank() != last) CHECK_THAT(m, Catch::Contains("rank " + std::to_string(last) + " failed:"));
  CHECK(kfac.steps() == 0);
  kfac.load(good);  // the Engine is still usable
  CHECK(kfac.steps() == 2);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::remove(good.c_str());
}

// Saved with every factor inverted, resumed where the split keeps some as Cholesky factors: the
// saved inverse of such a factor, made indefinite (-I), cannot be converted. Every rank refuses the
// load naming the factor, nothing changes, and the Engine stays usable.
TEST_CASE("kfac: a saved inverse that cannot be converted is refused on every rank, nothing changed", "[kfac]") {
  const auto layers = network();
  const std::string path = "test_kfac_state_unconvertible.bin";
  Options inverted = base_options();
  inverted.cholesky_solves = CholeskySolves::never;
  {
    comm::Engine engine{comm::Communicator(MPI_COMM_WORLD)};
    Preconditioner<double, TestMem> saved(engine, layers, inverted);
    train(saved, layers, 0, 2);
    saved.save(path);
  }
  comm::Engine kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> kfac(kfac_engine, layers, base_options());
  const std::vector<std::string> labels = {"A0", "A1", "A2", "G2", "G1", "G0"};
  int f = 0;  // the first factor this run keeps as R (every rank finds the same)
  while (!kfac.holds_cholesky(f)) ++f;
  const std::string label = labels[static_cast<std::size_t>(f)];
  rewrite_sections(path, layers, [&](const std::string& section, std::vector<double>& m, std::size_t d) {
    if (section != "inverse." + label) return;
    for (std::size_t i = 0; i < d; ++i)
      for (std::size_t j = 0; j < d; ++j) m[i * d + j] = i == j ? -1.0 : 0.0;
  });
  std::vector<Mat> factors_before;
  for (int g = 0; g < kfac.factors(); ++g) factors_before.push_back(dense_factor(kfac, g));
  const std::string m = message_of([&] { kfac.load(path); });
  CHECK_THAT(
      m, Catch::Contains("K-FAC factor " + label) && Catch::Contains(path) && Catch::Contains("not positive definite"));
  CHECK(kfac.steps() == 0);
  for (int g = 0; g < kfac.factors(); ++g) CHECK(dense_factor(kfac, g) == factors_before[static_cast<std::size_t>(g)]);
  train(kfac, layers, 0, 1);  // the Engine is still usable, the preconditioner as constructed
  CHECK(kfac.steps() == 1);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::remove(path.c_str());
}

TEST_CASE("kfac: ranks that read different states are refused on every rank, nothing changed", "[kfac]") {
  const auto layers = network();
  const std::string at2 = "test_kfac_state_at2.bin", at4 = "test_kfac_state_at4.bin";
  save_states(layers, {{2, at2}, {4, at4}});
  comm::Engine kfac_engine{comm::Communicator(MPI_COMM_WORLD)};
  Preconditioner<double, TestMem> kfac(kfac_engine, layers, base_options());
  const int last = world_size() - 1;  // the rank whose node holds a stale copy
  const std::string m = message_of([&] { kfac.load(world_rank() == last ? at2 : at4); });
  if (world_size() > 1)
    CHECK_THAT(m, Catch::Contains("kdist::kfac::Preconditioner::load: ranks hold different K-FAC states") &&
                      Catch::Contains("rank " + std::to_string(last)));
  else
    CHECK(m.empty());
  CHECK(kfac.steps() == (world_size() > 1 ? 0 : 2));
  kfac.load(at4);  // the Engine is still usable
  CHECK(kfac.steps() == 4);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    std::remove(at2.c_str());
    std::remove(at4.c_str());
  }
}

TEST_CASE("kfac: bad input raises on every rank without a hang", "[kfac][leaks-comm]") {
  const auto layers = network();
  const comm::Communicator world(MPI_COMM_WORLD);
  TestExec exec;
  // Options that differ on rank 1: two steps meet a mismatch on every rank (at 2 ranks or more).
  const auto disagreeing_ranks_fail = [&](const Options& o) {
    if (world_size() == 1) return;
    comm::Engine kfac_engine{world};
    Preconditioner<double, TestMem> kfac(kfac_engine, layers, o);
    CHECK_THROWS_AS(train(kfac, layers, 0, 2), Error);
  };
  SECTION("options out of range") {
    for (auto bad : std::vector<std::function<void(Options&)>>{
             [](Options& o) { o.damping = 0; }, [](Options& o) { o.factor_decay = 1; },
             [](Options& o) { o.factor_decay = -0.1; }, [](Options& o) { o.factor_every = 0; },
             [](Options& o) { o.inverse_every = 0; }}) {
      Options o = base_options();
      bad(o);
      auto make = [&](const Options& x) {
        comm::Engine k_engine{world};
        Preconditioner<double, TestMem> k(k_engine, layers, x);
      };
      CHECK_THROWS_AS(make(o), InvalidArgument);
    }
  }
  SECTION("unknown layer") {
    comm::Engine kfac_engine{world};
    Preconditioner<double, TestMem> kfac(kfac_engine, layers, base_options());
    CHECK_THROWS_WITH(kfac.on_forward(exec, 3, dense_input<double>(layers[1], 0, 1)), Catch::Contains("layer 3"));
  }
  SECTION("a factor index out of range: a local InvalidArgument, the Engine healthy") {
    comm::Engine kfac_engine{world};
    Preconditioner<double, TestMem> kfac(kfac_engine, layers, base_options());
    for (int f : {-1, kfac.factors()}) {
      CHECK_THROWS_WITH(kfac.factor(f),
                        Catch::Contains("Preconditioner::factor: factor " + std::to_string(f) + " of 6"));
      CHECK_THROWS_WITH(kfac.inverse(f), Catch::Contains("Preconditioner::inverse: factor " + std::to_string(f)));
    }
    CHECK(kfac_engine.healthy());
  }
  SECTION("a layer whose A factor's dimension passes int") {
    for (const auto& make : std::vector<std::function<Layer()>>{
             [] { return kfac::Conv2d(65536, 8, 256, 256); },            // 2^32 + 1
             [] { return kfac::Conv2d(1 << 21, 8, 1 << 21, 1 << 21); },  // 2^63: wraps in a long long
             [] { return kfac::Dense(INT_MAX, 1, true); }})
      CHECK_THROWS_WITH(make(), Catch::Contains("the A factor's dimension exceeds int"));
    CHECK(kfac::Dense(INT_MAX, 1, false).a_dim() == INT_MAX);
    CHECK(kfac::Conv2d(1, 1, 3, 3, 1, INT_MAX / 2 + 1).out_h(1) == INT_MAX);  // 1 + 2 padding passes int
    CHECK_THROWS_WITH(kfac::Conv2d(1, 1, 1, 1, 1, INT_MAX / 2 + 1).out_h(1), Catch::Contains("exceeds int"));
  }
  // A rank that fails first tells the others, which may then raise RemoteError carrying its
  // message before they reach the same check themselves: either way the message is there.
  SECTION("hooks out of order, twice, and step too early") {
    comm::Engine a_engine{world};
    Preconditioner<double, TestMem> a(a_engine, layers, base_options());
    CHECK_THROWS_WITH(a.on_forward(exec, 1, dense_input<double>(layers[1], 0, 1)), Catch::Contains("out of order"));
    comm::Engine b_engine{world};
    Preconditioner<double, TestMem> b(b_engine, layers, base_options());
    CHECK_THROWS_WITH(
        [&] {
          b.on_forward(exec, 0, conv_input<double>(layers[0], 0, 0));
          b.on_forward(exec, 0, conv_input<double>(layers[0], 0, 0));
        }(),
        Catch::Contains("out of order"));
    comm::Engine c_engine{world};
    Preconditioner<double, TestMem> c(c_engine, layers, base_options());
    auto g = gradients<double>(layers, 0);
    CHECK_THROWS_WITH(c.step(exec, g), Catch::Contains("before every layer's hooks"));
  }
  SECTION("wrong extents and kinds") {
    comm::Engine a_engine{world};
    Preconditioner<double, TestMem> a(a_engine, layers, base_options());
    CHECK_THROWS_WITH(
        [&] {
          a.on_forward(exec, 0, conv_input<double>(layers[0], 0, 0));
          a.on_forward(exec, 1, dense_input<double>(layers[2], 0, 2));
        }(),
        Catch::Contains("Dense(7, 4"));
    comm::Engine b_engine{world};
    Preconditioner<double, TestMem> b(b_engine, layers, base_options());
    CHECK_THROWS_WITH(b.on_forward(exec, 0, dense_input<double>(layers[1], 0, 1)), Catch::Contains("rank 4"));
    comm::Engine c_engine{world};
    Preconditioner<double, TestMem> c(c_engine, layers, base_options());
    CHECK_THROWS_WITH(
        [&] {
          run_hooks(c, layers, 0);
          auto g = gradients<double>(layers, 0);
          g[1].weight = DeviceMatrixR<double>("dW", 4, 6);
          c.step(exec, g);
        }(),
        Catch::Contains("takes a weight gradient 4 x 7"));
  }
  SECTION("ranks that disagree on the layer list: a mismatch on every rank, not a wrong answer") {
    if (world_size() > 1) {
      const bool odd = world_rank() == 1;
      const std::vector<Layer> mine = {Dense(7, 4, true), Dense(4, odd ? 2 : 3, false)};
      comm::Engine kfac_engine{world};
      Preconditioner<double, TestMem> kfac(kfac_engine, mine, base_options());
      CHECK_THROWS_AS(train(kfac, mine, 0, 1), Error);
    }
  }
  SECTION("ranks that disagree on split preconditioning: a mismatch on every rank, not a hang") {
    // Rank 1 preconditions everything itself; the others wait in the all-gather of the blocks,
    // and rank 1's next operation (the next step's factor reduction) meets it.
    Options o = base_options();
    o.split_preconditioning = world_rank() != 1;
    disagreeing_ranks_fail(o);
  }
  SECTION("ranks that disagree on the placement: a mismatch on every rank, not a hang") {
    // Rank 1 broadcasts every inverse from its owner (sequential, all CT); the others place for
    // the channel, which with the default models inverts these small factors everywhere.
    Options o = base_options();
    o.placement = world_rank() == 1 ? PlacementKind::sequential : PlacementKind::channel;
    disagreeing_ranks_fail(o);
  }
  SECTION("ranks that disagree on the factor sync: a mismatch on every rank, not a hang") {
    // Rank 1 syncs before inverse steps only: at step 1 the others all-reduce their factors
    // where rank 1 all-gathers its preconditioned block.
    Options o = base_options();
    o.inverse_every = 4;
    o.factor_sync = world_rank() == 1 ? FactorSync::before_inverses : FactorSync::every_step;
    disagreeing_ranks_fail(o);
  }
  SECTION("ranks that disagree on low_rank_dense: a mismatch on every rank, not a hang") {
    // The others all-reduce their batch projections where rank 1 all-gathers its block.
    Options o = base_options();
    o.low_rank_dense = world_rank() != 1;
    disagreeing_ranks_fail(o);
  }
  SECTION("sync_factors called on one rank only: a mismatch on every rank, not a hang") {
    if (world_size() > 1) {
      Options o = base_options();
      o.inverse_every = 4;
      o.factor_sync = FactorSync::before_inverses;
      comm::Engine kfac_engine{world};
      Preconditioner<double, TestMem> kfac(kfac_engine, layers, o);
      train(kfac, layers, 0, 2);  // step 1's factors are rank-local
      REQUIRE(kfac.factors_local());
      CHECK_THROWS_AS(
          [&] {
            if (world_rank() == 0) kfac.sync_factors(exec);
            train(kfac, layers, 2, 1);
          }(),
          Error);
    }
  }
  SECTION("NaN in one rank's activations: that rank names it, the others hear it") {
    comm::Engine kfac_engine{world};
    Preconditioner<double, TestMem> kfac(kfac_engine, layers, base_options());
    const bool poisoned = world_rank() == world_size() - 1;
    auto run = [&] {
      kfac.on_forward(exec, 0, conv_input<double>(layers[0], 0, 0));
      auto x = dense_input<double>(layers[1], 0, 1);
      if (poisoned) kdist_test::fill(Kokkos::subview(x, 0, Kokkos::ALL), [](std::size_t) { return NAN; });
      kfac.on_forward(exec, 1, x);
      kfac.on_forward(exec, 2, dense_input<double>(layers[2], 0, 2));
      for (int l = 2; l >= 0; --l)
        l == 0 ? kfac.on_backward(exec, l, conv_output_grad<double>(layers[0], 0, 0))
               : kfac.on_backward(exec, l, dense_output_grad<double>(layers[l], 0, l));
      auto g = gradients<double>(layers, 0);
      kfac.step(exec, g);
    };
    if (poisoned)
      CHECK_THROWS_AS(run(), NonFiniteError);
    else if (world_size() > 1)
      CHECK_THROWS_WITH(run(),
                        Catch::Contains("layer 1") && Catch::Contains("rank " + std::to_string(world_size() - 1)));
  }
  SECTION("a factor that is not SPD after damping") {
    Options o = base_options();
    const std::string path = "test_kfac_bad_state.bin";
    {
      comm::Engine kfac_engine{world};
      Preconditioner<double, TestMem> kfac(kfac_engine, layers, o);
      kfac.save(path);
    }
    // The same state with G2 (factor 3: after A0, A1, A2) negative definite: -10 I.
    rewrite_sections(path, layers, [](const std::string& section, std::vector<double>& m, std::size_t d) {
      if (section == "factor.G2")
        for (std::size_t i = 0; i < d; ++i) m[i * d + i] = -10;
    });
    comm::Engine kfac_engine{world};
    Preconditioner<double, TestMem> kfac(kfac_engine, layers, o);
    kfac.load(path);
    // Step 0 updates the factors: the corrupted G2 is blended (decay 0.8) into -8 I + 0.2 G_new,
    // still not SPD after damping 0.05.

    auto run = [&] {
      run_hooks(kfac, layers, 0);
      auto g = gradients<double>(layers, 0);
      kfac.step(exec, g);
    };
    // The owner (every rank when G2 is NCT) raises NumericalError, the others RemoteError with it.

    std::vector<Mat> factors_before;
    for (int f = 0; f < kfac.factors(); ++f) factors_before.push_back(dense_factor(kfac, f));
    CHECK_THROWS_WITH(run(), Catch::Contains("G2") && Catch::Contains("not positive definite"));
    // The failed step changed neither the running factors nor the counters.
    for (int f = 0; f < kfac.factors(); ++f)
      CHECK(dense_factor(kfac, f) == factors_before[static_cast<std::size_t>(f)]);
    CHECK(kfac.steps() == 0);
    CHECK(kfac.stats().factor_steps == 0);
    CHECK(kfac.stats().inverse_steps == 0);
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::remove(path.c_str());
  }
}

TEST_CASE("HookOrder: forward 0..L-1, backward L-1..0, then step; messages name the hook, layer and rank",
          "[kfac][hooks]") {
  kdist::kfac::impl::HookOrder order(3, 5);
  CHECK(order.check_layer("on_forward", 3).find("layer 3 is not one of the 3 layers (rank 5)") != std::string::npos);
  CHECK(order.check_layer("on_forward", 2).empty());
  CHECK(order.check_between_steps("save").empty());
  CHECK(order.check_forward(1).find("expected layer 0 next") != std::string::npos);
  CHECK(order.check_backward(2).find("before every layer's on_forward (0 of 3 ran; rank 5)") != std::string::npos);
  for (int l = 0; l < 3; ++l) {
    CHECK(order.check_forward(l).empty());
    order.advance_forward();
  }
  CHECK(order.check_forward(0).find("every layer's on_forward already ran") != std::string::npos);
  CHECK(order.check_between_steps("save").find("inside a step") != std::string::npos);
  CHECK(order.check_step().find("0 of 3 on_backward") != std::string::npos);
  CHECK(order.check_backward(0).find("expected layer 2 next") != std::string::npos);
  for (int l = 2; l >= 0; --l) {
    CHECK(order.check_backward(l).empty());
    order.advance_backward();
  }
  CHECK(order.check_step().empty());
  order.start_step();
  CHECK(order.check_forward(0).empty());
  CHECK(order.check_between_steps("load").empty());
}
