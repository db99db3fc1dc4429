// core/state_file: StateWriter / StateReader. Every field type and section dtype comes back
// exactly; the bytes follow the documented layout (checked against zlib's crc32 here); every
// refusal names the operation, the file, the field or section and a byte offset, and is
// kdist::Error for damage, kdist::InvalidArgument for a sound file that does not fit; a write
// leaves no temporary behind and a failed one leaves the old file as it was. Damage includes a
// header line that is not exactly "<length> <crc32>", a length past the end of the file (however
// large), and payload bytes that no section covers (a gap, an overlap, bytes appended after the
// last section); a field's offset is its key's inside "fields", even for a field named "kind".
#include <zlib.h>
#include <catch2/catch.hpp>
#include <kdist/core/atomic_file.hpp>
#include <kdist/core/error.hpp>
#include <kdist/core/state_file.hpp>

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

const std::string kOp = "kdist::test_state_file";
const std::string kMagic = "KDIST-STATE\n";

/// While alive, this thread meets file permissions like an unprivileged user: CAP_DAC_OVERRIDE
/// (root's) leaves its effective capabilities. It stays permitted, so the destructor restores it.
class WithoutDacOverride {
 public:
  WithoutDacOverride() {
    if (::syscall(SYS_capget, &header_, saved_) != 0) return;
    __user_cap_data_struct dropped[2] = {saved_[0], saved_[1]};
    dropped[0].effective &= ~(1u << CAP_DAC_OVERRIDE);
    dropped_ = ::syscall(SYS_capset, &header_, dropped) == 0;
  }
  ~WithoutDacOverride() {
    if (dropped_) ::syscall(SYS_capset, &header_, saved_);
  }
  WithoutDacOverride(const WithoutDacOverride&) = delete;
  WithoutDacOverride& operator=(const WithoutDacOverride&) = delete;

 private:
  __user_cap_header_struct header_{_LINUX_CAPABILITY_VERSION_3, 0};  // pid 0: this thread
  __user_cap_data_struct saved_[2]{};
  bool dropped_ = false;
};

/// Whether this thread can create a file in dir (access() would ask with the real uid's rights).
bool can_create_in(const std::string& dir) {
  const std::string probe = dir + "/probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY, 0644);
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

/// A fresh directory for this test process, removed (with everything in it) at the end.
struct Scratch {
  std::string dir = "kdist_test_state_file." + std::to_string(static_cast<long long>(::getpid()));
  Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    std::filesystem::create_directory(dir);
  }
  ~Scratch() {
    std::error_code ec;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir, ec))
      if (entry.is_directory(ec)) std::filesystem::permissions(entry.path(), std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(dir, ec);
  }
  std::string file(const std::string& name) const { return dir + "/" + name; }
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}
void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}
bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

unsigned long zlib_crc(const std::string& bytes) {
  const uLong crc = crc32(0L, Z_NULL, 0);
  return crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size()));
}
std::string crc_hex(const std::string& bytes) {
  char text[16];
  std::snprintf(text, sizeof text, "%08lx", zlib_crc(bytes));
  return text;
}
/// A state file built by hand: magic, "<length> <crc32>\n", the header, the payload.
std::string frame(const std::string& header, const std::string& payload = "") {
  return kMagic + std::to_string(header.size()) + " " + crc_hex(header) + "\n" + header + payload;
}

/// Where the header and the payload lie, read from the bytes (not from StateReader).
struct Layout {
  std::size_t header_first = 0, header_bytes = 0, payload_first = 0;
  std::string header;
};
Layout layout_of(const std::string& file) {
  REQUIRE(file.compare(0, kMagic.size(), kMagic) == 0);
  const std::size_t space = file.find(' ', kMagic.size()), eol = file.find('\n', kMagic.size());
  REQUIRE(space < eol);
  REQUIRE(eol != std::string::npos);
  Layout l;
  l.header_first = eol + 1;
  l.header_bytes = std::stoull(file.substr(kMagic.size(), space - kMagic.size()));
  l.payload_first = l.header_first + l.header_bytes;
  l.header = file.substr(l.header_first, l.header_bytes);
  REQUIRE(file.substr(space + 1, eol - space - 1) == crc_hex(l.header));
  return l;
}
/// Byte offset in a written file of field `name`'s key inside the "fields" object (the writer
/// puts it first: {"fields":{...},"kind":...,"sections":[...],"version":1}).
std::size_t field_at(const std::string& file, const std::string& name) {
  const Layout l = layout_of(file);
  const std::string open = "{\"fields\":{";
  REQUIRE(l.header.compare(0, open.size(), open) == 0);
  const std::size_t at = l.header.find("\"" + name + "\":", open.size());
  REQUIRE(at != std::string::npos);
  return l.header_first + at;
}
/// Byte offset in a written file of the header's own key `name` ("kind", "version"): after
/// "fields" in the writer's order, so the last of its spellings in the header.
std::size_t top_at(const std::string& file, const std::string& name) {
  const Layout l = layout_of(file);
  const std::size_t at = l.header.rfind("\"" + name + "\":");
  REQUIRE(at != std::string::npos);
  return l.header_first + at;
}
/// Byte offset of `needle`'s first occurrence in `file` (a key in a header framed by hand).
std::size_t at_of(const std::string& file, const std::string& needle) {
  const std::size_t at = file.find(needle);
  REQUIRE(at != std::string::npos);
  return at;
}
const std::string kDamaged = " (the file is damaged or not a kdist state file)";
/// One entry of a header's "sections" list; numbers as text so that a test can damage them.
std::string entry(const std::string& name, const std::string& dtype, const std::string& count,
                  const std::string& offset, const std::string& crc) {
  return R"({"name":")" + name + R"(","dtype":")" + dtype + R"(","count":)" + count + R"(,"offset":)" + offset +
         R"(,"crc32":)" + crc + "}";
}
/// A header framed by hand: the given fields and section entries, kind "sample", version 1.
std::string header_with(const std::string& sections, const std::string& fields = "{}") {
  return R"({"fields":)" + fields + R"(,"kind":"sample","sections":[)" + sections + R"(],"version":1})";
}
std::string byte(std::size_t at) {
  return "(byte " + std::to_string(at) + ")";
}
std::string bytes(std::size_t first, std::size_t count) {
  return "(bytes " + std::to_string(first) + ".." + std::to_string(first + count) + ")";
}

