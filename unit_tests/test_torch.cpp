// kdist::torch: tensors as views without copies, K-FAC on LibTorch modules against the nn/ path
// on the same weights and data, gradient reduction agreeing across ranks, and bad input refused
// on every rank.
#include <mpi.h>
#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <kdist/nn/conv2d.hpp>
#include <kdist/nn/dense.hpp>
#include <kdist/nn/loss.hpp>
#include <kdist/torch/gradient_reducer.hpp>
#include <kdist/torch/kfac.hpp>
#include <kdist/torch/tensor_view.hpp>
#include <vector>

#include "deep_copies.hpp"
#include "same_on_every_rank.hpp"
#include "test_space.hpp"

namespace {

using kdist_test::TestExec;
using kdist_test::TestMem;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Two Linear layers (no activation between, so the nn/ side needs nothing but nn::Dense).
struct TwoLayers : ::torch::nn::Module {
  TwoLayers()
      : fc1(register_module("fc1", ::torch::nn::Linear(6, 5))),
        fc2(register_module("fc2", ::torch::nn::Linear(5, 3))) {}
  at::Tensor forward(kdist::torch::KFAC* kfac, const at::Tensor& x) {
    if (!kfac) return fc2(fc1(x));
    return kfac->forward(fc2, kfac->forward(fc1, x));
  }
  ::torch::nn::Linear fc1, fc2;
};

at::Tensor batch(int step, int rank, int rows = 8) {
  ::torch::manual_seed(static_cast<uint64_t>(100 * step + rank));
  return ::torch::randn({rows, 6});
}
at::Tensor labels(int step, int rank, int rows = 8) {
  ::torch::manual_seed(static_cast<uint64_t>(1000 + 100 * step + rank));
  return ::torch::randint(0, 3, {rows}, ::torch::kLong);
}

std::vector<float> values(const at::Tensor& t) {
  const at::Tensor c = t.detach().contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}
template <class V>
std::vector<float> values_of(const V& v) {
  const auto h = kdist_test::to_host(v);
  return std::vector<float>(h.data(), h.data() + h.span());
}
double max_relative(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return got.size() == want.size() ? err / scale : 1e300;
}

kdist::kfac::Options options() {
  kdist::kfac::Options o;
  o.damping = 0.05;
  o.kl_clip = 1e-3;
  return o;
}

}  // namespace

