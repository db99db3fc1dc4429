// Whole-vector recursive doubling (Algorithm::doubling, flat only): at level l both partners send
// their whole vector and non-finite markers in one message, and both apply the pair operator with
// the lower virtual rank's vector as a, so every rank of a 2^(l+1)-block holds the same bits. At
// two ranks and small vectors level 0 rides in the Engine's signature check (the check payload).
#include <kdist/adasum/impl/builder.hpp>
#include <kdist/core/phase.hpp>

namespace kdist {
namespace adasum {
namespace impl {

template <class T>
void Builder<T>::doubling_level(int l) {
  const int d = 1 << l;
  const int partner = real(virtual_rank_ ^ d);
  const bool lower = (virtual_rank_ & d) == 0;
  const bool mine_raw = raw_ && l == 0 && virtual_rank_ >= extra_,
             theirs_raw = raw_ && l == 0 && (virtual_rank_ ^ d) >= extra_;
  const bool raw_here = mine_raw || theirs_raw;
  const double mine_from = mine_raw ? rank_ : kNoRank, theirs_from = theirs_raw ? partner : kNoRank;
  const int tensors = static_cast<int>(state_.tensors);
  // One message a level: the vector and its non-finite markers packed together (every
  // message costs microseconds of software on a TCP link, more than these bytes do).
  const std::size_t vec_bytes = state_.m * sizeof(T), bytes = vec_bytes + state_.tensors * sizeof(double);
  state_.pack_out.resize(bytes);
  state_.pack_in.resize(bytes);
  if (l == 0 && piggyback_) {
    sched_.step();  // the signature check brought the partner's bytes into pack_in
  } else {
    sched_.step().then([st = shared_] { st->pack(); });
    sched_.step()
        .send(partner, Buffer::host(state_.pack_out.data(), bytes), Tags::halve + l)
        .recv(partner, Buffer::host(state_.pack_in.data(), bytes), Tags::halve + l);
  }
  sched_.then([st = shared_, lower, raw_here, mine_from, theirs_from, tensors, vec_bytes] {
    Phase phase("kdist::adasum::pair");
    copy_bytes(st->tmp(), st->pack_in.data(), vec_bytes);
    copy_bytes(st->other.data(), st->pack_in.data() + vec_bytes, st->tensors * sizeof(double));
    for (int t = 0; t < tensors; ++t) st->bad()[t] = std::min(st->bad()[t], st->other[static_cast<std::size_t>(t)]);
    T* mine = st->S;
    const T* theirs = st->tmp();
    const T* a = lower ? mine : theirs;
    const T* b = lower ? theirs : mine;
    st->whole_partials(a, b);
    if (raw_here) {
      st->flag_nonfinite();
      st->attribute(lower ? mine_from : theirs_from, lower ? theirs_from : mine_from);
    }
    apply_slice(mine, a, b, st->g0, st->m, st->bounds, st->part.data());
  });
  state_.planned.vector_bytes_sent += static_cast<long long>(state_.m) * sizeof(T);
  state_.planned.vector_exchanges += 1;
  state_.planned.vector_messages += 1;
  state_.planned.partial_bytes_sent += static_cast<long long>(state_.tensors) * 8;
}

// The methods above, for the element types Builder is built for.
template void Builder<float>::doubling_level(int l);
template void Builder<double>::doubling_level(int l);

}  // namespace impl
}  // namespace adasum
}  // namespace kdist