/// What a call threw: the most derived of InvalidArgument / Error, and its message.
struct Thrown {
  std::string type, what;
};
template <class F>
Thrown thrown_by(F&& f) {
  try {
    f();
  } catch (const kdist::InvalidArgument& e) {
    return {"InvalidArgument", e.what()};
  } catch (const kdist::Error& e) {
    return {"Error", e.what()};
  } catch (const std::exception& e) {
    return {"std::exception", e.what()};
  }
  return {"nothing", ""};
}
Thrown open_fails(const std::string& path, const std::string& kind = "sample") {
  return thrown_by([&] { kdist::StateReader reader(path, kind, kOp); });
}

const std::vector<float> kWeights = {1.5f,
                                     -0.0f,
                                     std::numeric_limits<float>::denorm_min(),
                                     std::numeric_limits<float>::max(),
                                     std::numeric_limits<float>::quiet_NaN(),
                                     -std::numeric_limits<float>::infinity()};
const std::vector<double> kGrads = {0.1, -1e-300, std::numeric_limits<double>::max(), 1.0 / 3.0};
const std::vector<long long> kDims = {3, -1, std::numeric_limits<long long>::min(),
                                      std::numeric_limits<long long>::max()};
const std::vector<std::string> kLabels = {"a", "", "b c", "\xc3\xbc \"q\" \\ \n"};
const std::string kName = "conv1 \"quoted\" \\ \xc3\xa9\n\t{}:,";
constexpr std::size_t kWeightBytes = 6 * sizeof(float), kGradBytes = 4 * sizeof(double);

/// Sections in this order: weights (6 float), empty (0 double), grads (4 double).
void fill(kdist::StateWriter& w) {
  w.set("n", 42LL);
  w.set("min", std::numeric_limits<long long>::min());
  w.set("max", std::numeric_limits<long long>::max());
  w.set("lr", 0.1);
  w.set("tiny", std::numeric_limits<double>::denorm_min());
  w.set("third", 1.0 / 3.0);
  w.set("negzero", -0.0);
  w.set("whole", 3.0);
  w.set_flag("on", true);
  w.set_flag("off", false);
  w.set("name", kName);
  w.set("blank", std::string());
  w.set("dims", kDims);
  w.set("no_dims", std::vector<long long>{});
  w.set("labels", kLabels);
  w.add("weights", kWeights.data(), kWeights.size());
  w.add("empty", kGrads.data(), 0);
  w.add("grads", kGrads.data(), kGrads.size());
}
/// Writes the sample to `path`; returns its bytes.
std::string write_sample(const std::string& path) {
  kdist::StateWriter w("sample");
  fill(w);
  w.write(path, kOp.c_str());
  return read_all(path);
}

}  // namespace

TEST_CASE("StateWriter/StateReader round-trip every field type and section exactly", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("round.state");
  kdist::StateWriter w("sample");
  fill(w);
  w.write(path, kOp.c_str());
  const std::string file = read_all(path);
  CHECK(file == w.encode());
  CHECK_FALSE(exists(kdist::impl::atomic_temporary_path(path)));

  kdist::StateReader r(path, "sample", kOp);
  CHECK(r.path() == path);
  CHECK(r.integer("n") == 42);
  CHECK(r.integer("min") == std::numeric_limits<long long>::min());
  CHECK(r.integer("max") == std::numeric_limits<long long>::max());
  CHECK(r.real("lr") == 0.1);
  CHECK(r.real("tiny") == std::numeric_limits<double>::denorm_min());
  CHECK(r.real("third") == 1.0 / 3.0);
  CHECK(r.real("negzero") == 0.0);
  CHECK(std::signbit(r.real("negzero")));
  CHECK(r.real("whole") == 3.0);
  CHECK(r.real("n") == 42.0);  // an integer reads as a real
  CHECK(r.flag("on") == true);
  CHECK(r.flag("off") == false);
  CHECK(r.text("name") == kName);
  CHECK(r.text("blank").empty());
  CHECK(r.integers("dims") == kDims);
  CHECK(r.integers("no_dims").empty());
  CHECK(r.texts("labels") == kLabels);

  for (const char* field : {"n", "min", "max", "lr", "tiny", "third", "negzero", "whole", "on", "off", "name", "blank",
                            "dims", "no_dims", "labels"})
    CHECK(r.has(field));
  CHECK_FALSE(r.has("absent"));
  CHECK_FALSE(r.has("weights"));  // a section is not a field
  CHECK(r.has_section("weights"));
  CHECK(r.has_section("empty"));
  CHECK(r.has_section("grads"));
  CHECK_FALSE(r.has_section("absent"));
  CHECK_FALSE(r.has_section("n"));  // a field is not a section

  std::vector<float> weights(kWeights.size(), 7.0f);
  r.read("weights", weights.data(), weights.size());
  CHECK(std::memcmp(weights.data(), kWeights.data(), kWeightBytes) == 0);  // NaN, -0 and -inf bit for bit
  std::vector<double> grads(kGrads.size(), 7.0);
  r.read("grads", grads.data(), grads.size());
  CHECK(grads == kGrads);
  double untouched = 7.0;
  r.read("empty", &untouched, 0);
  CHECK(untouched == 7.0);

  // A reader can be moved.
  kdist::StateReader moved(std::move(r));
  CHECK(moved.path() == path);
  CHECK(moved.integer("n") == 42);
  CHECK(moved.has_section("grads"));
}