TEST_CASE("torch: a view aliases its tensor, and what it cannot alias is refused", "[torch]") {
  at::Tensor t = ::torch::zeros({3, 4});
  auto v = kdist::torch::view_of<float**, Kokkos::HostSpace>(t, "t");
  CHECK(v.data() == t.data_ptr<float>());
  CHECK(v.extent(0) == 3);
  CHECK(v.extent(1) == 4);
  v(1, 2) = 5;
  CHECK(t[1][2].item<float>() == 5);
  auto flat = kdist::torch::flat_view_of<float, Kokkos::HostSpace>(::torch::ones({2, 3, 4}), "cube");
  CHECK(flat.extent(0) == 24);

  using kdist::InvalidArgument;
  const auto refused = [](const at::Tensor& x) {
    try {
      kdist::torch::view_of<float**, Kokkos::HostSpace>(x, "input of fc1");
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(refused(::torch::zeros({3, 4}).t()),
             Catch::Contains("input of fc1: not contiguous") && Catch::Contains("sizes [4, 3]") &&
                 Catch::Contains("strides [1, 4]") && Catch::Contains("(rank " + std::to_string(world_rank())));
  CHECK_THAT(refused(::torch::zeros({3, 4}, ::torch::kFloat64)),
             Catch::Contains("not Float") && Catch::Contains("Double"));
  CHECK_THAT(refused(::torch::zeros({3, 4, 2})), Catch::Contains("not of rank 2"));
  CHECK_THAT(refused(::torch::empty({3, 4}, ::torch::TensorOptions().device(::torch::kMeta))),
             Catch::Contains("not on the cpu device") && Catch::Contains("meta"));
  CHECK_THAT(refused(at::Tensor()), Catch::Contains("undefined"));
  // A sparse tensor says it is contiguous, and has no dense storage to alias.
  CHECK_THAT(refused(::torch::zeros({3, 4}).to_sparse()),
             Catch::Contains("not a strided (dense) tensor") && Catch::Contains("layout Sparse"));
}

// One K-FAC step on the same weights and data through LibTorch and through nn::Dense: the same
// factors and the same preconditioned gradients (float, 1e-5). One rank's data, on every rank.
TEST_CASE("torch: K-FAC on torch::nn::Linear equals the nn/ path", "[torch]") {
  ::torch::manual_seed(7);
  auto model = std::make_shared<TwoLayers>();
  const at::Tensor x = batch(0, 0), y = labels(0, 0);

  kdist::comm::Engine torch_engine{kdist::comm::Communicator(MPI_COMM_SELF)};
  kdist::torch::KFAC kfac(*model, torch_engine, options());
  REQUIRE(kfac.layers() == 2);
  at::Tensor loss = ::torch::nn::functional::cross_entropy(model->forward(&kfac, x), y);
  loss.backward();
  kfac.step();

  kdist::comm::Engine nn_engine{kdist::comm::Communicator(MPI_COMM_SELF)};
  kdist::nn::Dense<float, TestMem> d1(6, 5), d2(5, 3);
  kdist::kfac::Preconditioner<float, TestMem> nn_kfac(nn_engine, {d1.kfac_layer(), d2.kfac_layer()}, options());
  d1.attach(&nn_kfac, 0);
  d2.attach(&nn_kfac, 1);
  for (auto [layer, torch_layer] : {std::make_pair(&d1, &model->fc1), std::make_pair(&d2, &model->fc2)}) {
    Kokkos::deep_copy(layer->weight(),
                      kdist::torch::view_of<float**, Kokkos::HostSpace>((*torch_layer)->weight.detach(), "w"));
    Kokkos::deep_copy(layer->bias(),
                      kdist::torch::view_of<float*, Kokkos::HostSpace>((*torch_layer)->bias.detach(), "b"));
  }
  TestExec exec;
  auto xv = kdist_test::device_matrix<float, Kokkos::LayoutRight>("x", 8, 6,
                                                                  [&](int i, int j) { return x[i][j].item<float>(); });
  kdist::nn::Tensor2<float, TestMem> h("h", 8, 5), z("z", 8, 3), dz("dz", 8, 3), dh("dh", 8, 5);
  Kokkos::View<int*, TestMem> yv = kdist_test::device_vector<int>("y", [&] {
    std::vector<int> v;
    for (int i = 0; i < 8; ++i) v.push_back(static_cast<int>(y[i].item<int64_t>()));
    return v;
  }());
  d1.forward(exec, xv, h);
  d2.forward(exec, h, z);
  kdist::nn::SoftmaxCrossEntropy<float, TestMem> ce;
  CHECK(std::abs(ce.forward(exec, z, yv) - loss.item<double>()) < 1e-5);
  ce.backward(exec, dz);
  d2.backward(exec, dz, dh);
  d1.backward(exec, dh);
  nn_kfac.step(exec, {d1.gradient(), d2.gradient()});

  for (int f = 0; f < 4; ++f) {
    INFO("factor " << f);
    CHECK(max_relative(values_of(kfac.preconditioner().factor(f)), values_of(nn_kfac.factor(f))) < 1e-5);
  }
  CHECK(max_relative(values(model->fc1->weight.grad()), values_of(d1.gradient().weight)) < 1e-5);
  CHECK(max_relative(values(model->fc1->bias.grad()), values_of(d1.gradient().bias)) < 1e-5);
  CHECK(max_relative(values(model->fc2->weight.grad()), values_of(d2.gradient().weight)) < 1e-5);
  CHECK(max_relative(values(model->fc2->bias.grad()), values_of(d2.gradient().bias)) < 1e-5);
}

// The same for a torch::nn::Conv2d (3x3, padding 1, bias) against nn::Conv2d: its output,
// flattened, is the logits of a mean cross-entropy.
TEST_CASE("torch: K-FAC on torch::nn::Conv2d equals the nn/ path", "[torch]") {
  ::torch::manual_seed(5);
  struct ConvNet : ::torch::nn::Module {
    ConvNet() : conv(register_module("conv", ::torch::nn::Conv2d(::torch::nn::Conv2dOptions(2, 3, 3).padding(1)))) {}
    ::torch::nn::Conv2d conv;
  };
  auto model = std::make_shared<ConvNet>();
  const at::Tensor x = ::torch::randn({4, 2, 5, 6});
  const at::Tensor y = ::torch::randint(0, 90, {4}, ::torch::kLong);
  kdist::comm::Engine torch_engine{kdist::comm::Communicator(MPI_COMM_SELF)};
  kdist::torch::KFAC kfac(*model, torch_engine, options());
  at::Tensor loss = ::torch::nn::functional::cross_entropy(kfac.forward(model->conv, x).flatten(1), y);
  loss.backward();
  kfac.step();

  kdist::comm::Engine nn_engine{kdist::comm::Communicator(MPI_COMM_SELF)};
  kdist::nn::Conv2d<float, Kokkos::HostSpace> conv(2, 3, 3, 3, 1, 1, true);
  kdist::kfac::Preconditioner<float, Kokkos::HostSpace> nn_kfac(nn_engine, {conv.kfac_layer()}, options());
  conv.attach(&nn_kfac, 0);
  Kokkos::deep_copy(conv.weight(),
                    kdist::torch::view_of<float**, Kokkos::HostSpace>(model->conv->weight.detach().view({3, -1}), "w"));
  Kokkos::deep_copy(conv.bias(), kdist::torch::view_of<float*, Kokkos::HostSpace>(model->conv->bias.detach(), "b"));
  Kokkos::DefaultHostExecutionSpace exec;
  kdist::nn::Tensor4<float, Kokkos::HostSpace> out("out", 4, 3, 5, 6), dout("dout", 4, 3, 5, 6);
  conv.forward(exec, kdist::torch::view_of<float****, Kokkos::HostSpace>(x, "x"), out);
  Kokkos::View<int*, Kokkos::HostSpace> yv("y", 4);
  for (int i = 0; i < 4; ++i) yv(i) = static_cast<int>(y[i].item<int64_t>());
  kdist::nn::SoftmaxCrossEntropy<float, Kokkos::HostSpace> ce;
  CHECK(std::abs(ce.forward(exec, kdist::nn::ConstTensor2<float, Kokkos::HostSpace>(out.data(), 4, 90), yv) -
                 loss.item<double>()) < 1e-5);
  ce.backward(exec, kdist::nn::Tensor2<float, Kokkos::HostSpace>(dout.data(), 4, 90));
  conv.backward(exec, dout);
  nn_kfac.step(exec, {conv.gradient()});

  for (int f = 0; f < 2; ++f) {
    INFO("factor " << f);
    CHECK(max_relative(values_of(kfac.preconditioner().factor(f)), values_of(nn_kfac.factor(f))) < 1e-5);
  }
  CHECK(max_relative(values(model->conv->weight.grad()), values_of(conv.gradient().weight)) < 1e-5);
  CHECK(max_relative(values(model->conv->bias.grad()), values_of(conv.gradient().bias)) < 1e-5);
}

// Every rank its own data, the gradients averaged (or the deltas combined by Adasum), K-FAC,
// SGD: after three steps the parameters are the same bits on every rank.
TEST_CASE("torch: K-FAC and gradient reduction keep the ranks bit-identical", "[torch]") {
  for (const auto reduce : {kdist::torch::Reduce::average, kdist::torch::Reduce::adasum}) {
    ::torch::manual_seed(11);  // the same initial weights everywhere
    auto model = std::make_shared<TwoLayers>();
    const kdist::comm::Communicator world(MPI_COMM_WORLD);
    kdist::comm::Engine grads(world), kfac_engine(world);
    kdist::torch::GradientReducer reducer(*model, grads, reduce);
    kdist::torch::KFAC kfac(*model, kfac_engine, options());
    ::torch::optim::SGD sgd(model->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < 3; ++step) {
      sgd.zero_grad();
      ::torch::nn::functional::cross_entropy(model->forward(&kfac, batch(step, world_rank())),
                                             labels(step, world_rank()))
          .backward();
      if (reduce == kdist::torch::Reduce::average) {
        reducer.allreduce();
        kfac.step();
        sgd.step();
      } else {
        reducer.step([&] {
          kfac.step();
          sgd.step();
        });
      }
    }
    std::vector<float> mine;
    for (const auto& p : model->parameters()) {
      const auto v = values(p);
      mine.insert(mine.end(), v.begin(), v.end());
    }
    CHECK(kdist_test::same_on_every_rank(mine));
    CHECK(std::isfinite(mine[0]));
  }
}

// The last rank passes something kdist cannot take; it names it, and every other rank hears it
// at its next wait instead of hanging.
TEST_CASE("torch: bad input is refused on every rank", "[torch][leaks-comm]") {
  const bool bad = world_rank() == world_size() - 1;
  const std::string who = "rank " + std::to_string(world_size() - 1);
  const auto run = [&](const std::function<at::Tensor(TwoLayers&, kdist::torch::KFAC&)>& bad_forward) {
    ::torch::manual_seed(3);
    auto model = std::make_shared<TwoLayers>();
    kdist::comm::Engine engine{kdist::comm::Communicator(MPI_COMM_WORLD)};
    kdist::torch::KFAC kfac(*model, engine, options());
    const at::Tensor out = bad ? bad_forward(*model, kfac) : model->forward(&kfac, batch(0, world_rank()));
    ::torch::nn::functional::cross_entropy(out, labels(0, world_rank())).backward();
    kfac.step();
  };
  SECTION("a module kind K-FAC does not know") {
    ::torch::nn::BatchNorm1d norm(6);
    const auto f = [&](TwoLayers&, kdist::torch::KFAC& kfac) { return kfac.forward(*norm, batch(0, 0)); };
    CHECK_THROWS_WITH(run(f), Catch::Contains("BatchNorm1d") && Catch::Contains("not a kind of layer K-FAC knows") &&
                                  Catch::Contains(who));
  }
  SECTION("a non-contiguous input") {
    const auto f = [](TwoLayers& m, kdist::torch::KFAC& kfac) {
      return kfac.forward(m.fc2, kfac.forward(m.fc1, ::torch::randn({6, 8}).t()));
    };
    CHECK_THROWS_WITH(run(f), Catch::Contains("fc1 input: not contiguous") && Catch::Contains(who));
  }
  SECTION("a tensor of another dtype") {
    const auto f = [](TwoLayers& m, kdist::torch::KFAC& kfac) {
      m.to(::torch::kFloat64);
      return kfac.forward(m.fc2, kfac.forward(m.fc1, batch(0, 0).to(::torch::kFloat64)));
    };
    CHECK_THROWS_WITH(run(f), Catch::Contains("fc1 input: not Float") && Catch::Contains(who));
  }
  SECTION("a layer whose own weights are of another dtype, its input float32") {
    const auto f = [](TwoLayers& m, kdist::torch::KFAC& kfac) {
      m.fc2->to(::torch::kFloat64);
      return kfac.forward(m.fc2, kfac.forward(m.fc1, batch(0, 0)));
    };
    CHECK_THROWS_WITH(run(f), Catch::Contains("fc2.weight: not Float") && Catch::Contains(who));
  }
}

TEST_CASE("torch: the averaging reducer leaves every gradient the mean over the ranks", "[torch]") {
  auto model = std::make_shared<TwoLayers>();
  kdist::comm::Engine engine{kdist::comm::Communicator(MPI_COMM_WORLD)};
  kdist::torch::GradientReducer reducer(*model, engine);
  // Rank r's gradient element i is (r + 1) * (i + 1): the mean is (P + 1) / 2 * (i + 1).
  for (auto& p : model->parameters())
    p.mutable_grad() = ::torch::arange(1, p.numel() + 1, ::torch::kFloat32).reshape(p.sizes()) * (world_rank() + 1);
  reducer.allreduce();
  for (const auto& p : model->parameters()) {
    const auto got = values(p.grad());
    for (std::size_t i = 0; i < got.size(); ++i)
      CHECK(got[i] == Approx((world_size() + 1) / 2.0 * static_cast<double>(i + 1)).epsilon(1e-6));
  }
}

// After the first allreduce() the gradients lie in one bucket, the fusion buffer: backward adds
// into it, zero_grad keeps it, and a gradient set to none is reduced and put back there.
TEST_CASE("torch: the averaging reducer keeps the gradients in one bucket and reduces them there", "[torch]") {
  auto model = std::make_shared<TwoLayers>();
  kdist::comm::Engine engine{kdist::comm::Communicator(MPI_COMM_WORLD)};
  kdist::torch::GradientReducer reducer(*model, engine);
  ::torch::optim::SGD sgd(model->parameters(), ::torch::optim::SGDOptions(0.1));
  const auto params = model->parameters();
  const float* bucket = nullptr;
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    if (step == 2)
      model->zero_grad(/*set_to_none=*/true);
    else
      sgd.zero_grad();
    ::torch::nn::functional::cross_entropy(model->forward(nullptr, batch(step, world_rank())),
                                           labels(step, world_rank()))
        .backward();
    std::vector<std::vector<float>> want;  // each gradient's mean, through MPI from a copy
    for (const auto& p : params) {
      want.push_back(values(p.grad()));
      auto& v = want.back();
      MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      for (float& x : v) x /= static_cast<float>(world_size());
    }
    std::int64_t elements = 0;
    for (const auto& p : params) elements += p.numel();
    const void* at = step == 0 ? nullptr : bucket;  // the bucket exists from the first allreduce()
    kdist_test::DeepCopiesTouching copies(at, at ? static_cast<std::size_t>(elements) * sizeof(float) : 0);
    reducer.allreduce();
    if (step == 0) bucket = params[0].grad().data_ptr<float>();
    // Steps 1 and 3 add into the bucket (zero_grad in place): nothing is copied in or out. Step 2
    // starts from gradients set to none: each is copied in and its result out, then put back.
    if (step > 0) CHECK(copies.count() == (step == 2 ? 2 * static_cast<int>(params.size()) : 0));
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      CHECK(params[i].grad().data_ptr<float>() == bucket + offset);
      CHECK(params[i].grad().sizes() == params[i].sizes());
      CHECK(max_relative(values(params[i].grad()), want[i]) <= 1e-6);
      offset += params[i].numel();
    }
    sgd.step();
  }
}

