#include <zlib.h>
#include <kdist/core/atomic_file.hpp>
#include <kdist/core/error.hpp>
#include <kdist/core/state_file.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kdist {

namespace {

constexpr const char* kMagic = "KDIST-STATE\n";
constexpr int kVersion = 1;

unsigned long crc32_of(const char* data, std::size_t bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (bytes > 0) {  // crc32 takes a uInt length
    const uInt chunk = static_cast<uInt>(std::min<std::size_t>(bytes, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    bytes -= chunk;
  }
  return crc;
}

std::string hex(unsigned long crc) {
  char text[16];
  std::snprintf(text, sizeof text, "%08lx", crc);
  return text;
}

std::string byte_range(std::size_t first, std::size_t bytes) {
  return "bytes " + std::to_string(first) + ".." + std::to_string(first + bytes);
}

}  // namespace

// ---- writer -------------------------------------------------------------------------------

struct StateWriter::Impl {
  std::string kind;
  nlohmann::json fields = nlohmann::json::object();
  nlohmann::json sections = nlohmann::json::array();
  std::string payload;
};

StateWriter::StateWriter(std::string kind) : impl_(std::make_unique<Impl>()) {
  impl_->kind = std::move(kind);
}
StateWriter::~StateWriter() = default;

void StateWriter::set(const std::string& field, long long value) {
  impl_->fields[field] = value;
}
void StateWriter::set(const std::string& field, double value) {
  if (!std::isfinite(value))
    impl::throw_invalid("kdist::StateWriter::set",
                        "field '" + field + "' is " + std::to_string(value) + ": a state file holds finite reals only");
  impl_->fields[field] = value;
}
void StateWriter::set_flag(const std::string& field, bool value) {
  impl_->fields[field] = value;
}
void StateWriter::set(const std::string& field, const std::string& value) {
  impl_->fields[field] = value;
}
void StateWriter::set(const std::string& field, const std::vector<long long>& values) {
  impl_->fields[field] = values;
}
void StateWriter::set(const std::string& field, const std::vector<std::string>& values) {
  impl_->fields[field] = values;
}

void StateWriter::add_bytes(const std::string& section, DType dtype, std::size_t count, const void* data) {
  for (const auto& s : impl_->sections)
    if (s.at("name") == section) impl::throw_invalid("kdist::StateWriter::add", "section '" + section + "' twice");
  const std::size_t bytes = count * size_of(dtype);
  const char* first = static_cast<const char*>(data);
  impl_->sections.push_back({{"name", section},
                             {"dtype", to_string(dtype)},
                             {"count", count},
                             {"offset", impl_->payload.size()},
                             {"crc32", crc32_of(first, bytes)}});
  impl_->payload.append(first, bytes);
}

std::string StateWriter::encode() const {
  const nlohmann::json header = {
      {"kind", impl_->kind}, {"version", kVersion}, {"fields", impl_->fields}, {"sections", impl_->sections}};
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // text that is not UTF-8
    impl::throw_invalid("kdist::StateWriter::encode", std::string("a field or section name is not UTF-8: ") + e.what());
  }
  return std::string(kMagic) + std::to_string(text.size()) + " " + hex(crc32_of(text.data(), text.size())) + "\n" +
         text + impl_->payload;
}

void StateWriter::write(const std::string& path, const char* operation) const {
  write_file_atomically(path, encode(), operation);
}

// ---- reader -------------------------------------------------------------------------------

namespace {
/// Byte offset in `text` of the key `key` (JSON-quoted) at object depth `depth` (1: the
/// outermost object's keys), or npos. Skips strings, so a value that spells a key never matches.
std::size_t key_offset(const std::string& text, const std::string& key, int depth) {
  std::string quoted;
  try {
    quoted = nlohmann::json(key).dump();
  } catch (const nlohmann::json::exception&) {  // not UTF-8: no key of a parsed header
    return std::string::npos;
  }
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  int level = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '{' || c == '[') ++level;
    if ((c == '}' || c == ']') && --level < depth) return std::string::npos;  // the object has closed
    if (c != '"') continue;
    const std::size_t start = i;
    for (++i; i < text.size() && text[i] != '"'; ++i)
      if (text[i] == '\\') ++i;
    std::size_t colon = i + 1;
    while (colon < text.size() && space(text[colon])) ++colon;
    if (level == depth && text.compare(start, quoted.size(), quoted) == 0 && colon < text.size() && text[colon] == ':')
      return start;
  }
  return std::string::npos;
}
/// An integer that a long long holds (nlohmann keeps non-negative integers unsigned, to 2^64-1).
bool is_long_long(const nlohmann::json& value) {
  return value.is_number_integer() &&
         (!value.is_number_unsigned() ||
          value.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<long long>::max()));
}
}  // namespace

struct StateReader::Impl {
  std::string operation, path, all;
  std::size_t header_first = 0, payload_first = 0, fields_first = 0;
  unsigned long header_crc = 0;
  nlohmann::json fields;
  struct Section {
    DType dtype;
    std::size_t count, first, bytes;
  };
  std::map<std::string, Section> sections;