TEST_CASE("a state file's bytes follow the documented layout", "[core][state_file]") {
  kdist::StateWriter w("sample");
  fill(w);
  const std::string file = w.encode();
  const Layout l = layout_of(file);  // also checks the header line's CRC against zlib's
  CHECK(file.size() == l.payload_first + kWeightBytes + kGradBytes);
  CHECK(std::memcmp(file.data() + l.payload_first, kWeights.data(), kWeightBytes) == 0);
  CHECK(std::memcmp(file.data() + l.payload_first + kWeightBytes, kGrads.data(), kGradBytes) == 0);

  const nlohmann::json header = nlohmann::json::parse(l.header);
  CHECK(header.at("kind") == "sample");
  CHECK(header.at("version") == 1);
  CHECK(header.at("fields").at("n") == 42);
  CHECK(header.at("fields").at("dims") == kDims);
  const nlohmann::json& sections = header.at("sections");
  REQUIRE(sections.size() == 3);
  const std::string weight_bytes = file.substr(l.payload_first, kWeightBytes);
  const std::string grad_bytes = file.substr(l.payload_first + kWeightBytes, kGradBytes);
  CHECK(
      sections[0] ==
      nlohmann::json(
          {{"name", "weights"}, {"dtype", "float32"}, {"count", 6}, {"offset", 0}, {"crc32", zlib_crc(weight_bytes)}}));
  CHECK(
      sections[1] ==
      nlohmann::json({{"name", "empty"}, {"dtype", "float64"}, {"count", 0}, {"offset", kWeightBytes}, {"crc32", 0}}));
  CHECK(sections[2] == nlohmann::json({{"name", "grads"},
                                       {"dtype", "float64"},
                                       {"count", 4},
                                       {"offset", kWeightBytes},
                                       {"crc32", zlib_crc(grad_bytes)}}));

  // A file framed by hand the same way reads back: the test's framing is the format.
  Scratch scratch;
  const std::string path = scratch.file("hand.state");
  const std::string payload = "abcd";
  const std::string hand_header = R"({"fields":{"x":5},"kind":"sample","sections":[{"name":"raw","dtype":"int32",)"
                                  R"("count":1,"offset":0,"crc32":)";
  write_all(path, frame(hand_header + std::to_string(zlib_crc(payload)) + R"(}],"version":1})", payload));
  kdist::StateReader r(path, "sample", kOp);
  CHECK(r.integer("x") == 5);
  std::int32_t raw = 0;
  r.read("raw", &raw, 1);
  CHECK(std::memcmp(&raw, "abcd", 4) == 0);

  // The checksum is the header's CRC, which covers each section's: another payload changes it.
  CHECK(r.checksum() == zlib_crc(hand_header + std::to_string(zlib_crc(payload)) + R"(}],"version":1})"));
  write_all(path, frame(hand_header + std::to_string(zlib_crc("abce")) + R"(}],"version":1})", "abce"));
  CHECK(kdist::StateReader(path, "sample", kOp).checksum() != r.checksum());
}

TEST_CASE("StateReader refuses a missing field or a field of another type", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("fields.state");
  const std::string file = write_sample(path);
  const Layout l = layout_of(file);
  const kdist::StateReader r(path, "sample", kOp);
  const std::string head = kOp + ": " + path + ": ";

  SECTION("a missing field: InvalidArgument naming the field and the header's byte") {
    const std::vector<Thrown> all = {thrown_by([&] { r.integer("absent"); }),  thrown_by([&] { r.real("absent"); }),
                                     thrown_by([&] { r.flag("absent"); }),     thrown_by([&] { r.text("absent"); }),
                                     thrown_by([&] { r.integers("absent"); }), thrown_by([&] { r.texts("absent"); })};
    for (const Thrown& t : all) {
      CHECK(t.type == "InvalidArgument");
      CHECK(t.what == head + "field 'absent' is missing (header at byte " + std::to_string(l.header_first) + ")");
    }
  }

  SECTION("a field of another type: InvalidArgument naming the field, its byte and what it holds") {
    const nlohmann::json fields = nlohmann::json::parse(l.header).at("fields");
    struct Case {
      Thrown thrown;
      std::string field, wanted;
    };
    const std::vector<Case> cases = {
        {thrown_by([&] { r.integer("lr"); }), "lr", "an integer"},
        {thrown_by([&] { r.integer("whole"); }), "whole", "an integer"},  // an integral real stays a real
        {thrown_by([&] { r.integer("on"); }), "on", "an integer"},
        {thrown_by([&] { r.integer("name"); }), "name", "an integer"},
        {thrown_by([&] { r.real("name"); }), "name", "a real"},
        {thrown_by([&] { r.real("dims"); }), "dims", "a real"},
        {thrown_by([&] { r.real("off"); }), "off", "a real"},
        {thrown_by([&] { r.flag("n"); }), "n", "a boolean"},
        {thrown_by([&] { r.flag("blank"); }), "blank", "a boolean"},
        {thrown_by([&] { r.text("n"); }), "n", "text"},
        {thrown_by([&] { r.text("labels"); }), "labels", "text"},
        {thrown_by([&] { r.integers("n"); }), "n", "a list of integers"},
        {thrown_by([&] { r.integers("name"); }), "name", "a list of integers"},
        {thrown_by([&] { r.texts("name"); }), "name", "a list of text"},
        {thrown_by([&] { r.texts("lr"); }), "lr", "a list of text"},
    };
    for (const Case& c : cases) {
      INFO(c.thrown.what);
      CHECK(c.thrown.type == "InvalidArgument");
      CHECK(c.thrown.what == head + "field '" + c.field + "' " + byte(field_at(file, c.field)) + " is " +
                                 fields.at(c.field).dump() + ", not " + c.wanted);
    }
    // The offsets above are the keys' own: each differs, and each names its field.
    CHECK(file.compare(field_at(file, "lr"), 5, "\"lr\":") == 0);
    CHECK(field_at(file, "n") != field_at(file, "name"));
  }

  SECTION("a list of the other element type: InvalidArgument naming the field, its byte and the element") {
    Thrown t = thrown_by([&] { r.integers("labels"); });
    CHECK(t.type == "InvalidArgument");
    CHECK(t.what == head + "field 'labels' " + byte(field_at(file, "labels")) + " holds \"a\", not an integer");
    t = thrown_by([&] { r.texts("dims"); });
    CHECK(t.type == "InvalidArgument");
    CHECK(t.what == head + "field 'dims' " + byte(field_at(file, "dims")) + " holds 3, not text");
  }
}

TEST_CASE("StateReader refuses an integer that a long long does not hold", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("big.state");
  const std::string file =
      frame(header_with("", R"({"big":9223372036854775808,"list":[1,18446744073709551615],"ok":9223372036854775807,)"
                            R"("low":-9223372036854775808})"));
  write_all(path, file);
  const kdist::StateReader r(path, "sample", kOp);
  const std::string head = kOp + ": " + path + ": ";
  CHECK(r.integer("ok") == std::numeric_limits<long long>::max());
  CHECK(r.integer("low") == std::numeric_limits<long long>::min());
  CHECK(r.real("big") == 9223372036854775808.0);  // a real holds it

  Thrown t = thrown_by([&] { r.integer("big"); });  // not wrapped round to -2^63
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what == head + "field 'big' " + byte(at_of(file, "\"big\":")) + " is 9223372036854775808, not an integer");
  t = thrown_by([&] { r.integers("list"); });  // not wrapped round to -1
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what ==
        head + "field 'list' " + byte(at_of(file, "\"list\":")) + " holds 18446744073709551615, not an integer");
}

