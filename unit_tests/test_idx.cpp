// nn/idx: IDX files written here (gzip through zlib, and plain) read back exactly; every malformed
// file is rejected with its name and the decompressed byte offset; load_fashion_mnist on a small
// synthetic set and, where the Debian package is installed, on the real one.
#include <catch2/catch.hpp>
#include <kdist/nn/idx.hpp>

#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using kdist::nn::IdxError;

namespace {

/// A fresh directory under the system's temporary directory, removed with its contents.
struct ScratchDir {
  fs::path path;
  ScratchDir() {
    path = fs::temp_directory_path() / ("kdist_test_idx." + std::to_string(static_cast<long long>(::getpid())));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

using Bytes = std::vector<std::uint8_t>;

/// The IDX encoding: 0x00 0x00 type ndims, big-endian dims, data.
Bytes idx_bytes(const std::vector<std::uint32_t>& dims, const Bytes& data, std::uint8_t type = 0x08) {
  Bytes out{0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(d >> shift));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_plain(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

Bytes read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Random bytes: deflate cannot shrink them, so a cut compressed file loses data, not just padding.
Bytes noise(std::size_t n, unsigned seed = 7) {
  std::mt19937 gen(seed);
  Bytes out(n);
  for (auto& b : out) b = static_cast<std::uint8_t>(gen());
  return out;
}

/// read_idx(path) throws IdxError at `offset`, its message naming the file, the offset and `text`.
void check_rejected(const std::string& path, std::uint64_t offset, const std::string& text) {
  try {
    kdist::nn::read_idx(path);
    FAIL("read_idx accepted " << path);
  } catch (const IdxError& e) {
    INFO(e.what());
    CHECK(e.path() == path);
    CHECK(e.offset() == offset);
    CHECK_THAT(e.what(), Catch::Contains("'" + path + "'") && Catch::Contains(text) &&
                             Catch::Contains("byte offset " + std::to_string(offset) + " "));
  }
}

}  // namespace

TEST_CASE("read_idx reads a gzip IDX file back exactly", "[nn][idx]") {
  ScratchDir dir;
  const Bytes data = noise(3 * 4 * 5);
  write_gz(dir.file("a.idx.gz"), idx_bytes({3, 4, 5}, data));
  const kdist::nn::IdxArray a = kdist::nn::read_idx(dir.file("a.idx.gz"));
  CHECK(a.dims == std::vector<std::uint32_t>{3, 4, 5});
  CHECK(a.data == data);
}

TEST_CASE("read_idx reads an uncompressed IDX file, and an empty one", "[nn][idx]") {
  ScratchDir dir;
  const Bytes data = noise(70000);  // dims above 2^16 exercise all four big-endian bytes
  write_plain(dir.file("b.idx"), idx_bytes({70000}, data));
  const kdist::nn::IdxArray b = kdist::nn::read_idx(dir.file("b.idx"));
  CHECK(b.dims == std::vector<std::uint32_t>{70000});
  CHECK(b.data == data);
  write_plain(dir.file("empty.idx"), idx_bytes({0, 28}, {}));
  const kdist::nn::IdxArray e = kdist::nn::read_idx(dir.file("empty.idx"));
  CHECK(e.dims == std::vector<std::uint32_t>{0, 28});
  CHECK(e.data.empty());
}

TEST_CASE("read_idx rejects a truncated header with the file and the offset", "[nn][idx]") {
  ScratchDir dir;
  const Bytes full = idx_bytes({2, 3, 4}, noise(24));
  for (const bool gz : {false, true}) {
    const std::string magic = dir.file(gz ? "magic.gz" : "magic"), dims = dir.file(gz ? "dims.gz" : "dims");
    const Bytes cut_magic(full.begin(), full.begin() + 2), cut_dims(full.begin(), full.begin() + 10);
    gz ? write_gz(magic, cut_magic) : write_plain(magic, cut_magic);
    gz ? write_gz(dims, cut_dims) : write_plain(dims, cut_dims);
    check_rejected(magic, 2, "truncated header (magic): needs 4 bytes from offset 0");
    check_rejected(dims, 10, "truncated header (dimensions): needs 12 bytes from offset 4");
  }
}

TEST_CASE("read_idx rejects truncated data with the file and the offset", "[nn][idx]") {
  ScratchDir dir;
  const Bytes full = idx_bytes({2, 3, 4}, noise(24));
  const Bytes cut(full.begin(), full.end() - 4);  // 16-byte header + 20 of the 24 data bytes
  write_plain(dir.file("data"), cut);
  write_gz(dir.file("data.gz"), cut);
  for (const char* name : {"data", "data.gz"})
    check_rejected(dir.file(name), 36, "truncated data: dimensions 2 x 3 x 4 need 24 bytes from offset 16");
}

TEST_CASE("read_idx rejects a wrong magic, another element type and trailing bytes", "[nn][idx]") {
  ScratchDir dir;
  Bytes bad = idx_bytes({4}, noise(4));
  bad[0] = 0x1F;
  write_gz(dir.file("magic.gz"), bad);
  check_rejected(dir.file("magic.gz"), 0, "wrong magic 0x1F 0x00 0x08 0x01");
  write_plain(dir.file("type"), idx_bytes({4}, Bytes(16), 0x0D));
  check_rejected(dir.file("type"), 2, "unsupported element type 0x0D (float32)");
  Bytes extra = idx_bytes({4}, noise(4));
  extra.push_back(0);
  write_plain(dir.file("extra"), extra);
  check_rejected(dir.file("extra"), 12, "trailing bytes after the data");
}

TEST_CASE("read_idx rejects a cut or corrupt gzip stream", "[nn][idx]") {
  ScratchDir dir;
  const Bytes data = noise(100000);
  write_gz(dir.file("whole.gz"), idx_bytes({100000}, data));
  const Bytes gz = read_plain(dir.file("whole.gz"));
  SECTION("cut in the middle: the offset is where decompression stopped") {
    write_plain(dir.file("cut.gz"), Bytes(gz.begin(), gz.begin() + gz.size() / 2));
    try {
      kdist::nn::read_idx(dir.file("cut.gz"));
      FAIL("accepted a cut gzip stream");
    } catch (const IdxError& e) {
      INFO(e.what());
      CHECK(e.offset() > 8 + 40000);  // incompressible data: about half of it decompressed
      CHECK(e.offset() < 8 + 60000);
      CHECK_THAT(e.what(), Catch::Contains("truncated data") && Catch::Contains("gzip stream cut short"));
    }
  }
  SECTION("only the CRC and length trailer cut: all data delivered, the stream still fails") {
    write_plain(dir.file("trailer.gz"), Bytes(gz.begin(), gz.end() - 8));
    check_rejected(dir.file("trailer.gz"), 8 + 100000, "the gzip stream ends early after the data");
  }
  SECTION("an invalid deflate block at the start") {
    Bytes bad = gz;
    bad[10] = 0xFF;  // the first byte after gzopen's 10-byte header: block type 3 is reserved
    write_plain(dir.file("block.gz"), bad);
    check_rejected(dir.file("block.gz"), 0, "corrupt gzip stream (zlib: invalid block type)");
  }
  SECTION("a flipped data byte: the CRC check fails") {
    Bytes bad = gz;
    bad[gz.size() / 2] ^= 0x01;
    write_plain(dir.file("crc.gz"), bad);
    try {
      kdist::nn::read_idx(dir.file("crc.gz"));
      FAIL("accepted a gzip stream with a wrong CRC");
    } catch (const IdxError& e) {
      INFO(e.what());
      CHECK(e.offset() <= 8 + 100000);
      CHECK_THAT(e.what(), Catch::Contains(dir.file("crc.gz")) && Catch::Contains("incorrect data check") &&
                               Catch::Contains("byte offset " + std::to_string(e.offset())));
    }
  }
}

TEST_CASE("read_idx names a missing file", "[nn][idx]") {
  const std::string path = "/nonexistent-kdist-dir/x.idx.gz";
  REQUIRE_THROWS_AS(kdist::nn::read_idx(path), IdxError);
  REQUIRE_THROWS_WITH(kdist::nn::read_idx(path), Catch::Contains(path) && Catch::Contains("No such file"));
}

// ---- load_fashion_mnist -----------------------------------------------------------------------

namespace {
/// A tiny data set in Fashion-MNIST's layout: `count` 2x3 images whose pixels are i + j.
void write_split(const ScratchDir& dir, const std::string& prefix, std::uint32_t count, std::uint32_t labels) {
  Bytes pixels, classes;
  for (std::uint32_t i = 0; i < count; ++i) {
    for (std::uint32_t j = 0; j < 6; ++j) pixels.push_back(static_cast<std::uint8_t>(i == 0 ? 255 * (j % 2) : i + j));
    classes.push_back(static_cast<std::uint8_t>(i % 10));
  }
  classes.resize(labels, 3);
  write_gz(dir.file(prefix + "-images-idx3-ubyte.gz"), idx_bytes({count, 2, 3}, pixels));
  write_plain(dir.file(prefix + "-labels-idx1-ubyte"), idx_bytes({labels}, classes));  // uncompressed works too
}
}  // namespace

TEST_CASE("load_fashion_mnist normalises pixels and keeps labels", "[nn][idx]") {
  ScratchDir dir;
  write_split(dir, "train", 12, 12);
  write_split(dir, "t10k", 3, 3);
  const kdist::nn::FashionMnist d = kdist::nn::load_fashion_mnist(dir.path.string());
  REQUIRE(d.train.count == 12);
  REQUIRE(d.test.count == 3);
  CHECK(d.train.rows == 2);
  CHECK(d.train.cols == 3);
  CHECK(d.train.images.size() == 12 * 6);
  CHECK(d.train.labels[11] == 1);
  const float black = (0.0f - 0.2860f) / 0.3530f, white = (1.0f - 0.2860f) / 0.3530f;
  CHECK(d.train.images[0] == Approx(black));
  CHECK(d.train.images[1] == Approx(white));
  CHECK(d.test.images[2 * 6 + 5] == Approx((7.0f / 255.0f - 0.2860f) / 0.3530f));  // sample 2, pixel 5
}

namespace {
/// What load_fashion_mnist(dir) throws as DatasetNotFound ("" if it does not).
std::string not_found_message(const std::string& dir) {
  try {
    kdist::nn::load_fashion_mnist(dir);
  } catch (const kdist::nn::DatasetNotFound& e) {
    return e.what();
  }
  return "";
}

void check_install_hint(const std::string& message) {
  INFO(message);
  CHECK_THAT(message, Catch::Contains("sudo apt-get install dataset-fashion-mnist"));
  CHECK_THAT(message, Catch::Contains("/usr/share/datasets/fashion-mnist"));
  CHECK_THAT(message, Catch::Contains("--data DIR"));
}
}  // namespace

TEST_CASE("load_fashion_mnist: missing data says how to install it; counts must agree", "[nn][idx]") {
  const std::string no_dir = not_found_message("/nonexistent-kdist-dir");
  CHECK_THAT(no_dir, Catch::Contains("no directory '/nonexistent-kdist-dir'"));
  check_install_hint(no_dir);
  ScratchDir dir;
  write_split(dir, "train", 4, 4);
  const std::string no_file = not_found_message(dir.path.string());
  CHECK_THAT(no_file, Catch::Contains(dir.file("t10k-images-idx3-ubyte.gz") + "' is missing"));
  check_install_hint(no_file);
  write_split(dir, "t10k", 4, 5);
  REQUIRE_THROWS_WITH(kdist::nn::load_fashion_mnist(dir.path.string()), Catch::Contains("4 images but 5 labels"));
}

// ---- the real data set ------------------------------------------------------------------------

namespace {
// Known values, read once from the Debian package's files with zcat | od and a Python one-off.
constexpr std::array<int, 20> kTrainFirstLabels{9, 0, 0, 3, 0, 2, 7, 2, 5, 5, 0, 9, 5, 5, 7, 9, 1, 0, 6, 4};
constexpr std::array<int, 20> kTestFirstLabels{9, 2, 1, 1, 6, 1, 4, 6, 5, 7, 4, 5, 7, 3, 4, 1, 2, 4, 8, 0};
constexpr std::array<int, 5> kTrainLastLabels{5, 1, 3, 0, 5};
constexpr std::array<int, 5> kTestLastLabels{9, 1, 8, 1, 5};
constexpr int kTestFirstImagePixelSum = 33456;

void check_labels(const std::vector<int>& labels, const std::array<int, 20>& first, const std::array<int, 5>& last) {
  CHECK(std::vector<int>(labels.begin(), labels.begin() + 20) == std::vector<int>(first.begin(), first.end()));
  CHECK(std::vector<int>(labels.end() - 5, labels.end()) == std::vector<int>(last.begin(), last.end()));
}
}  // namespace

TEST_CASE("the installed Fashion-MNIST: 60000/10000 28x28 images, labels as known", "[nn][idx][dataset]") {
  const std::string dir = kdist::nn::kFashionMnistDefaultDir;
  if (!fs::is_directory(dir)) {
    WARN("SKIPPED: " << dir << " is missing (sudo apt-get install dataset-fashion-mnist)");
    return;
  }
  const kdist::nn::FashionMnist d = kdist::nn::load_fashion_mnist(dir);
  CHECK(d.train.count == 60000);
  CHECK(d.test.count == 10000);
  CHECK((d.train.rows == 28 && d.train.cols == 28 && d.test.rows == 28 && d.test.cols == 28));
  REQUIRE(d.train.images.size() == 60000u * 784u);
  REQUIRE(d.test.images.size() == 10000u * 784u);
  std::array<int, 10> per_class{};
  for (int l : d.train.labels) per_class.at(static_cast<std::size_t>(l))++;  // at(): a label outside 0..9 throws
  for (int n : per_class) CHECK(n == 6000);
  check_labels(d.train.labels, kTrainFirstLabels, kTrainLastLabels);
  check_labels(d.test.labels, kTestFirstLabels, kTestLastLabels);
  // Undo the normalisation of the first test image: its raw pixels sum to the known value.
  double sum = 0;
  for (int j = 0; j < 784; ++j) sum += (d.test.images[j] * 0.3530 + 0.2860) * 255.0;
  CHECK(std::lround(sum) == kTestFirstImagePixelSum);
  // The stated mean and std are the training set's: normalised, it has mean ~0 and std ~1.
  double s = 0, s2 = 0;
  for (float x : d.train.images) s += x, s2 += double(x) * x;
  const double n = static_cast<double>(d.train.images.size()), mean = s / n;
  CHECK(std::abs(mean) < 1e-3);
  CHECK(std::sqrt(s2 / n - mean * mean) == Approx(1.0).epsilon(1e-3));
}
