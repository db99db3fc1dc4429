// The job's checkpoint: one file (core/state_file.hpp, kind "kdist.fashion_mnist"), written by
// rank 0 atomically, resumable at any rank count with the same global batch.
//
//   fields   job.model, job.optimizer, job.reduce, job.seed, job.global_batch, job.limit_batches,
//            job.lr, job.lr_schedule, job.momentum, job.weight_decay, and job.epochs under a
//            schedule that depends on it (cosine): the run it continues (a resume with others is
//            refused naming the field; so is one with no epoch left to train);
//            job.ranks (P when saved), job.epoch and job.batch (the next step), job.loss,
//            job.correct, job.samples, job.skipped, job.seconds (the epoch so far, over all
//            ranks), job.log (the CSV lines so far)
//   sections param.<i>.<name>; velocity.<i>.<name> (averaging: one momentum, the same on every
//            rank), or velocity.<r>.<i>.<name> per rank r (Adasum: each rank has its own);
//            kfac.* (kfac::Preconditioner::save_to)
//
// Everything depends on the global batch, not on P: the batches are nn::ShardedBatches' of the
// global batch, the parameters and the averaged momentum are the same on every rank, and the
// K-FAC state is P-independent. Adasum's per-rank momenta resumed at another P: each rank takes
// their mean (the job says so). A damaged file, another model or another run is refused on every
// rank before anything changes (every rank reads the file, once: open_checkpoint(), whose reader
// gives the batch and then the Trainer its state; core/state_file names the field and its byte
// offset).
#pragma once

#include <kdist/core/atomic_file.hpp>
#include <kdist/core/error.hpp>
#include <kdist/core/state_file.hpp>
#include <kdist/core/timeline.hpp>
#include <kdist/nn/sgd.hpp>

#include <mpi.h>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "options.hpp"

namespace fmnist {

inline constexpr const char* kCheckpointKind = "kdist.fashion_mnist";
inline constexpr const char* kResume = "fashion_mnist --resume";

/// An epoch's sums: this rank's while it runs, over all ranks in a checkpoint and its summary.
struct EpochStats {
  double loss = 0, samples = 0, correct = 0, seconds = 0, skipped = 0;
};

/// Where a run stands: the next step, the epoch's sums so far (over all ranks) and the CSV lines.
struct Position {
  int epoch = 0, batch = 0;
  EpochStats so_far;
  std::vector<std::string> log_lines;
};

/// The global batch a run with these settings takes at `ranks` ranks.
inline long long global_batch(const Settings& s, int ranks) {
  return s.global_batch > 0 ? s.global_batch : static_cast<long long>(s.batch) * ranks * s.workers;
}

/// --resume's checkpoint, read and checked (null without --resume). Read once: the batch and
/// then the Trainer take everything from it.
inline std::unique_ptr<const kdist::StateReader> open_checkpoint(const Settings& s) {
  if (s.resume.empty()) return nullptr;
  return std::make_unique<const kdist::StateReader>(s.resume, kCheckpointKind, kResume);
}

/// --global-batch, or the resumed checkpoint's (`saved`, null when not resuming), split over
/// `ranks` ranks (a global batch they do not divide is refused), and checked against an explicit
/// --batch. Before anything is built.
inline void resolve_batch(Settings& s, int ranks, const kdist::StateReader* saved) {
  if (saved) {
    const long long g = saved->integer("job.global_batch");
    if ((s.global_batch > 0 && s.global_batch != g) || (s.batch_given && s.global_batch == 0 && s.batch * ranks != g))
      saved->refuse("job.global_batch", "the checkpoint's global batch is " + std::to_string(g) + ", this run's " +
                                            std::to_string(global_batch(s, ranks)) +
                                            " (leave out --batch and --global-batch to take the checkpoint's)");
    s.global_batch = g;
  }
  if (s.global_batch == 0) return;
  if (s.global_batch % ranks != 0)
    throw kdist::InvalidArgument("fashion_mnist: a global batch of " + std::to_string(s.global_batch) +
                                 " samples does not divide among " + std::to_string(ranks) +
                                 " ranks; choose a rank count that divides it, or another --global-batch");
  s.batch = static_cast<int>(s.global_batch / ranks);
}

namespace detail {
/// The shortest %g text that reads back as x.
inline std::string real_text(double x) {
  char text[32];
  for (int digits = 6;; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, x);
    if (digits >= 17 || std::strtod(text, nullptr) == x) return text;
  }
}
inline std::string section(const char* what, std::size_t i, const std::string& name) {
  return std::string(what) + "." + std::to_string(i) + "." + name;
}
}  // namespace detail

/// The fields that identify the run, its position and sums (rank 0 builds the file).
inline void write_job_fields(kdist::StateWriter& out, const Settings& s, int ranks, const Position& at) {
  out.set("job.model", name_of(kModelNames, s.model));
  out.set("job.optimizer", name_of(kOptimizerNames, s.optimizer));
  out.set("job.reduce", name_of(kReduceNames, s.reduce));
  out.set("job.seed", static_cast<long long>(s.seed));
  out.set("job.global_batch", global_batch(s, ranks));
  out.set("job.limit_batches", static_cast<long long>(s.limit_batches));
  out.set("job.lr", s.lr);
  out.set("job.lr_schedule", name_of(examples::kScheduleNames, s.schedule));
  out.set("job.momentum", s.momentum);
  out.set("job.weight_decay", s.weight_decay);
  out.set("job.epochs", static_cast<long long>(s.epochs));
  out.set("job.ranks", static_cast<long long>(ranks));
  out.set("job.epoch", static_cast<long long>(at.epoch));
  out.set("job.batch", static_cast<long long>(at.batch));
  out.set("job.loss", at.so_far.loss);
  out.set("job.samples", at.so_far.samples);
  out.set("job.correct", at.so_far.correct);
  out.set("job.seconds", at.so_far.seconds);
  out.set("job.skipped", at.so_far.skipped);
  out.set("job.log", at.log_lines);
}