TEST_CASE("StateReader refuses a missing section or one of another dtype or count", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("sections.state");
  const std::string file = write_sample(path);
  const std::size_t weights_at = file.size() - kWeightBytes - kGradBytes, grads_at = file.size() - kGradBytes;
  const kdist::StateReader r(path, "sample", kOp);
  const std::string head = kOp + ": " + path + ": ";
  std::vector<double> d(8, 7.0);
  std::vector<float> f(8, 7.0f);

  const Layout l = layout_of(file);
  Thrown t = thrown_by([&] { r.read("absent", f.data(), 6); });
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what == head + "section 'absent' is missing (header " + bytes(l.header_first, l.header_bytes).substr(1));
  t = thrown_by([&] { r.read("n", f.data(), 1); });  // a field is not a section
  CHECK(t.type == "InvalidArgument");
  CHECK_THAT(t.what, Catch::StartsWith(head + "section 'n' is missing (header bytes "));

  t = thrown_by([&] { r.read("weights", d.data(), 6); });  // float32 section read as float64
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what == head + "section 'weights' " + byte(weights_at) + " holds 6 float32, this run needs 6 float64");

  t = thrown_by([&] { r.read("weights", f.data(), 5); });  // one element short
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what == head + "section 'weights' " + byte(weights_at) + " holds 6 float32, this run needs 5 float32");

  t = thrown_by([&] { r.read("weights", f.data(), 7); });
  CHECK(t.type == "InvalidArgument");
  CHECK_THAT(t.what, Catch::StartsWith(head + "section 'weights' " + byte(weights_at)));

  std::vector<std::int32_t> ints(8, 7);
  t = thrown_by([&] { r.read("grads", ints.data(), 8); });  // the same 32 bytes, another dtype
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what == head + "section 'grads' " + byte(grads_at) + " holds 4 float64, this run needs 8 int32");

  // A refused read writes nothing.
  CHECK(d == std::vector<double>(8, 7.0));
  CHECK(f == std::vector<float>(8, 7.0f));
  CHECK(ints == std::vector<std::int32_t>(8, 7));
}

TEST_CASE("StateWriter::add refuses a section name given twice", "[core][state_file]") {
  kdist::StateWriter w("sample");
  fill(w);
  const std::string before = w.encode();
  const Thrown t = thrown_by([&] { w.add("weights", kGrads.data(), 1); });
  CHECK(t.type == "InvalidArgument");
  CHECK_THAT(t.what, Catch::StartsWith("kdist::StateWriter::add: ") && Catch::Contains("'weights'"));
  CHECK(thrown_by([&] { w.add("empty", kWeights.data(), 0); }).type == "InvalidArgument");
  CHECK(w.encode() == before);  // the refused add changed nothing
}

TEST_CASE("StateReader refuses another kind or another version (InvalidArgument)", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("kind.state");
  const std::string file = write_sample(path);
  const std::string head = kOp + ": " + path + ": ";

  Thrown t = open_fails(path, "other");
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what == head + "field 'kind' " + byte(top_at(file, "kind")) + ": is \"sample\", not \"other\"");

  // The same header with version 2, framed again (new length and CRC), the same payload.
  const Layout l = layout_of(file);
  std::string header = l.header;
  const std::size_t v = header.find("\"version\":1");
  REQUIRE(v != std::string::npos);
  header.replace(v, 11, "\"version\":2");
  const std::string v2 = frame(header, file.substr(l.payload_first));
  write_all(path, v2);
  t = open_fails(path);
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what == head + "field 'version' " + byte(top_at(v2, "version")) + ": version 2, this kdist reads version 1");
}

TEST_CASE("a field named kind or version is found inside \"fields\", the header's own among the top-level keys",
          "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("named.state");
  kdist::StateWriter w("sample");
  w.set("a", std::string(R"("kind":{[ "version": ]}")"));  // a value that spells keys and brackets
  w.set("kind", 5LL);
  w.set("version", std::string("two"));
  w.set("z", std::vector<std::string>{"{", "[[", "\"kind\":"});
  w.add("raw", kGrads.data(), 1);
  w.write(path, kOp.c_str());
  const std::string file = read_all(path);
  const Layout l = layout_of(file);
  const std::string head = kOp + ": " + path + ": ";
  REQUIRE(field_at(file, "kind") < top_at(file, "kind"));
  REQUIRE(field_at(file, "version") < top_at(file, "version"));

  const kdist::StateReader r(path, "sample", kOp);  // the field "kind" is not the header's kind
  CHECK(r.integer("kind") == 5);
  CHECK(r.text("version") == "two");
  Thrown t = thrown_by([&] { r.text("kind"); });
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what == head + "field 'kind' " + byte(field_at(file, "kind")) + " is 5, not text");
  t = thrown_by([&] { r.integer("version"); });
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what == head + "field 'version' " + byte(field_at(file, "version")) + " is \"two\", not an integer");
  t = thrown_by([&] { r.refuse("z", "no"); });
  CHECK(t.what == head + "field 'z' " + byte(field_at(file, "z")) + ": no");
  t = thrown_by([&] { r.refuse("absent", "no"); });  // an absent field: the header's first byte
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what == head + "field 'absent' " + byte(l.header_first) + ": no");
  t = thrown_by([&] { r.refuse("\xff", "no"); });  // a name that is not UTF-8 is no key either
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what == head + "field '\xff' " + byte(l.header_first) + ": no");

  // The header's kind and version are the top-level keys, after the fields of those names.
  t = open_fails(path, "other");
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what == head + "field 'kind' " + byte(top_at(file, "kind")) + ": is \"sample\", not \"other\"");
  std::string header = l.header;
  const std::size_t v = header.rfind("\"version\":1");
  REQUIRE(v != std::string::npos);
  header.replace(v, 11, "\"version\":3");
  const std::string v3 = frame(header, file.substr(l.payload_first));
  write_all(path, v3);
  t = open_fails(path);
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what == head + "field 'version' " + byte(top_at(v3, "version")) + ": version 3, this kdist reads version 1");
}

