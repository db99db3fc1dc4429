// In place, through the shared window (the data is this rank's block).
//
// Levels whose partner shares the node read its block where it lies, and the all-gather writes
// into it. Reads: a rank tells a halving partner with a one-byte message (after MPI_Win_sync) that
// its vector after the level before is final, and the partner reads only after that message. The
// first read of a partner's input as submitted needs no message when the Engine checks: the
// check's agreement, which comes before the first step, already says that the partner has
// submitted, and every rank syncs its window before submitting (hear_inputs_final). Every read of
// a block (a partials pass, the node average) comes before a message that the reader sends the
// block's owner afterwards and the owner waits for (the partials round; in hierarchical mode the
// node's partials or gather round). Writes: a halving level writes only the kept half of one's own
// block, which the partner does not read. The all-gather pushes: at gather level l a rank writes
// its piece into the level-l partner's block at the same offsets (the last level's apply writes it
// there directly), then tells the partner with a one-byte message, which the partner waits for
// before it pushes the grown piece on. The range pushed into is the partner's sent half of level
// l: nobody reads it after that level's partials (the pusher read it then) and nobody else writes
// it. After its last message a rank syncs its window once more (State::finish), and the caller may
// read and write its buffer as soon as wait() returns: nothing is left that reads it or writes it.
// Pushing instead of reading the partner's piece saves the final "done reading" round and, at the
// last level, a pass: the apply stores each result twice.
#include <kdist/adasum/impl/builder.hpp>
#include <kdist/core/phase.hpp>

#include <algorithm>

namespace kdist {
namespace adasum {
namespace impl {

template <class T>
bool Builder<T>::every_level_in_place() const {
  for (int l = 0; l < levels_; ++l)
    if (!reads_in_place(real(virtual_rank_ ^ (1 << l)))) return false;
  return true;
}

template <class T>
void Builder<T>::tell_and_hear(const std::vector<int>& peers, int tag) {
  sched_.step().then([st = shared_] { st->window->sync(); });
  sched_.step();
  for (std::size_t i = 0; i < peers.size(); ++i) {
    sched_.send(peers[i], Buffer::host(&state_.token, 1), tag);
    sched_.recv(peers[i], Buffer::host(&state_.tokens_in[i], 1), tag);
  }
}

template <class T>
void Builder<T>::hear_inputs_final(const std::vector<int>& peers, int tag) {
  if (!engine_.options().check_consistency) return tell_and_hear(peers, tag);
  sched_.step();
}

template <class T>
void Builder<T>::gather_in_place(int l, int partner) {
  if (l != levels_ - 1) {
    T* theirs = state_.block(partner) + slice_offset();
    sched_.step().then([st = shared_, theirs, lo = lo_, hi = hi_] {
      st->window->sync();  // the piece holds what the partner of the level before pushed
      Phase phase("kdist::adasum::gather");
      std::copy(st->S + lo, st->S + hi, theirs + lo);
    });
  }
  tell_and_hear({partner}, Tags::gathered + l);
  state_.planned.in_place_levels += 1;
  lo_ = slices_[static_cast<std::size_t>(l)].first;
  hi_ = slices_[static_cast<std::size_t>(l)].second;
}

// The methods above, for the element types Builder is built for.
template bool Builder<float>::every_level_in_place() const;
template bool Builder<double>::every_level_in_place() const;
template void Builder<float>::tell_and_hear(const std::vector<int>& peers, int tag);
template void Builder<double>::tell_and_hear(const std::vector<int>& peers, int tag);
template void Builder<float>::hear_inputs_final(const std::vector<int>& peers, int tag);
template void Builder<double>::hear_inputs_final(const std::vector<int>& peers, int tag);
template void Builder<float>::gather_in_place(int l, int partner);
template void Builder<double>::gather_in_place(int l, int partner);

}  // namespace impl
}  // namespace adasum
}  // namespace kdist