  [[noreturn]] void damaged(const std::string& what) const {
    throw Error(operation + ": " + path + ": " + what + " (the file is damaged or not a kdist state file)");
  }
  [[noreturn]] void misfit(const std::string& what) const { impl::throw_invalid(operation, path + ": " + what); }
  std::string header_bytes() const { return byte_range(header_first, payload_first - header_first); }
  /// The byte offset of a field's key (of the header's own key with `top`), else the header's.
  std::size_t offset_of(const std::string& field, bool top = false) const {
    const std::size_t first = top ? header_first : fields_first;
    const std::size_t at = key_offset(all.substr(first, payload_first - first), field, 1);
    return at == std::string::npos ? header_first : first + at;
  }
  std::string where(const std::string& field, bool top = false) const {
    return "field '" + field + "' (byte " + std::to_string(offset_of(field, top)) + ")";
  }
  const nlohmann::json& field(const std::string& name, const char* type) const;
  void parse_line();
  void parse_header(const std::string& kind);
  void parse_sections(const nlohmann::json& list);
};

// The magic, then "<length> <crc>\n": the header's bounds and its checksum.
void StateReader::Impl::parse_line() {
  const std::string magic(kMagic);
  if (all.compare(0, magic.size(), magic) != 0) damaged("byte 0: no \"KDIST-STATE\" magic");
  const std::size_t eol = all.find('\n', magic.size());
  if (eol == std::string::npos) damaged("byte " + std::to_string(magic.size()) + ": the header line is truncated");
  const std::string line = all.substr(magic.size(), eol - magic.size());
  const std::size_t space = line.find(' ');
  const bool digits = space != std::string::npos && space > 0 && space <= 12 &&
                      line.find_first_not_of("0123456789") == space && line.size() == space + 9 &&
                      line.find_first_not_of("0123456789abcdef", space + 1) == std::string::npos;
  if (!digits)
    damaged("byte " + std::to_string(magic.size()) + ": the header line is not \"<length> <crc32, 8 hex digits>\"");
  const std::size_t length = std::stoull(line.substr(0, space));
  header_first = eol + 1;
  if (length > all.size() - header_first)
    damaged("header (" + byte_range(header_first, length) + ") runs past the end of the file at byte " +
            std::to_string(all.size()) + " (truncated)");
  payload_first = header_first + length;
  header_crc = crc32_of(all.data() + header_first, length);
  if (hex(header_crc) != line.substr(space + 1))
    damaged("header (" + header_bytes() + "): checksum does not match " + line.substr(space + 1));
}

void StateReader::Impl::parse_header(const std::string& kind) {
  parse_line();
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(all.begin() + static_cast<std::ptrdiff_t>(header_first),
                                   all.begin() + static_cast<std::ptrdiff_t>(payload_first));
  } catch (const nlohmann::json::exception& e) {
    damaged("header (" + header_bytes() + ") is not JSON: " + e.what());
  }
  if (!header.is_object() || !header.contains("fields") || !header["fields"].is_object() ||
      !header.contains("sections") || !header["sections"].is_array() || !header.contains("kind") ||
      !header.contains("version"))
    damaged("header (" + header_bytes() + ") lacks kind, version, fields or sections");
  const std::size_t at = key_offset(all.substr(header_first, payload_first - header_first), "fields", 1);
  fields_first = at == std::string::npos ? header_first : header_first + at + std::string("\"fields\":").size();
  fields = header["fields"];
  if (header["version"] != kVersion)
    misfit(where("version", true) + ": version " + header["version"].dump() + ", this kdist reads version " +
           std::to_string(kVersion));
  if (header["kind"] != kind) misfit(where("kind", true) + ": is " + header["kind"].dump() + ", not \"" + kind + "\"");
  parse_sections(header["sections"]);
}