TEST_CASE("field offsets in a header framed by hand: spaces, other objects, key order", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("spaced.state");
  const std::string head = kOp + ": " + path + ": ";
  // JSON allows spaces before a colon; "more" holds keys named like fields, after "fields".
  const std::string file = frame(R"({ "version" : 1, "fields" : { "kind" : 1.5, "x" : [ 1 ] }, "kind" : "sample", )"
                                 R"("more" : { "n" : 1, "x" : 2 }, "sections" : [ ] })");
  write_all(path, file);
  const Layout l = layout_of(file);
  const kdist::StateReader r(path, "sample", kOp);
  CHECK(r.real("kind") == 1.5);
  CHECK(r.integers("x") == std::vector<long long>{1});
  CHECK_FALSE(r.has("n"));
  const std::size_t kind_field = at_of(file, "\"kind\" : 1.5"), x_field = at_of(file, "\"x\" : [");

  Thrown t = thrown_by([&] { r.integer("kind"); });
  CHECK(t.what == head + "field 'kind' " + byte(kind_field) + " is 1.5, not an integer");
  t = thrown_by([&] { r.texts("x"); });
  CHECK(t.what == head + "field 'x' " + byte(x_field) + " holds 1, not text");
  t = thrown_by([&] { r.refuse("n", "no"); });  // absent from "fields": not "more"'s key
  CHECK(t.what == head + "field 'n' " + byte(l.header_first) + ": no");

  t = open_fails(path, "other");
  CHECK(t.type == "InvalidArgument");
  CHECK(t.what ==
        head + "field 'kind' " + byte(at_of(file, "\"kind\" : \"sample\"")) + ": is \"sample\", not \"other\"");

  // The writer's spelling (no spaces): a key of "more" after "fields" is still no field's.
  const std::string compact =
      frame(R"({"fields":{"a":1},"kind":"sample","more":{"n":1,"a":2},"sections":[],"version":1})");
  write_all(path, compact);
  const kdist::StateReader c(path, "sample", kOp);
  t = thrown_by([&] { c.refuse("n", "no"); });
  CHECK(t.what == head + "field 'n' " + byte(layout_of(compact).header_first) + ": no");
  t = thrown_by([&] { c.refuse("a", "no"); });
  CHECK(t.what == head + "field 'a' " + byte(at_of(compact, "\"a\":1")) + ": no");
}

TEST_CASE("StateReader refuses a truncated file as damaged", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("cut.state");
  const std::string file = write_sample(path);
  const Layout l = layout_of(file);
  const std::string head = kOp + ": " + path + ": ";
  const std::size_t weights_at = l.payload_first, grads_at = l.payload_first + kWeightBytes;
  auto cut = [&](std::size_t size) {
    write_all(path, file.substr(0, size));
    return open_fails(path);
  };

  Thrown t = cut(5);  // inside the magic
  CHECK(t.type == "Error");
  CHECK_THAT(t.what, Catch::StartsWith(head + "byte 0: ") && Catch::Contains("not a kdist state file"));

  t = cut(kMagic.size() + 2);  // inside the header line
  CHECK(t.type == "Error");
  CHECK_THAT(t.what,
             Catch::StartsWith(head + "byte " + std::to_string(kMagic.size()) + ": ") && Catch::Contains("truncated"));

  const std::size_t in_header = l.header_first + l.header_bytes / 2;
  t = cut(in_header);
  CHECK(t.type == "Error");
  CHECK_THAT(t.what, Catch::StartsWith(head + "header " + bytes(l.header_first, l.header_bytes) +
                                       " runs past the end of the file at byte " + std::to_string(in_header)));

  t = cut(l.payload_first);  // the header whole, no section
  CHECK(t.type == "Error");
  CHECK_THAT(t.what, Catch::StartsWith(head + "section 'weights' " + bytes(weights_at, kWeightBytes) +
                                       " runs past the end of the file at byte " + std::to_string(l.payload_first)));

  t = cut(file.size() - 5);  // inside the last section
  CHECK(t.type == "Error");
  CHECK_THAT(t.what, Catch::StartsWith(head + "section 'grads' " + bytes(grads_at, kGradBytes) +
                                       " runs past the end of the file at byte " + std::to_string(file.size() - 5)));

  // Every shorter file is refused as damage.
  for (std::size_t size = 0; size < file.size(); ++size) {
    t = cut(size);
    INFO("cut at " << size << ": " << t.what);
    CHECK(t.type == "Error");
    CHECK_THAT(t.what, Catch::StartsWith(head));
  }
}

TEST_CASE("StateReader refuses a flipped byte as damaged", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("flip.state");
  const std::string file = write_sample(path);
  const Layout l = layout_of(file);
  const std::string head = kOp + ": " + path + ": ";
  const std::size_t weights_at = l.payload_first, grads_at = l.payload_first + kWeightBytes;
  auto flipped = [&](std::size_t at, unsigned char mask) {
    std::string damaged = file;
    damaged[at] = static_cast<char>(static_cast<unsigned char>(damaged[at]) ^ mask);
    write_all(path, damaged);
    return open_fails(path);
  };
  const std::string header_damaged = head + "header " + bytes(l.header_first, l.header_bytes) + ": checksum";

  Thrown t = flipped(l.header_first + l.header.find("sample"), 0x01);  // in the header's JSON
  CHECK(t.type == "Error");
  CHECK_THAT(t.what, Catch::StartsWith(header_damaged));

  t = flipped(l.header_first - 2, 0x01);  // the header CRC's last hex digit
  CHECK(t.type == "Error");
  CHECK_THAT(t.what, Catch::StartsWith(header_damaged));

  std::string shorter = file;  // the header length one less, same width
  const std::string length = std::to_string(l.header_bytes), less = std::to_string(l.header_bytes - 1);
  REQUIRE(less.size() == length.size());
  shorter.replace(kMagic.size(), length.size(), less);
  write_all(path, shorter);
  t = open_fails(path);
  CHECK(t.type == "Error");
  CHECK_THAT(t.what, Catch::StartsWith(head + "header " + bytes(l.header_first, l.header_bytes - 1) + ": checksum"));

  t = flipped(weights_at + 1, 0x10);
  CHECK(t.type == "Error");
  CHECK(t.what == head + "section 'weights' " + bytes(weights_at, kWeightBytes) +
                      ": checksum does not match (the file is damaged or not a kdist state file)");

  t = flipped(file.size() - 1, 0x80);
  CHECK(t.type == "Error");
  CHECK_THAT(t.what, Catch::StartsWith(head + "section 'grads' " + bytes(grads_at, kGradBytes) + ": checksum"));

  // Every byte, one bit or all bits flipped, is refused as damage.
  for (std::size_t at = 0; at < file.size(); ++at)
    for (unsigned char mask : {0x01, 0xff}) {
      t = flipped(at, mask);
      INFO("byte " << at << " ^ " << int(mask) << ": " << t.what);
      CHECK(t.type == "Error");
      CHECK_THAT(t.what, Catch::StartsWith(head));
    }
}

