// Ranks beyond the largest power of two (extra_ = cross_size_ - pow2_ of them): odd rank 2i+1
// (i < extra_) hands its vector to 2i, which combines the two as (a, b) = (its own, the odd's)
// before the levels and hands the result back after them. Flat mode's fold reads raw inputs, so
// it attributes non-finite values to their rank.
#include <kdist/adasum/impl/builder.hpp>
#include <kdist/core/phase.hpp>

namespace kdist {
namespace adasum {
namespace impl {

template <class T>
void Builder<T>::fold_away() {
  const int peer = cross_rank(cross_index_ - 1);
  send_slice(peer, Tags::fold, Tags::fold_bad);
  sched_.step()
      .recv(peer, Buffer::host(state_.S, state_.m), Tags::unfold)
      .recv(peer, Buffer::host(state_.bad(), state_.tensors), Tags::unfold_bad);
  state_.planned.vector_exchanges += 1;
}

template <class T>
void Builder<T>::send_slice(int peer, int tag, int tag_bad) {
  sched_.step()
      .send(peer, Buffer::host(state_.S, state_.m), tag)
      .send(peer, Buffer::host(state_.bad(), state_.tensors), tag_bad);
  state_.planned.vector_bytes_sent += static_cast<long long>(state_.m) * sizeof(T);
  state_.planned.vector_exchanges += 1;
  state_.planned.vector_messages += 1;
}

template <class T>
void Builder<T>::fold_in() {
  const int odd = cross_rank(cross_index_ + 1);
  state_.fold_bad.assign(state_.tensors, kNoRank);
  sched_.step()
      .recv(odd, Buffer::host(state_.tmp(), state_.m), Tags::fold)
      .recv(odd, Buffer::host(state_.fold_bad.data(), state_.tensors), Tags::fold_bad)
      .then([st = shared_, raw = raw_, me = rank_, odd] {
        Phase phase("kdist::adasum::fold_in");
        st->whole_partials(st->S, st->tmp());
        if (raw) {
          st->flag_nonfinite();
          st->attribute(me, odd);
        }
        for (std::size_t t = 0; t < st->tensors; ++t) st->bad()[t] = std::min(st->bad()[t], st->fold_bad[t]);
      });
  state_.planned.vector_exchanges += 1;
  node_sum(Tags::node + 63);
  if (node_size_ > 1) state_.planned.partial_reductions += 1;
  sched_.step().then([st = shared_] {
    Phase phase("kdist::adasum::apply");
    apply_slice(st->S, st->S, st->tmp(), st->g0, st->m, st->bounds, st->part.data());
  });
}

// The methods above, for the element types Builder is built for.
template void Builder<float>::fold_away();
template void Builder<double>::fold_away();
template void Builder<float>::send_slice(int peer, int tag, int tag_bad);
template void Builder<double>::send_slice(int peer, int tag, int tag_bad);
template void Builder<float>::fold_in();
template void Builder<double>::fold_in();

}  // namespace impl
}  // namespace adasum
}  // namespace kdist
