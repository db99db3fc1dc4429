// Agreeing on the outcome of work each rank did on its own (reading a file, rank 0 writing one):
// every rank learns whether it failed anywhere, and why.
//
//   std::exception_ptr error;
//   try { read_my_file(); } catch (...) { error = std::current_exception(); }
//   kdist::comm::agree_on_outcome(engine, error, "kdist::kfac::Preconditioner::load");
//   kdist::comm::agree_on_outcome_of(engine, "kdist::kfac::Preconditioner::load", [&] { read_my_file(); });  // the
//   same
//
// Collective and checked, through the Engine's own operations; unlike Engine::fail, the Engine
// stays usable, so a caller may catch the error and go on (skip a checkpoint, try another file).
// `operation` must be the same on every rank: it labels the collectives (a file's path, which may
// differ, belongs in the message). When no rank failed it returns, after one all-reduce of one int. Otherwise the
// failing ranks rethrow their own exceptions, type kept, and every other rank throws RemoteError naming `operation`,
// the lowest failing rank and that rank's what() (for a non-std exception, "an exception that is not a
// std::exception"). Every rank holds the message before any rank leaves, so a failing rank that then destroys its
// Engine cannot overtake it.
#pragma once

#include <kdist/comm/engine.hpp>

#include <cstdint>
#include <exception>
#include <string>

namespace kdist {
namespace comm {

void agree_on_outcome(Engine& engine, std::exception_ptr error, const std::string& operation);

/// The same for `work` run on this rank (a rank with nothing to do passes work that does
/// nothing, e.g. `[&] { if (engine.rank() == 0) write(); }`): what it throws is the error.
template <class Work>
void agree_on_outcome_of(Engine& engine, const std::string& operation, Work&& work) {
  std::exception_ptr error;
  try {
    work();
  } catch (...) {
    error = std::current_exception();
  }
  agree_on_outcome(engine, error, operation);
}

/// Collective and checked: returns when every rank passed the same `value` (one all-reduce of two
/// numbers). Otherwise every rank throws the same InvalidArgument: "<operation>: ranks hold
/// different <what>: rank a has <x>, rank b <y>" (the lowest ranks holding the smallest and the
/// largest value). For state each rank read on its own, e.g. a file's checksum
/// (StateReader::checksum): a node with a stale copy would otherwise train on another state.
void agree_on_value(Engine& engine, std::int64_t value, const std::string& operation, const std::string& what);

}  // namespace comm
}  // namespace kdist