TEST_CASE("StateReader refuses what is not a state file, or cannot be opened", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("other.state");
  const std::string head = kOp + ": " + path + ": ";

  for (const std::string& bytes : {std::string(), std::string("hello world\n"),
                                   std::string(R"({"kind":"sample","version":1,"fields":{},"sections":[]})"),
                                   std::string("KDIST-STATEX\n2 00000000\n{}")}) {
    write_all(path, bytes);
    const Thrown t = open_fails(path);
    INFO(t.what);
    CHECK(t.type == "Error");
    CHECK_THAT(t.what, Catch::StartsWith(head + "byte 0: ") && Catch::Contains("not a kdist state file"));
  }

  write_all(path, kMagic + "many bytes\n{}");
  Thrown t = open_fails(path);
  CHECK(t.type == "Error");
  CHECK_THAT(t.what, Catch::StartsWith(head + "byte " + std::to_string(kMagic.size()) + ": "));

  const std::string not_json = "not json";
  write_all(path, frame(not_json));
  t = open_fails(path);
  CHECK(t.type == "Error");
  CHECK_THAT(t.what,
             Catch::StartsWith(head + "header " + bytes(layout_of(read_all(path)).header_first, not_json.size()) +
                               " is not JSON"));

  const std::string no_sections = R"({"fields":{},"kind":"sample","version":1})";
  write_all(path, frame(no_sections));
  t = open_fails(path);
  CHECK(t.type == "Error");
  CHECK_THAT(t.what,
             Catch::StartsWith(head + "header " + bytes(layout_of(read_all(path)).header_first, no_sections.size())) &&
                 Catch::Contains("lacks"));

  const std::string float128 = header_with(entry("s", "float128", "0", "0", "0"));
  write_all(path, frame(float128));
  t = open_fails(path);
  CHECK(t.type == "Error");
  CHECK(t.what == head + "header " + bytes(layout_of(read_all(path)).header_first, float128.size()) +
                      ": section 's' has dtype float128" + kDamaged);

  const std::string lacking = header_with(R"({"name":"s","dtype":"float32"})");
  write_all(path, frame(lacking));
  t = open_fails(path);
  CHECK(t.type == "Error");
  CHECK(t.what == head + "header " + bytes(layout_of(read_all(path)).header_first, lacking.size()) +
                      ": a section entry lacks a name, dtype, count, offset or crc32: "
                      R"({"dtype":"float32","name":"s"})" +
                      kDamaged);

  const std::string missing = scratch.file("does-not-exist.state");
  t = open_fails(missing);
  CHECK(t.type == "Error");
  CHECK(t.what == kOp + ": " + missing + " cannot be opened: No such file or directory");
}

TEST_CASE("StateReader refuses a header line that is not exactly \"<length> <crc32>\"", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("line.state");
  const std::string head = kOp + ": " + path + ": ";
  const std::string header = header_with(""), length = std::to_string(header.size()), crc = crc_hex(header);
  REQUIRE(crc.find_first_not_of("0123456789") != std::string::npos);  // has a letter to upper-case
  std::string upper = crc;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  write_all(path, kMagic + length + " " + crc + "\n" + header);
  CHECK(kdist::StateReader(path, "sample", kOp).has("x") == false);  // the well-formed line reads

  const std::string not_line = head + "byte " + std::to_string(kMagic.size()) +
                               ": the header line is not \"<length> <crc32, 8 hex digits>\"" + kDamaged;
  for (const std::string& line : {
           "18446744073709551615 " + crc,  // 2^64-1: once a SIGSEGV
           "-1 " + crc,                    // once read as 2^64-1
           "18446744073709551616 " + crc,  // past 2^64
           "1234567890123 " + crc,         // 13 digits
           length + " " + crc + " junk",   // junk after the CRC
           length + " " + crc + "0",       // nine hex digits
           length + " " + crc.substr(1),   // seven
           length + " " + upper,           // upper case
           length + "  " + crc,            // two spaces
           length + "\t" + crc,
           " " + length + " " + crc,
           "+" + length + " " + crc,
           length + ".0 " + crc,
           length + " " + crc + "\r",
           length,
           " " + crc,
           std::string(),
       }) {
    write_all(path, kMagic + line + "\n" + header);
    const Thrown t = open_fails(path);
    INFO("line \"" << line << "\": " << t.what);
    CHECK(t.type == "Error");
    CHECK(t.what == not_line);
  }

  // Twelve digits are a length; one past the end of the file is truncation, not an overflow.
  const std::size_t header_first = kMagic.size() + 12 + 1 + 8 + 1;
  for (const std::string& big : {std::string("999999999999"), std::to_string(header.size() + 1)}) {
    const std::string line = std::string(12 - big.size(), '0') + big + " " + crc;
    write_all(path, kMagic + line + "\n" + header);
    const Thrown t = open_fails(path);
    INFO(t.what);
    CHECK(t.type == "Error");
    CHECK(t.what == head + "header " + bytes(header_first, std::stoull(big)) +
                        " runs past the end of the file at byte " + std::to_string(header_first + header.size()) +
                        " (truncated)" + kDamaged);
  }
}

TEST_CASE("StateReader refuses a header without kind, version, fields or sections", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("lacks.state");
  const std::string head = kOp + ": " + path + ": ";
  for (const std::string& header : {
           std::string(R"([])"),
           std::string(R"("sample")"),
           std::string(R"({"fields":{},"sections":[],"version":1})"),
           std::string(R"({"fields":{},"kind":"sample","sections":[]})"),
           std::string(R"({"kind":"sample","sections":[],"version":1})"),
           std::string(R"({"fields":[],"kind":"sample","sections":[],"version":1})"),
           std::string(R"({"fields":{},"kind":"sample","sections":{},"version":1})"),
       }) {
    write_all(path, frame(header));
    const Thrown t = open_fails(path);
    INFO(header << ": " << t.what);
    CHECK(t.type == "Error");
    CHECK(t.what == head + "header " + bytes(layout_of(read_all(path)).header_first, header.size()) +
                        " lacks kind, version, fields or sections" + kDamaged);
  }
  // Not UTF-8 inside the header's JSON: not JSON.
  write_all(path, frame(header_with("", "{\"t\":\"\xff\"}")));
  const Thrown t = open_fails(path);
  CHECK(t.type == "Error");
  CHECK_THAT(t.what, Catch::StartsWith(head + "header (bytes ") && Catch::Contains(") is not JSON"));
}