/// The position in `saved`, once its identifying fields match `s` (refused naming the field).
inline Position read_job_fields(const kdist::StateReader& saved, const Settings& s) {
  const auto same = [&](const char* field, const std::string& want) {
    const std::string got = saved.text(field);
    if (got != want) saved.refuse(field, "the checkpoint's run has " + got + ", this one " + want);
  };
  const auto same_integer = [&](const char* field, long long want, const char* option) {
    const long long got = saved.integer(field);
    if (got != want)
      saved.refuse(field, "the checkpoint's run has " + std::to_string(got) + ", this one " + std::to_string(want) +
                              " (give " + option + " " + std::to_string(got) + ")");
  };
  const auto same_real = [&](const char* field, double want, const char* option) {
    const double got = saved.real(field);
    if (got != want)
      saved.refuse(field, "the checkpoint's run has " + detail::real_text(got) + ", this one " +
                              detail::real_text(want) + " (give " + option + " " + detail::real_text(got) + ")");
  };
  same("job.model", name_of(kModelNames, s.model));
  same("job.optimizer", name_of(kOptimizerNames, s.optimizer));
  same("job.reduce", name_of(kReduceNames, s.reduce));
  same_integer("job.seed", s.seed, "--seed");
  same_integer("job.limit_batches", s.limit_batches, "--limit-batches");
  // The update rule: a resumed run follows the same curve (checkpoints from before these fields
  // were written have none to compare).
  if (saved.has("job.lr")) {
    same_real("job.lr", s.lr, "--lr");
    same("job.lr_schedule", name_of(examples::kScheduleNames, s.schedule));
    same_real("job.momentum", s.momentum, "--momentum");
    same_real("job.weight_decay", s.weight_decay, "--weight-decay");
    if (s.schedule == examples::Schedule::cosine) same_integer("job.epochs", s.epochs, "--epochs");
  }
  Position at;
  const long long epoch = saved.integer("job.epoch"), batch = saved.integer("job.batch");
  if (epoch < 0 || batch < 0 || epoch > INT_MAX || batch > INT_MAX)
    saved.refuse("job.epoch", "position (epoch " + std::to_string(epoch) + ", batch " + std::to_string(batch) +
                                  ") is not in [0, 2^31)");
  at.epoch = static_cast<int>(epoch);
  at.batch = static_cast<int>(batch);
  if (at.epoch >= s.epochs)
    saved.refuse("job.epoch", "the checkpoint's run has finished " + std::to_string(at.epoch) +
                                  " epoch(s): this run's --epochs " + std::to_string(s.epochs) +
                                  " leaves nothing to train (give more)");
  const long long ranks = saved.integer("job.ranks");
  if (ranks < 1 || ranks > INT_MAX) saved.refuse("job.ranks", std::to_string(ranks) + " is not a rank count");
  at.so_far = {saved.real("job.loss"), saved.real("job.samples"), saved.real("job.correct"), saved.real("job.seconds"),
               saved.real("job.skipped")};
  at.log_lines = saved.texts("job.log");
  return at;
}

/// The parameters (and, with `prefix` "velocity", the momenta) as sections.
template <class V>
void add_tensors(kdist::StateWriter& out, const std::string& prefix, const std::vector<std::string>& names,
                 const std::vector<V>& tensors) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tensors[i]);
    out.add(detail::section(prefix.c_str(), i, names[i]), h.data(), h.extent(0));
  }
}

/// Host copies of those sections, checked against `tensors`' sizes (nothing is written back).
template <class V>
std::vector<typename V::HostMirror> read_tensors(const kdist::StateReader& in, const std::string& prefix,
                                                 const std::vector<std::string>& names, const std::vector<V>& tensors) {
  std::vector<typename V::HostMirror> out;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    auto h = Kokkos::create_mirror(Kokkos::HostSpace(), tensors[i]);
    in.read(detail::section(prefix.c_str(), i, names[i]), h.data(), h.extent(0));
    out.push_back(h);
  }
  return out;
}

/// The mean over r < ranks of the sections "<prefix>.<r>.*" (read_tensors).
template <class V>
std::vector<typename V::HostMirror> mean_of_ranks(const kdist::StateReader& in, const std::string& prefix, int ranks,
                                                  const std::vector<std::string>& names,
                                                  const std::vector<V>& tensors) {
  auto mean = read_tensors(in, prefix + ".0", names, tensors);
  for (int r = 1; r < ranks; ++r) {
    const auto next = read_tensors(in, prefix + "." + std::to_string(r), names, tensors);
    for (std::size_t i = 0; i < mean.size(); ++i)
      for (std::size_t j = 0; j < mean[i].extent(0); ++j) mean[i](j) += next[i](j);
  }
  for (auto& m : mean)
    for (std::size_t j = 0; j < m.extent(0); ++j) m(j) /= static_cast<typename V::value_type>(ranks);
  return mean;
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
