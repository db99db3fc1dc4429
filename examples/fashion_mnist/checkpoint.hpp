// The job's checkpoint: every rank writes its own file "<path>.rank<r>" (parameters, its SGD
// velocities, which differ between ranks under Adasum, the next epoch and the CSV lines so far),
// atomically; the K-FAC state goes to "<path>.kfac" through Preconditioner::save. Resuming needs
// the same options and rank count; a file that does not fit is an error naming it.
// The Chrome trace is gathered to rank 0 and written there.
#pragma once

#include <kdist/core/atomic_file.hpp>
#include <kdist/core/error.hpp>
#include <kdist/core/timeline.hpp>
#include <kdist/nn/sgd.hpp>

#include <mpi.h>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fmnist {

namespace detail {
inline std::string rank_file(const std::string& path, int rank) {
  return path + ".rank" + std::to_string(rank);
}

template <class V>
void put(std::string& out, const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  const std::size_t n = h.extent(0);
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out.append(reinterpret_cast<const char*>(h.data()), n * sizeof(typename V::value_type));
}

template <class V>
void get(std::istream& in, const V& v, const std::string& path) {
  std::size_t n = 0;
  in.read(reinterpret_cast<char*>(&n), sizeof n);
  if (!in || n != v.extent(0))
    throw kdist::Error("fashion_mnist --resume: " + path + " does not fit this model (" + v.label() + ")");
  auto h = Kokkos::create_mirror_view(v);
  in.read(reinterpret_cast<char*>(h.data()), static_cast<std::streamsize>(n * sizeof(typename V::value_type)));
  if (!in) throw kdist::Error("fashion_mnist --resume: " + path + " is truncated");
  Kokkos::deep_copy(v, h);
}
}  // namespace detail

template <class P, class O>
void save_checkpoint(const std::string& path, int rank, int next_epoch, const std::vector<P>& params, const O& sgd,
                     const std::vector<std::string>& log_lines) {
  std::string out = "kdist-fashion-mnist-checkpoint 1\n" + std::to_string(next_epoch) + "\n" +
                    std::to_string(log_lines.size()) + "\n";
  for (const auto& l : log_lines) out += l + "\n";
  for (const auto& p : params) detail::put(out, p.value);
  for (const auto& v : sgd.velocities()) detail::put(out, v);
  kdist::write_file_atomically(detail::rank_file(path, rank), out, "fashion_mnist --checkpoint");
}

/// Returns the epoch to continue from.
template <class P, class O>
int load_checkpoint(const std::string& path, const std::vector<P>& params, O& sgd,
                    std::vector<std::string>* log_lines) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string file = detail::rank_file(path, rank);
  std::ifstream in(file, std::ios::binary);
  std::string magic;
  std::getline(in, magic);
  if (!in || magic != "kdist-fashion-mnist-checkpoint 1")
    throw kdist::Error("fashion_mnist --resume: " + file + " is missing or not a checkpoint");
  int epoch = 0;
  std::size_t lines = 0;
  in >> epoch >> lines;
  in.ignore(1);
  log_lines->clear();
  for (std::size_t i = 0; i < lines; ++i) {
    std::string l;
    std::getline(in, l);
    log_lines->push_back(l);
  }
  for (const auto& p : params) detail::get(in, p.value, file);
  for (const auto& v : sgd.velocities()) detail::get(in, v, file);
  return epoch;
}

/// The parameters alone, raw, in model order (compare_models reads them).
template <class P>
void save_model(const std::string& path, const std::vector<P>& params) {
  std::string out;
  for (const auto& p : params) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p.value);
    out.append(reinterpret_cast<const char*>(h.data()), h.extent(0) * sizeof(*h.data()));
  }
  kdist::write_file_atomically(path, out, "fashion_mnist --save-model");
}

inline void write_trace(const std::string& path, const kdist::Timeline& timeline) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string mine = timeline.to_json();
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < size; ++r)
    offsets[static_cast<std::size_t>(r)] = total, total += lengths[static_cast<std::size_t>(r)];
  std::string all(static_cast<std::size_t>(rank == 0 ? total : 0), '\0');
  MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  std::vector<std::string> docs;
  for (int r = 0; r < size; ++r)
    docs.push_back(all.substr(static_cast<std::size_t>(offsets[static_cast<std::size_t>(r)]),
                              static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)])));
  kdist::write_file_atomically(path, kdist::Timeline::merge(docs), "fashion_mnist --trace");
}

}  // namespace fmnist