TEST_CASE("StateReader refuses a section entry that is not a name, dtype and three naturals", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("entry.state");
  const std::string head = kOp + ": " + path + ": ";
  const std::string payload = "abcd", crc = std::to_string(zlib_crc(payload));
  write_all(path, frame(header_with(entry("raw", "int32", "1", "0", crc)), payload));
  CHECK(kdist::StateReader(path, "sample", kOp).has_section("raw"));  // the sound entry reads

  for (const std::string& bad : {
           entry("raw", "int32", "-1", "0", crc),  // once read as 2^64-1
           entry("raw", "int32", "1", "-4", crc),
           entry("raw", "int32", "1.0", "0", crc),
           entry("raw", "int32", "1e30", "0", crc),  // once an undefined cast
           entry("raw", "int32", "1", "0.5", crc),
           entry("raw", "int32", "1", "0", "-1"),
           entry("raw", "int32", "\"1\"", "0", crc),
           entry("raw", "int32", "1", "null", crc),
           entry("raw", "int32", "true", "0", crc),
           std::string(R"({"name":5,"dtype":"int32","count":1,"offset":0,"crc32":0})"),
           std::string(R"({"name":"raw","dtype":null,"count":1,"offset":0,"crc32":0})"),
           std::string("5"),
           std::string("[]"),
       }) {
    const std::string header = header_with(bad);
    write_all(path, frame(header, payload));
    const Thrown t = open_fails(path);
    INFO(bad << ": " << t.what);
    CHECK(t.type == "Error");
    CHECK_THAT(t.what,
               Catch::StartsWith(head + "header " + bytes(layout_of(read_all(path)).header_first, header.size()) +
                                 ": a section entry lacks a name, dtype, count, offset or crc32: ") &&
                   Catch::EndsWith(kDamaged));
  }
}

TEST_CASE("StateReader refuses payload bytes that no section covers, or covers twice", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("cover.state");
  const std::string head = kOp + ": " + path + ": ";
  const std::string a = "abcd", b = "efghijkl", crc_a = std::to_string(zlib_crc(a)),
                    crc_b = std::to_string(zlib_crc(b));
  auto opened = [&](const std::string& sections, const std::string& payload) {
    const std::string file = frame(header_with(sections), payload);
    write_all(path, file);
    return std::make_pair(layout_of(file).payload_first, open_fails(path));
  };

  // Contiguous from payload offset 0, in order, up to the end of the file: sound.
  const auto sound = opened(entry("a", "int32", "1", "0", crc_a) + "," + entry("b", "float64", "1", "4", crc_b), a + b);
  CHECK(sound.second.type == "nothing");

  SECTION("bytes appended after the last section") {
    const std::string file = write_sample(path);
    for (const std::string& extra : {std::string(1, '\0'), std::string("appended bytes")}) {
      write_all(path, file + extra);
      const Thrown t = open_fails(path);
      INFO(t.what);
      CHECK(t.type == "Error");
      CHECK(t.what == head + "bytes " + std::to_string(file.size()) + ".." +
                          std::to_string(file.size() + extra.size()) + " after the last section belong to no section" +
                          kDamaged);
    }
  }

  SECTION("a payload and no section") {
    const auto [payload_first, t] = opened("", "x");
    CHECK(t.type == "Error");
    CHECK(t.what == head + "bytes " + std::to_string(payload_first) + ".." + std::to_string(payload_first + 1) +
                        " after the last section belong to no section" + kDamaged);
  }

  SECTION("a gap before the first section") {
    const auto [payload_first, t] = opened(entry("a", "int32", "1", "1", crc_a), "x" + a);
    CHECK(t.type == "Error");
    CHECK(t.what == head + "section 'a' starts at byte " + std::to_string(payload_first + 1) + ", not at byte " +
                        std::to_string(payload_first) + " where the one before it ends" + kDamaged);
  }

  SECTION("a gap between two sections") {
    const auto [payload_first, t] =
        opened(entry("a", "int32", "1", "0", crc_a) + "," + entry("b", "float64", "1", "5", crc_b), a + "x" + b);
    CHECK(t.type == "Error");
    CHECK(t.what == head + "section 'b' starts at byte " + std::to_string(payload_first + 5) + ", not at byte " +
                        std::to_string(payload_first + 4) + " where the one before it ends" + kDamaged);
  }

  SECTION("two sections overlapping, or out of order") {
    auto [payload_first, t] =  // c: the same 4 bytes as a
        opened(entry("a", "int32", "1", "0", crc_a) + "," + entry("c", "int32", "1", "0", crc_a), a);
    CHECK(t.type == "Error");
    CHECK(t.what == head + "section 'c' starts at byte " + std::to_string(payload_first) + ", not at byte " +
                        std::to_string(payload_first + 4) + " where the one before it ends" + kDamaged);
    std::tie(payload_first, t) =
        opened(entry("b", "float64", "1", "4", crc_b) + "," + entry("a", "int32", "1", "0", crc_a), a + b);
    CHECK(t.type == "Error");
    CHECK(t.what == head + "section 'b' starts at byte " + std::to_string(payload_first + 4) + ", not at byte " +
                        std::to_string(payload_first) + " where the one before it ends" + kDamaged);
  }

  SECTION("a section name twice") {
    const std::string header =
        header_with(entry("a", "int32", "1", "0", crc_a) + "," + entry("a", "int32", "1", "4", crc_a));
    write_all(path, frame(header, a + a));
    const Thrown t = open_fails(path);
    CHECK(t.type == "Error");
    CHECK(t.what == head + "header " + bytes(layout_of(read_all(path)).header_first, header.size()) +
                        ": section 'a' twice" + kDamaged);
  }

  SECTION("a count past the end of the file, however large") {
    const std::string eight = "01234567", crc = std::to_string(zlib_crc(eight));
    // 3 float64 in 8 bytes; 2^61+1 float64 would be 8 bytes mod 2^64; 2^64-1 float64.
    auto [payload_first, t] = opened(entry("big", "float64", "3", "0", crc), eight);
    CHECK(t.type == "Error");
    CHECK(t.what == head + "section 'big' " + bytes(payload_first, 24) + " runs past the end of the file at byte " +
                        std::to_string(payload_first + 8) + " (truncated)" + kDamaged);
    for (const std::string& count : {std::string("2305843009213693953"), std::string("18446744073709551615")}) {
      std::tie(payload_first, t) = opened(entry("big", "float64", count, "0", crc), eight);
      INFO(t.what);
      CHECK(t.type == "Error");
      CHECK(t.what == head + "section 'big' (" + count + " float64 from byte " + std::to_string(payload_first) +
                          ") runs past the end of the file at byte " + std::to_string(payload_first + 8) +
                          " (truncated)" + kDamaged);
    }
    std::tie(payload_first, t) = opened(entry("big", "bytes", "18446744073709551615", "0", crc), eight);
    CHECK(t.type == "Error");
    CHECK_THAT(t.what, Catch::StartsWith(head + "section 'big' (") && Catch::EndsWith("(truncated)" + kDamaged));
  }
}

