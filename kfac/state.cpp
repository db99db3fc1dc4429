#include <kdist/core/error.hpp>
#include <kdist/kfac/state.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kdist {
namespace kfac {

namespace {
constexpr const char* kMagic = "KDIST-KFAC-STATE\n";
constexpr const char* kFunc = "kdist::kfac::Preconditioner::load";

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw Error(std::string(kFunc) + ": " + path + ": " + what);
}

template <class V>
V field(const std::string& path, const nlohmann::json& j, const char* name) {
  if (!j.contains(name)) bad_file(path, std::string("header has no field '") + name + "'");
  try {
    return j.at(name).get<V>();
  } catch (const nlohmann::json::exception&) {
    bad_file(path, std::string("header field '") + name + "' has the wrong type");
  }
}
}  // namespace

std::size_t StateHeader::payload_bytes(std::size_t element_bytes) const {
  std::size_t elements = 0;
  for (int d : dims) elements += static_cast<std::size_t>(d) * static_cast<std::size_t>(d);
  return 2 * elements * element_bytes;
}

std::string encode_state(const StateHeader& h, const std::string& payload) {
  nlohmann::json j = {{"version", StateHeader::kVersion},
                      {"dtype", h.dtype},
                      {"ranks", h.ranks},
                      {"layers", h.layers},
                      {"dims", h.dims},
                      {"step", h.step},
                      {"factor_steps", h.factor_steps},
                      {"replan_after", h.replan_after},
                      {"have_inverses", h.have_inverses},
                      {"fusion_groups", h.fusion_groups},
                      {"owners", h.owners}};
  const std::string text = j.dump();
  return std::string(kMagic) + std::to_string(text.size()) + "\n" + text + payload;
}

StateHeader decode_state(const std::string& path, std::string* payload) {
  std::ifstream in(path, std::ios::binary);
  if (!in) bad_file(path, "cannot be opened");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string all = buffer.str();
  const std::string magic(kMagic);
  if (all.compare(0, magic.size(), magic) != 0) bad_file(path, "is not a kdist K-FAC state (bad magic)");
  const std::size_t nl = all.find('\n', magic.size());
  std::size_t length = 0;
  try {
    length = std::stoull(all.substr(magic.size(), nl - magic.size()));
  } catch (const std::exception&) {
    bad_file(path, "header length is unreadable");
  }
  if (nl == std::string::npos || nl + 1 + length > all.size()) bad_file(path, "is truncated inside its header");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(all.substr(nl + 1, length));
  } catch (const nlohmann::json::exception&) {
    bad_file(path, "header is not valid JSON");
  }
  if (field<int>(path, j, "version") != StateHeader::kVersion)
    bad_file(path, "version " + j.at("version").dump() + ", this kdist reads " + std::to_string(StateHeader::kVersion));
  StateHeader h;
  h.dtype = field<std::string>(path, j, "dtype");
  h.ranks = field<int>(path, j, "ranks");
  h.layers = field<std::vector<std::string>>(path, j, "layers");
  h.dims = field<std::vector<int>>(path, j, "dims");
  h.step = field<long long>(path, j, "step");
  h.factor_steps = field<long long>(path, j, "factor_steps");
  h.replan_after = field<long long>(path, j, "replan_after");
  h.have_inverses = field<bool>(path, j, "have_inverses");
  h.fusion_groups = field<std::vector<int>>(path, j, "fusion_groups");
  h.owners = field<std::vector<int>>(path, j, "owners");
  for (int d : h.dims)
    if (d < 1) bad_file(path, "a factor dimension is " + std::to_string(d));
  *payload = all.substr(nl + 1 + length);
  return h;
}

void check_compatible(const std::string& path, const StateHeader& saved, const StateHeader& running,
                      std::size_t payload_bytes, std::size_t element_bytes) {
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return "[" + s + "]";
  };
  std::string diff;
  if (saved.dtype != running.dtype)
    diff = "dtype " + saved.dtype + ", this preconditioner is " + running.dtype;
  else if (saved.ranks != running.ranks)
    diff = "saved on " + std::to_string(saved.ranks) + " ranks, this run has " + std::to_string(running.ranks);
  else if (saved.layers != running.layers)
    diff = "layers " + list(saved.layers) + ", this preconditioner has " + list(running.layers);
  else if (saved.dims != running.dims || saved.owners.size() != running.owners.size())
    diff = "factor dimensions differ";
  if (!diff.empty()) impl::throw_invalid(kFunc, path + ": state does not fit: " + diff);
  if (payload_bytes != saved.payload_bytes(element_bytes))
    bad_file(path, "payload has " + std::to_string(payload_bytes) + " bytes, the header's factors need " +
                       std::to_string(saved.payload_bytes(element_bytes)) + " (truncated)");
}

}  // namespace kfac
}  // namespace kdist
