// Both Fashion-MNIST programs' start-up agreement: what each rank does before its Engines exist
// (reading the data set, a checkpoint) either succeeds everywhere or fails everywhere, with the
// lowest failing rank's reason on every rank, instead of leaving the others in the Engines'
// collective construction waiting for a rank that already left.
#pragma once

#include <kdist/core/error.hpp>

#include <mpi.h>
#include <climits>
#include <exception>
#include <functional>
#include <string>

namespace examples {

/// Runs `start` on every rank, then every rank learns whether any failed: a failing rank rethrows
/// its own exception, the others throw kdist::Error with the lowest failing rank's message.
/// Collective over MPI_COMM_WORLD (no Engine exists yet).
inline void agree_on_start(const std::function<void()>& start) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::exception_ptr error;
  std::string text;
  try {
    start();
  } catch (const std::exception& e) {
    error = std::current_exception();
    text = e.what();
  }
  int first = error ? rank : INT_MAX;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == INT_MAX) return;
  int length = static_cast<int>(text.size());
  MPI_Bcast(&length, 1, MPI_INT, first, MPI_COMM_WORLD);
  text.resize(static_cast<std::size_t>(length));
  MPI_Bcast(text.data(), length, MPI_CHAR, first, MPI_COMM_WORLD);
  if (error) std::rethrow_exception(error);
  throw kdist::Error("rank " + std::to_string(first) + " failed before training: " + text);
}

}  // namespace examples
