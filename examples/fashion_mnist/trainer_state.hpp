// Trainer, continued: its checkpoint (the format is checkpoint.hpp's). Included by trainer.hpp.
#pragma once

#include <algorithm>

namespace fmnist {

inline std::vector<std::string> Trainer::parameter_names() const {
  std::vector<std::string> names;
  for (const auto& p : model_.parameters()) names.push_back(p.name);
  return names;
}

inline Flat Trainer::all_ranks_velocities() {
  std::size_t n = 0;
  for (const auto& v : sgd_.velocities()) n += v.extent(0);
  Flat mine("fmnist::velocities", n), all("fmnist::all_velocities", n * static_cast<std::size_t>(world_.size()));
  std::size_t offset = 0;
  for (const auto& v : sgd_.velocities()) {
    Kokkos::deep_copy(Kokkos::subview(mine, std::make_pair(offset, offset + v.extent(0))), v);
    offset += v.extent(0);
  }
  grads_.allgather(Exec(), mine, all, "fashion_mnist checkpoint momenta").wait();
  return all;
}

// Rank 0 writes; every rank then joins one more operation, which rank 0 reaches only once the
// file is written: a failed write reaches the peers there, with its reason (run()).
inline void Trainer::save(const Position& at) {
  if (s_.checkpoint.empty()) return;
  const bool per_rank = s_.reduce == Reduce::adasum;  // each rank has its own momentum
  const Flat momenta = per_rank ? all_ranks_velocities() : Flat();
  if (kfac_) kfac_->sync_factors(Exec());  // rank-local ones (--factor-sync before-inverses), if any
  if (world_.rank() == 0) {
    kdist::StateWriter out(kCheckpointKind);
    write_job_fields(out, s_, world_.size(), at);
    std::vector<Flat> values;
    for (const auto& p : model_.parameters()) values.push_back(p.value);
    add_tensors(out, "param", parameter_names(), values);
    if (!per_rank) add_tensors(out, "velocity", parameter_names(), sgd_.velocities());
    std::size_t offset = 0;
    for (int r = 0; per_rank && r < world_.size(); ++r) {
      std::vector<Flat> pieces;
      for (const auto& v : sgd_.velocities()) {
        pieces.push_back(Kokkos::subview(momenta, std::make_pair(offset, offset + v.extent(0))));
        offset += v.extent(0);
      }
      add_tensors(out, "velocity." + std::to_string(r), parameter_names(), pieces);
    }
    if (kfac_) kfac_->save_to(out);
    out.write(s_.checkpoint, "fashion_mnist --checkpoint");
  }
  grads_.allreduce_values<int>({1}, comm::ReduceOp::sum, "fashion_mnist checkpoint written");
}

// Everything is read and checked first (the job's fields, every section's size, the K-FAC
// state), then written back: a refused checkpoint leaves the model as it was.
inline Position Trainer::resume(const kdist::StateReader& saved) {
  // Every rank read its own copy: one left stale on some node would train from another state.
  comm::agree_on_value(grads_, static_cast<std::int64_t>(saved.checksum()), "fashion_mnist --resume",
                       "checkpoints (checksums of the files read)");
  const Position at = read_job_fields(saved, s_);
  const auto names = parameter_names();
  std::vector<Flat> values;
  for (const auto& p : model_.parameters()) values.push_back(p.value);
  const auto params = read_tensors(saved, "param", names, values);
  const int saved_ranks = static_cast<int>(saved.integer("job.ranks"));
  const bool per_rank = s_.reduce == Reduce::adasum;
  // Averaging: the one momentum. Adasum at the same rank count: this rank's; at another, the
  // mean of the saved ranks' (a rank's own momentum has no counterpart at another count).
  const auto& velocities = sgd_.velocities();
  const auto momenta = !per_rank ? read_tensors(saved, "velocity", names, velocities)
                       : saved_ranks == world_.size()
                           ? read_tensors(saved, "velocity." + std::to_string(world_.rank()), names, velocities)
                           : mean_of_ranks(saved, "velocity", saved_ranks, names, velocities);
  if (kfac_) kfac_->load_from(saved);  // checks all of it before it changes anything
  for (std::size_t i = 0; i < values.size(); ++i) Kokkos::deep_copy(values[i], params[i]);
  for (std::size_t i = 0; i < momenta.size(); ++i) Kokkos::deep_copy(sgd_.velocities()[i], momenta[i]);
  if (world_.rank() == 0 && !s_.quiet)
    std::printf("resumed from %s: epoch %d, step %d, saved at %d rank(s), global batch %lld (%d per rank here)%s\n",
                s_.resume.c_str(), at.epoch + 1, at.batch, saved_ranks, global_batch(s_, world_.size()), s_.batch,
                per_rank && saved_ranks != world_.size() ? "; each rank's momentum: the mean of the saved ranks'" : "");
  if (kfac_ && world_.rank() == 0 && !s_.quiet) std::printf("K-FAC %s\n", kfac_->restored().c_str());
  return at;
}

}  // namespace fmnist
