// kdist's state files (the K-FAC state, the main job's checkpoint): one file of named fields and
// named binary sections, every byte covered by a CRC-32, written atomically, read back checked.
//
//   "KDIST-STATE\n" | header length (decimal) " " header CRC-32 (hex) "\n" | JSON header | sections
//   header: {"kind": "...", "version": 1, "fields": {name: value, ...},
//            "sections": [{"name", "dtype", "count", "offset", "crc32"}, ...]}
//   section offsets count from the first byte after the header.
//
// StateWriter collects fields and sections (copied at add()), then write() replaces the file
// atomically (core/atomic_file.hpp). StateReader reads the whole file and checks the magic, the
// header's length, CRC and JSON, its kind and version, and every section's bounds and CRC before
// anything is returned. Every refusal is a kdist::Error (damage) or kdist::InvalidArgument (a
// file that is sound but does not fit: refuse()) whose message names the operation, the file,
// the field or section, and its byte offset in the file. Fields hold integers, reals, booleans,
// text, and lists of integers or text; asking for a missing field or another type is refused.
// The reader keeps the file in memory: state files are model-sized.
#pragma once

#include <kdist/core/dtype.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace kdist {

class StateWriter {
 public:
  explicit StateWriter(std::string kind);
  ~StateWriter();
  StateWriter(const StateWriter&) = delete;
  StateWriter& operator=(const StateWriter&) = delete;

  void set(const std::string& field, long long value);
  void set(const std::string& field, double value);
  void set_flag(const std::string& field, bool value);
  void set(const std::string& field, const std::string& value);
  void set(const std::string& field, const std::vector<long long>& values);
  void set(const std::string& field, const std::vector<std::string>& values);

  /// Copies `count` elements; a name given twice is an InvalidArgument.
  template <class T>
  void add(const std::string& section, const T* data, std::size_t count) {
    add_bytes(section, dtype_of<T>(), count, data);
  }
  /// The whole file's bytes.
  std::string encode() const;
  /// encode() into `path`, atomically; Error naming `operation` and the path on failure.
  void write(const std::string& path, const char* operation) const;

 private:
  void add_bytes(const std::string& section, DType dtype, std::size_t count, const void* data);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class StateReader {
 public:
  /// Reads and checks `path` (see above); `operation` heads every message.
  StateReader(const std::string& path, const std::string& kind, std::string operation);
  ~StateReader();
  StateReader(StateReader&&) noexcept;
  StateReader(const StateReader&) = delete;
  StateReader& operator=(const StateReader&) = delete;

  const std::string& path() const noexcept;
  /// The header's CRC-32. The header holds every field and every section's CRC, so it stands for
  /// the whole file: ranks that read files with equal checksums read the same state.
  unsigned long checksum() const noexcept;
  bool has(const std::string& field) const;
  long long integer(const std::string& field) const;
  double real(const std::string& field) const;
  bool flag(const std::string& field) const;
  std::string text(const std::string& field) const;
  std::vector<long long> integers(const std::string& field) const;
  std::vector<std::string> texts(const std::string& field) const;

  bool has_section(const std::string& section) const;
  /// Copies section `section` into `out`; refused unless it holds `count` elements of T.
  template <class T>
  void read(const std::string& section, T* out, std::size_t count) const {
    read_bytes(section, dtype_of<T>(), count, out);
  }
  /// InvalidArgument: "<operation>: <file>: field '<field>' (byte <offset>): <what>".
  [[noreturn]] void refuse(const std::string& field, const std::string& what) const;

 private:
  void read_bytes(const std::string& section, DType dtype, std::size_t count, void* out) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdist
