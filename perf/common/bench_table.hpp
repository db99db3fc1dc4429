// Output of every kdist benchmark: one row per size, first column the size, last column the
// ratio to the baseline measured in the same run. Where a row is a case rather than a size, the
// case comes first (bench_kfac's configuration, kdist_portability's kernel). Printed as an
// aligned table and, with --json FILE, written as {"benchmark", "columns", "rows", "context"},
// each row's keys in column order. The context always holds "host_blas" (core/host_blas.hpp): the
// BLAS and the kernels it ran, without which a host figure cannot be compared.
#pragma once

#include <kdist/core/host_blas.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace kdist_bench {

class Table {
 public:
  Table(std::string name, std::vector<std::string> columns) : name_(std::move(name)), columns_(std::move(columns)) {
    context_["host_blas"] = kdist::host_blas().summary();
  }

  /// Free-form facts about the run (threads, ranks, settings) stored with the rows.
  void context(const std::string& key, const nlohmann::json& value) { context_[key] = value; }

  /// Ranks other than 0 of an MPI benchmark keep their rows silent.
  void set_print(bool on) { print_ = on; }

  void print_header() const {
    if (!print_) return;
    for (const auto& c : columns_) std::printf("%14s ", c.c_str());
    std::printf("\n");
    std::fflush(stdout);
  }

  /// Adds a row (values in column order) and prints it at once.
  void row(const std::vector<nlohmann::json>& values) {
    if (values.size() != columns_.size()) throw std::logic_error("bench row has the wrong number of columns");
    nlohmann::ordered_json r = nlohmann::ordered_json::object();
    for (std::size_t i = 0; i < values.size(); ++i) {
      r[columns_[i]] = values[i];
      if (!print_) continue;
      const auto& v = values[i];
      if (v.is_number_float())
        std::printf("%14.4g ", v.get<double>());
      else if (v.is_number())
        std::printf("%14lld ", v.get<long long>());
      else
        std::printf("%14s ", v.get<std::string>().c_str());
    }
    if (print_) std::printf("\n");
    std::fflush(stdout);
    rows_.push_back(std::move(r));
  }

  void write_json(const std::string& path) const {
    if (path.empty()) return;
    std::ofstream out(path);
    if (!out) throw std::runtime_error("cannot write '" + path + "'");
    nlohmann::ordered_json doc;
    doc["benchmark"] = name_;
    doc["columns"] = columns_;
    doc["rows"] = rows_;
    doc["context"] = nlohmann::ordered_json::parse(context_.dump());
    out << doc.dump(1) << '\n';
  }

 private:
  std::string name_;
  std::vector<std::string> columns_;
  std::vector<nlohmann::ordered_json> rows_;
  bool print_ = true;
  nlohmann::json context_ = nlohmann::json::object();
};

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace kdist_bench