// torch::load gives every parameter new storage (Tensor::set_): Adasum's delta step must move the
// parameters the model now has, not the storage they had when the reducer was built.
TEST_CASE("torch: the Adasum reducer follows parameters that torch::load re-homed", "[torch]") {
  ::torch::manual_seed(5);
  auto model = std::make_shared<TwoLayers>();
  kdist::comm::Engine engine{kdist::comm::Communicator(MPI_COMM_WORLD)};
  kdist::torch::GradientReducer reducer(*model, engine, kdist::torch::Reduce::adasum);
  const std::string path = "test_torch_reload_" + std::to_string(world_rank()) + ".pt";
  ::torch::save(model, path);
  const void* before = model->fc1->weight.data_ptr();
  ::torch::load(model, path);
  std::remove(path.c_str());
  REQUIRE(model->fc1->weight.data_ptr() != before);  // what the test is about
  const auto start = values(model->fc1->weight);
  ::torch::nn::functional::cross_entropy(model->forward(nullptr, batch(0, world_rank())), labels(0, world_rank()))
      .backward();
  ::torch::optim::SGD sgd(model->parameters(), ::torch::optim::SGDOptions(0.1));
  reducer.step([&] { sgd.step(); });
  // Every rank holds the same parameters, moved from where they started.
  const auto mine = values(model->fc1->weight);
  CHECK(mine != start);
  CHECK(kdist_test::same_on_every_rank(mine));
}