TEST_CASE("StateWriter refuses a real that is not finite and text that is not UTF-8", "[core][state_file]") {
  Scratch scratch;
  kdist::StateWriter w("sample");
  fill(w);
  const std::string before = w.encode();
  for (const double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()}) {
    const Thrown t = thrown_by([&] { w.set("lr", bad); });
    INFO(t.what);
    CHECK(t.type == "InvalidArgument");
    CHECK_THAT(t.what, Catch::StartsWith("kdist::StateWriter::set: field 'lr' is ") &&
                           Catch::EndsWith(": a state file holds finite reals only"));
  }
  CHECK(thrown_by([&] { w.set("new", std::numeric_limits<double>::quiet_NaN()); }).type == "InvalidArgument");
  CHECK(w.encode() == before);                        // the refused sets changed nothing: "lr" is still 0.1, no "new"
  w.set("huge", std::numeric_limits<double>::max());  // finite extremes are fine
  w.set("least", -std::numeric_limits<double>::denorm_min());
  const std::string path = scratch.file("finite.state");
  w.write(path, kOp.c_str());
  const kdist::StateReader r(path, "sample", kOp);
  CHECK(r.real("lr") == 0.1);
  CHECK_FALSE(r.has("new"));
  CHECK(r.real("huge") == std::numeric_limits<double>::max());
  CHECK(r.real("least") == -std::numeric_limits<double>::denorm_min());

  const std::string bad = "caf\xe9";  // Latin-1, not UTF-8
  struct Case {
    std::string what;
    std::function<void(kdist::StateWriter&)> set;
  };
  const std::vector<Case> cases = {
      {"text", [&](kdist::StateWriter& x) { x.set("t", bad); }},
      {"a field name", [&](kdist::StateWriter& x) { x.set(bad, 1LL); }},
      {"a list of text",
       [&](kdist::StateWriter& x) {
         x.set("l", std::vector<std::string>{"ok", bad});
       }},
      {"a section name", [&](kdist::StateWriter& x) { x.add(bad, kGrads.data(), 1); }},
      {"a truncated sequence", [&](kdist::StateWriter& x) { x.set("t", std::string("\xc3")); }},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    kdist::StateWriter x("sample");
    x.set("n", 1LL);
    c.set(x);
    Thrown t = thrown_by([&] { x.encode(); });
    CHECK(t.type == "InvalidArgument");
    CHECK_THAT(t.what, Catch::StartsWith("kdist::StateWriter::encode: ") && Catch::Contains("not UTF-8"));
    const std::string out = scratch.file("utf8.state");
    t = thrown_by([&] { x.write(out, kOp.c_str()); });
    CHECK(t.type == "InvalidArgument");
    CHECK_THAT(t.what, Catch::StartsWith("kdist::StateWriter::encode: ") && Catch::Contains("not UTF-8"));
    CHECK_FALSE(exists(out));  // nothing written, no temporary
    CHECK_FALSE(exists(kdist::impl::atomic_temporary_path(out)));
  }
  kdist::StateWriter kind(bad);
  CHECK(thrown_by([&] { kind.encode(); }).type == "InvalidArgument");
}

TEST_CASE("StateReader::refuse names the field and its byte", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("refuse.state");
  const std::string file = write_sample(path);
  const kdist::StateReader r(path, "sample", kOp);
  for (const char* field : {"n", "dims", "labels"}) {
    const Thrown t = thrown_by([&] { r.refuse(field, "does not fit this model"); });
    CHECK(t.type == "InvalidArgument");
    CHECK(t.what ==
          kOp + ": " + path + ": field '" + field + "' " + byte(field_at(file, field)) + ": does not fit this model");
  }
}

TEST_CASE("StateWriter::write replaces the file atomically and leaves no temporary", "[core][state_file]") {
  Scratch scratch;
  const std::string path = scratch.file("atomic.state"), tmp = kdist::impl::atomic_temporary_path(path);
  const std::string old_file = write_sample(path);
  CHECK_FALSE(exists(tmp));

  kdist::StateWriter next("sample");
  next.set("n", 7LL);
  next.write(path, kOp.c_str());
  CHECK(read_all(path) == next.encode());
  CHECK_FALSE(exists(tmp));
  CHECK(kdist::StateReader(path, "sample", kOp).integer("n") == 7);
  write_all(path, old_file);

  SECTION("the temporary cannot be created: Error, the old file intact") {
    REQUIRE(::mkdir(tmp.c_str(), 0755) == 0);  // open(O_CREAT) of a directory fails, even for root
    const Thrown t = thrown_by([&] { next.write(path, kOp.c_str()); });
    CHECK(t.type == "Error");
    CHECK_THAT(t.what, Catch::StartsWith(kOp + ": cannot write '" + path + "'"));
    CHECK(read_all(path) == old_file);
    CHECK(kdist::StateReader(path, "sample", kOp).integer("n") == 42);
    REQUIRE(::rmdir(tmp.c_str()) == 0);
  }

  SECTION("an unwritable directory: Error, the old file intact, no temporary") {
    const std::string dir = scratch.file("ro"), in_dir = dir + "/atomic.state";
    REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
    write_all(in_dir, old_file);
    REQUIRE(::chmod(dir.c_str(), 0555) == 0);
    {
      const WithoutDacOverride as_a_user;  // as root, too
      if (can_create_in(dir)) {
        WARN("skipped: " << dir << " stays writable after chmod 0555 (root without capset?)");
      } else {
        const Thrown t = thrown_by([&] { next.write(in_dir, kOp.c_str()); });
        CHECK(t.type == "Error");
        CHECK_THAT(t.what,
                   Catch::StartsWith(kOp + ": cannot write '" + in_dir + "'") && Catch::Contains("Permission denied"));
        CHECK(read_all(in_dir) == old_file);
        CHECK_FALSE(exists(kdist::impl::atomic_temporary_path(in_dir)));
      }
    }
    REQUIRE(::chmod(dir.c_str(), 0755) == 0);
  }

  SECTION("a missing directory: Error, nothing created") {
    const std::string nowhere = scratch.file("missing/atomic.state");
    const Thrown t = thrown_by([&] { next.write(nowhere, kOp.c_str()); });
    CHECK(t.type == "Error");
    CHECK_THAT(t.what, Catch::StartsWith(kOp + ": cannot write '" + nowhere + "'"));
    CHECK_FALSE(exists(scratch.file("missing")));
  }
}