// Every section lies inside the file and under its CRC, and together they cover the payload
// exactly, in order, without gaps: no byte after the header escapes a checksum.
void StateReader::Impl::parse_sections(const nlohmann::json& list) {
  std::size_t next = payload_first;
  for (const auto& entry : list) {
    std::string name, dtype;
    std::size_t count = 0, offset = 0;
    unsigned long crc = 0;
    try {
      name = entry.at("name").get<std::string>();
      dtype = entry.at("dtype").get<std::string>();
      // get_ref: a non-negative integer, or type_error (get<> would wrap -1 and cast 1e30 undefined)
      count = entry.at("count").get_ref<const nlohmann::json::number_unsigned_t&>();
      offset = entry.at("offset").get_ref<const nlohmann::json::number_unsigned_t&>();
      crc = entry.at("crc32").get_ref<const nlohmann::json::number_unsigned_t&>();
    } catch (const nlohmann::json::exception&) {
      damaged("header (" + header_bytes() +
              "): a section entry lacks a name, dtype, count, offset or crc32: " + entry.dump());
    }
    Section section{DType::bytes, count, payload_first + offset, 0};
    if (!parse_dtype(dtype.c_str(), &section.dtype))
      damaged("header (" + header_bytes() + "): section '" + name + "' has dtype " + dtype);
    if (sections.count(name)) damaged("header (" + header_bytes() + "): section '" + name + "' twice");
    const std::size_t left = all.size() - next;
    if (section.first != next)
      damaged("section '" + name + "' starts at byte " + std::to_string(section.first) + ", not at byte " +
              std::to_string(next) + " where the one before it ends");
    if (count > left / size_of(section.dtype)) {
      const bool fits = count <= std::numeric_limits<std::size_t>::max() / size_of(section.dtype) - section.first;
      damaged("section '" + name + "' (" +
              (fits ? byte_range(section.first, count * size_of(section.dtype))
                    : std::to_string(count) + " " + dtype + " from byte " + std::to_string(section.first)) +
              ") runs past the end of the file at byte " + std::to_string(all.size()) + " (truncated)");
    }
    section.bytes = count * size_of(section.dtype);
    if (crc32_of(all.data() + section.first, section.bytes) != crc)
      damaged("section '" + name + "' (" + byte_range(section.first, section.bytes) + "): checksum does not match");
    sections[name] = section;
    next = section.first + section.bytes;
  }
  if (next != all.size()) damaged(byte_range(next, all.size() - next) + " after the last section belong to no section");
}

const nlohmann::json& StateReader::Impl::field(const std::string& name, const char* type) const {
  if (!fields.contains(name))
    misfit("field '" + name + "' is missing (header at byte " + std::to_string(header_first) + ")");
  const nlohmann::json& value = fields[name];
  const bool ok = std::strcmp(type, "an integer") == 0  ? is_long_long(value)
                  : std::strcmp(type, "a real") == 0    ? value.is_number()
                  : std::strcmp(type, "a boolean") == 0 ? value.is_boolean()
                  : std::strcmp(type, "text") == 0      ? value.is_string()
                                                        : value.is_array();
  if (!ok) misfit(where(name) + " is " + value.dump() + ", not " + type);
  return value;
}

StateReader::StateReader(const std::string& path, const std::string& kind, std::string operation)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.operation = std::move(operation);
  s.path = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(s.operation + ": " + path + " cannot be opened: " + std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  s.all = buffer.str();
  s.parse_header(kind);
}

StateReader::~StateReader() = default;
StateReader::StateReader(StateReader&&) noexcept = default;

const std::string& StateReader::path() const noexcept {
  return impl_->path;
}
unsigned long StateReader::checksum() const noexcept {
  return impl_->header_crc;
}
bool StateReader::has(const std::string& field) const {
  return impl_->fields.contains(field);
}
long long StateReader::integer(const std::string& field) const {
  return impl_->field(field, "an integer").get<long long>();
}
double StateReader::real(const std::string& field) const {
  return impl_->field(field, "a real").get<double>();
}
bool StateReader::flag(const std::string& field) const {
  return impl_->field(field, "a boolean").get<bool>();
}
std::string StateReader::text(const std::string& field) const {
  return impl_->field(field, "text").get<std::string>();
}
std::vector<long long> StateReader::integers(const std::string& field) const {
  const nlohmann::json& v = impl_->field(field, "a list of integers");
  for (const auto& x : v)
    if (!is_long_long(x)) impl_->misfit(impl_->where(field) + " holds " + x.dump() + ", not an integer");
  return v.get<std::vector<long long>>();
}
std::vector<std::string> StateReader::texts(const std::string& field) const {
  const nlohmann::json& v = impl_->field(field, "a list of text");
  for (const auto& x : v)
    if (!x.is_string()) impl_->misfit(impl_->where(field) + " holds " + x.dump() + ", not text");
  return v.get<std::vector<std::string>>();
}

bool StateReader::has_section(const std::string& section) const {
  return impl_->sections.count(section) > 0;
}

void StateReader::read_bytes(const std::string& section, DType dtype, std::size_t count, void* out) const {
  const Impl& s = *impl_;
  const auto it = s.sections.find(section);
  if (it == s.sections.end())
    impl::throw_invalid(s.operation,
                        s.path + ": section '" + section + "' is missing (header " + s.header_bytes() + ")");
  const Impl::Section& found = it->second;
  if (found.dtype != dtype || found.count != count)
    impl::throw_invalid(s.operation, s.path + ": section '" + section + "' (byte " + std::to_string(found.first) +
                                         ") holds " + std::to_string(found.count) + " " + to_string(found.dtype) +
                                         ", this run needs " + std::to_string(count) + " " + to_string(dtype));
  std::memcpy(out, s.all.data() + found.first, found.bytes);
}

void StateReader::refuse(const std::string& field, const std::string& what) const {
  impl_->misfit(impl_->where(field) + ": " + what);
}

}  // namespace kdist
