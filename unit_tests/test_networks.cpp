// Layer lists of the scale model's networks (perf/model/networks.hpp), checked against the published
// parameter counts: torchvision's resnet50 / resnet152 / densenet201 and Cadene's pretrainedmodels
// inceptionv4 (the totals their model summaries print). Those totals include the BatchNorm weight
// and bias (2 per channel; running statistics are buffers, not parameters), which the K-FAC list
// leaves out, so the test derives the BatchNorm parameters from the list and the known placement of
// every BatchNorm, and checks conv + linear weights == total - BatchNorm exactly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/networks.hpp"

using kdist_perf::LayerShape;
using kdist_perf::network_layers;

namespace {

long long weight_sum(const std::vector<LayerShape>& layers) {
  long long sum = 0;
  for (const auto& l : layers) sum += l.weights();
  return sum;
}

// ResNet (BasicConv2d-style conv -> bn in every bottleneck and downsample) and Inception-v4
// (BasicConv2d = conv + BatchNorm2d(out)): one BatchNorm of c_out channels after every conv.
long long post_activation_bn(const std::vector<LayerShape>& layers) {
  long long sum = 0;
  for (const auto& l : layers)
    if (!l.dense) sum += 2LL * l.c_out;
  return sum;
}

// DenseNet is pre-activation: norm0 after conv0 (its c_out); every later conv reads through a
// BatchNorm of its input (denselayer norm1 / norm2, transition norm), i.e. of its c_in; norm5 sits
// before the classifier (its c_in).
long long densenet_bn(const std::vector<LayerShape>& layers) {
  long long sum = 2LL * layers.front().c_out;
  for (std::size_t i = 1; i < layers.size(); ++i) sum += 2LL * layers[i].c_in;
  return sum;
}

const LayerShape& find(const std::vector<LayerShape>& layers, const std::string& label) {
  for (const auto& l : layers)
    if (l.label == label) return l;
  FAIL("no layer " << label);
  throw std::logic_error("unreachable");
}

std::string what_of(const std::string& name, int width, int side) {
  try {
    network_layers(name, width, side);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("network weights equal the published totals minus BatchNorm", "[networks]") {
  const auto r50 = network_layers("resnet50");
  CHECK(weight_sum(r50) == 25557032 - post_activation_bn(r50));
  const auto r152 = network_layers("resnet152");
  CHECK(weight_sum(r152) == 60192808 - post_activation_bn(r152));
  const auto d201 = network_layers("densenet201");
  CHECK(weight_sum(d201) == 20013928 - densenet_bn(d201));
  const auto inc = network_layers("inception_v4", 1, 299);
  CHECK(weight_sum(inc) == 42679816 - post_activation_bn(inc));
}

TEST_CASE("network layer counts and kinds", "[networks]") {
  // DenseNet-201: conv0 + 2 x (6 + 12 + 48 + 32) dense-layer convs + 3 transitions + classifier = 201.
  // Inception-v4: stem 3 + Mixed_3a 1 + Mixed_4a 6 + Mixed_5a 1, Inception-A 7 x 4, Reduction-A 4,
  // Inception-B 10 x 7, Reduction-B 6, Inception-C 10 x 3, last_linear 1 = 150.
  const std::vector<std::pair<std::string, std::size_t>> counts = {
      {"resnet50", 54}, {"resnet152", 156}, {"densenet201", 201}, {"inception_v4", 150}};
  REQUIRE(kdist_perf::network_names().size() == counts.size());
  for (const auto& [name, count] : counts) {
    INFO(name);
    const auto layers = network_layers(name);
    CHECK(layers.size() == count);
    std::set<std::string> labels;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const bool last = i + 1 == layers.size();
      CHECK(layers[i].dense == last);  // only the classifier is a Linear
      CHECK(layers[i].bias == last);
      CHECK(layers[i].g_dim() == layers[i].c_out);
      labels.insert(layers[i].label);
    }
    CHECK(labels.size() == layers.size());
    CHECK(layers.front().c_in == 3);
    CHECK(layers.back().c_out == 1000);
  }
}

TEST_CASE("resnet50 shapes at 224", "[networks]") {
  const auto l = network_layers("resnet50");
  CHECK(l[0].label == "conv1");
  CHECK(l[0].in_h == 224);
  CHECK(l[0].out_h() == 112);
  CHECK(l[0].out_w() == 112);
  // After the max pool: layer1 at 56; conv1, conv2, conv3, downsample in that order.
  CHECK(l[1].label == "layer1.0.conv1");
  CHECK(l[1].in_h == 56);
  CHECK(l[2].label == "layer1.0.conv2");
  CHECK(l[3].label == "layer1.0.conv3");
  CHECK(l[4].label == "layer1.0.downsample");
  CHECK(l[4].c_in == 64);
  CHECK(l[4].c_out == 256);
  // v1.5: the stride is on the 3x3 conv, and on the downsample.
  const auto& c2 = find(l, "layer2.0.conv2");
  CHECK(c2.stride == 2);
  CHECK(c2.in_h == 56);
  CHECK(c2.out_h() == 28);
  CHECK(find(l, "layer2.0.conv1").stride == 1);
  CHECK(find(l, "layer2.0.downsample").stride == 2);
  CHECK(find(l, "layer2.0.downsample").out_h() == 28);
  for (const auto& layer : l)
    if (layer.label.rfind("layer4.", 0) == 0 && layer.label != "layer4.0.conv1" && layer.label != "layer4.0.conv2" &&
        layer.label != "layer4.0.downsample")
      CHECK(layer.in_h == 7);
  CHECK(find(l, "layer4.2.conv3").out_h() == 7);
  const auto& fc = l.back();
  CHECK(fc.label == "fc");
  CHECK(fc.c_in == 2048);
  CHECK(fc.a_dim() == 2049);
  CHECK(fc.weights() == 2048LL * 1000 + 1000);
  int largest = 0;
  for (const auto& layer : l) largest = std::max(largest, layer.a_dim());
  CHECK(largest == 512 * 9);
  CHECK(l[0].macs(2) == 2LL * 112 * 112 * 64 * 3 * 49);
}

TEST_CASE("resnet152 and densenet201 structure", "[networks]") {
  const auto r = network_layers("resnet152");
  CHECK(find(r, "layer3.35.conv3").c_out == 1024);
  CHECK(find(r, "layer3.35.conv3").in_h == 14);
  const auto d = network_layers("densenet201");
  CHECK(d[0].label == "features.conv0");
  CHECK(d[0].out_h() == 112);
  const auto& first = find(d, "features.denseblock1.denselayer1.conv1");
  CHECK(first.c_in == 64);
  CHECK(first.c_out == 128);
  CHECK(first.in_h == 56);
  const auto& grow = find(d, "features.denseblock1.denselayer1.conv2");
  CHECK(grow.k_h == 3);
  CHECK(grow.pad_h == 1);
  CHECK(grow.c_out == 32);
  CHECK(find(d, "features.denseblock1.denselayer6.conv1").c_in == 64 + 5 * 32);
  CHECK(find(d, "features.transition1.conv").c_in == 256);
  CHECK(find(d, "features.transition1.conv").c_out == 128);
  CHECK(find(d, "features.denseblock2.denselayer1.conv1").in_h == 28);
  CHECK(find(d, "features.transition3.conv").c_in == 1792);
  CHECK(find(d, "features.denseblock4.denselayer1.conv1").c_in == 896);
  CHECK(find(d, "features.denseblock4.denselayer32.conv2").in_h == 7);
  CHECK(d.back().label == "classifier");
  CHECK(d.back().c_in == 1920);
}

TEST_CASE("inception_v4 sizes at 299 and 224", "[networks]") {
  const auto l = network_layers("inception_v4", 1, 299);
  CHECK(l[0].out_h() == 149);
  CHECK(find(l, "features.3.conv.conv").in_h == 147);
  CHECK(find(l, "features.4.branch0.0.conv").c_in == 160);
  CHECK(find(l, "features.4.branch0.0.conv").in_h == 73);
  const auto& k17 = find(l, "features.4.branch1.1.conv");
  CHECK(k17.k_h == 1);
  CHECK(k17.k_w == 7);
  CHECK(k17.pad_w == 3);
  CHECK(find(l, "features.5.conv.conv").c_in == 192);
  CHECK(find(l, "features.6.branch0.conv").c_in == 384);
  CHECK(find(l, "features.6.branch0.conv").in_h == 35);
  CHECK(find(l, "features.11.branch0.conv").c_in == 1024);
  CHECK(find(l, "features.11.branch0.conv").in_h == 17);
  CHECK(find(l, "features.19.branch0.conv").c_in == 1536);
  CHECK(find(l, "features.19.branch0.conv").in_h == 8);
  const auto& k31 = find(l, "features.21.branch2_3b.conv");
  CHECK(k31.k_h == 3);
  CHECK(k31.pad_h == 1);
  CHECK(k31.c_in == 512);
  CHECK(l.back().label == "last_linear");
  CHECK(l.back().c_in == 1536);
  // At 224 the same floor formulas give 111, 109, 54, 52, 25, 12, 5.
  const auto s = network_layers("inception_v4", 1, 224);
  CHECK(s[0].out_h() == 111);
  CHECK(find(s, "features.6.branch0.conv").in_h == 25);
  CHECK(find(s, "features.11.branch0.conv").in_h == 12);
  CHECK(find(s, "features.19.branch0.conv").in_h == 5);
  for (const auto& layer : s) CHECK(layer.out_h() >= 1);
}

TEST_CASE("network width divides channels but not image or classes", "[networks]") {
  const auto r = network_layers("resnet50", 4, 56);
  REQUIRE(r.size() == 54);
  CHECK(r[0].c_in == 3);
  CHECK(r[0].c_out == 16);
  CHECK(r[0].in_h == 56);
  CHECK(r[0].out_h() == 28);
  CHECK(r.back().c_in == 512);
  CHECK(r.back().c_out == 1000);
  const auto d = network_layers("densenet201", 2);
  REQUIRE(d.size() == 201);
  CHECK(find(d, "features.denseblock1.denselayer1.conv2").c_out == 16);
  CHECK(d.back().c_in == 960);
  const auto i = network_layers("inception_v4", 2, 299);
  CHECK(i.back().c_in == 768);
  // A huge width leaves one channel per conv, never zero.
  for (const auto& name : kdist_perf::network_names())
    for (const auto& layer : network_layers(name, 100000)) {
      CHECK(layer.c_in >= 1);
      CHECK(layer.c_out >= 1);
    }
}

TEST_CASE("network_layers rejects bad input", "[networks]") {
  const std::string unknown = what_of("vgg16", 1, 224);
  CHECK_THAT(unknown, Catch::Contains("vgg16") && Catch::Contains("resnet50") && Catch::Contains("inception_v4"));
  CHECK_THAT(what_of("resnet50", 0, 224), Catch::Contains("width 0"));
  CHECK_THAT(what_of("resnet50", 1, 0), Catch::Contains("side 0"));
  // DenseNet's transitions and Inception's valid convs and pools empty an 8x8 input; ResNet's
  // padded convs and pool keep at least 1x1 for any side >= 1, as in PyTorch.
  CHECK_THAT(what_of("densenet201", 1, 8), Catch::Contains("side 8") && Catch::Contains("densenet201"));
  CHECK_THAT(what_of("inception_v4", 1, 8), Catch::Contains("side 8") && Catch::Contains("inception_v4"));
  CHECK(network_layers("resnet50", 1, 8).back().c_in == 2048);
  CHECK_NOTHROW(network_layers("inception_v4", 1, 75));  // the smallest side Inception-v4 accepts
  CHECK_THROWS_AS(network_layers("inception_v4", 1, 74), std::invalid_argument);
}
