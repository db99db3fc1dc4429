// Vector halving, distance doubling: at level l the partner is virtual rank v XOR 2^l; the lower
// one keeps the first half of its current slice and sends the rest, in chunks whose partial sums
// are added while the next chunk moves. The partials [a.b, a.a, b.b] of each tensor are summed
// over the 2^(l+1) holders of pieces of a and b (point-to-point recursive doubling in a fixed
// order, so every holder gets bit-identical sums) and applied; then the slices are all-gathered
// in reverse, the last level applying chunk by chunk while the gather sends.
#include <kdist/adasum/impl/builder.hpp>
#include <kdist/core/phase.hpp>

#include <algorithm>

namespace kdist {
namespace adasum {
namespace impl {

template <class T>
typename Builder<T>::Level Builder<T>::plan_level(int l) {
  const int d = 1 << l;
  Level lv;
  lv.l = l;
  lv.partner = real(virtual_rank_ ^ d);
  lv.lower = (virtual_rank_ & d) == 0;
  // Level 0 of flat mode reads raw inputs, except those of ranks that folded one in.
  const bool mine_raw = raw_ && l == 0 && virtual_rank_ >= extra_,
             theirs_raw = raw_ && l == 0 && (virtual_rank_ ^ d) >= extra_;
  lv.raw_here = mine_raw || theirs_raw;
  lv.mine_from = mine_raw ? rank_ : kNoRank;
  lv.theirs_from = theirs_raw ? lv.partner : kNoRank;
  const std::size_t mid = lo_ + (hi_ - lo_) / 2;
  lv.keep_lo = lv.lower ? lo_ : mid;
  lv.keep_hi = lv.lower ? mid : hi_;
  lv.send_lo = lv.lower ? mid : lo_;
  lv.send_hi = lv.lower ? hi_ : mid;
  slices_.push_back({lo_, hi_});
  return lv;
}

template <class T>
void Builder<T>::halving_level(int l) {
  const Level lv = plan_level(l);
  const bool in_place = reads_in_place(lv.partner);
  // a is the lower virtual rank's vector; the partner's piece is in tmp or its block.
  const T* theirs = in_place ? state_.block(lv.partner) + slice_offset() + lv.keep_lo : nullptr;
  auto a_b = [lower = lv.lower, keep_lo = lv.keep_lo, theirs](State<T>& st) {
    const T* mine = st.S + keep_lo;
    const T* other = theirs ? theirs : st.tmp();
    return lower ? std::make_pair(mine, other) : std::make_pair(other, mine);
  };
  if (in_place) {
    if (lv.mine_from != kNoRank && lv.theirs_from != kNoRank)  // both inputs as submitted (symmetric)
      hear_inputs_final({lv.partner}, Tags::ready + l);
    else
      tell_and_hear({lv.partner}, Tags::ready + l);
    sched_.then([st = shared_, keep_lo = lv.keep_lo, keep_hi = lv.keep_hi] {
      st->window->sync();
      st->stream.start(keep_lo, keep_hi, st->g0, &st->bounds, st->part.data());
    });
    sched_.step();
    state_.planned.in_place_levels += 1;
  } else {
    receive_in_chunks(lv, a_b);
  }
  sched_.then([st = shared_, a_b, lv] {
    Phase phase("kdist::adasum::partials");
    const auto ab = a_b(*st);
    st->stream.finish(ab.first, ab.second);
    if (lv.raw_here) {
      st->flag_nonfinite();
      st->attribute(lv.lower ? lv.mine_from : lv.theirs_from, lv.lower ? lv.theirs_from : lv.mine_from);
    }
  });
  node_sum(Tags::node + l);
  sum_partials_over_holders(l);
  // The last level applies its first chunk here and the rest while the all-gather sends; in
  // place, it writes the result into the partner's block as well (the all-gather's push).
  const std::size_t keep_n = lv.keep_hi - lv.keep_lo;
  const std::size_t apply_n = l == levels_ - 1 && !in_place ? std::min(chunk_for(lv.partner), keep_n) : keep_n;
  T* push_to = l == levels_ - 1 && in_place ? state_.block(lv.partner) + slice_offset() + lv.keep_lo : nullptr;
  sched_.step().then([st = shared_, a_b, keep_lo = lv.keep_lo, apply_n, push_to] {
    Phase phase("kdist::adasum::apply");
    const auto ab = a_b(*st);
    apply_slice(st->S + keep_lo, ab.first, ab.second, st->g0 + keep_lo, apply_n, st->bounds, st->part.data(), push_to);
  });
  lo_ = lv.keep_lo;
  hi_ = lv.keep_hi;
  last_lower_ = lv.lower;
}

template <class T>
template <class AB>
void Builder<T>::receive_in_chunks(const Level& lv, AB a_b) {
  const std::size_t K = chunk_for(lv.partner), keep_n = lv.keep_hi - lv.keep_lo, send_n = lv.send_hi - lv.send_lo;
  const std::size_t chunks = std::max<std::size_t>({1, (keep_n + K - 1) / K, (send_n + K - 1) / K});
  for (std::size_t c = 0; c < chunks; ++c) {
    sched_.step();
    const std::size_t s0 = std::min(c * K, send_n), s1 = std::min(s0 + K, send_n);
    const std::size_t r0 = std::min(c * K, keep_n), r1 = std::min(r0 + K, keep_n);
    if (s1 > s0) sched_.send(lv.partner, Buffer::host(state_.S + lv.send_lo + s0, s1 - s0), Tags::halve + lv.l);
    if (r1 > r0) sched_.recv(lv.partner, Buffer::host(state_.tmp() + r0, r1 - r0), Tags::halve + lv.l);
    if (s1 > s0) state_.planned.vector_messages += 1;
    if (c == 0) {
      sched_.during([st = shared_, keep_lo = lv.keep_lo, keep_hi = lv.keep_hi] {
        st->stream.start(keep_lo, keep_hi, st->g0, &st->bounds, st->part.data());
      });
    } else {  // the chunk before has arrived: sum it while this one moves
      sched_.during([st = shared_, a_b, upto = lv.keep_lo + r0] {
        Phase phase("kdist::adasum::partials");
        const auto ab = a_b(*st);
        st->stream.feed(ab.first, ab.second, upto);
      });
    }
  }
  state_.planned.vector_bytes_sent += static_cast<long long>(send_n) * sizeof(T);
  state_.planned.vector_exchanges += 1;
}

template <class T>
void Builder<T>::sum_partials_over_holders(int l) {
  for (int r = 0; r <= l; ++r) {
    const int peer = real(virtual_rank_ ^ (1 << r));
    sched_.step()
        .send(peer, Buffer::host(state_.part.data(), state_.msg()), Tags::cross + 32 * l + r)
        .recv(peer, Buffer::host(state_.other.data(), state_.msg()), Tags::cross + 32 * l + r)
        .then([st = shared_] { st->add_into_part(st->other); });
    state_.planned.partial_bytes_sent += static_cast<long long>(msg()) * 8;
  }
  state_.planned.partial_reductions += 1;
}

template <class T>
void Builder<T>::gather_level(int l) {
  const int partner = real(virtual_rank_ ^ (1 << l));
  if (reads_in_place(partner)) return gather_in_place(l, partner);
  const std::size_t plo = slices_[static_cast<std::size_t>(l)].first;
  const std::size_t phi = slices_[static_cast<std::size_t>(l)].second;
  const std::size_t olo = lo_ == plo ? hi_ : plo, ohi = lo_ == plo ? phi : lo_;  // partner's piece
  const std::size_t K = chunk_for(partner), mine_n = hi_ - lo_, theirs_n = ohi - olo;
  const std::size_t chunks = std::max<std::size_t>({1, (mine_n + K - 1) / K, (theirs_n + K - 1) / K});
  const bool applying = l == levels_ - 1;
  for (std::size_t c = 0; c < chunks; ++c) {
    sched_.step();
    const std::size_t s0 = std::min(c * K, mine_n), s1 = std::min(s0 + K, mine_n);
    const std::size_t r0 = std::min(c * K, theirs_n), r1 = std::min(r0 + K, theirs_n);
    if (s1 > s0) sched_.send(partner, Buffer::host(state_.S + lo_ + s0, s1 - s0), Tags::gather + l);
    if (r1 > r0) sched_.recv(partner, Buffer::host(state_.S + olo + r0, r1 - r0), Tags::gather + l);
    if (s1 > s0) state_.planned.vector_messages += 1;
    const std::size_t next0 = std::min(s1, mine_n), next1 = std::min(next0 + K, mine_n);
    if (applying && next1 > next0) {
      sched_.during([st = shared_, lower = last_lower_, lo = lo_, next0, next1] {
        Phase phase("kdist::adasum::apply");
        T* mine = st->S + lo + next0;
        const T* theirs = st->tmp() + next0;
        apply_slice(mine, lower ? mine : theirs, lower ? theirs : mine, st->g0 + lo + next0, next1 - next0, st->bounds,
                    st->part.data());
      });
    }
  }
  state_.planned.vector_bytes_sent += static_cast<long long>(mine_n) * sizeof(T);
  state_.planned.vector_exchanges += 1;
  lo_ = plo;
  hi_ = phi;
}

// The methods above, for the element types Builder is built for.
template typename Builder<float>::Level Builder<float>::plan_level(int l);
template typename Builder<double>::Level Builder<double>::plan_level(int l);
template void Builder<float>::halving_level(int l);
template void Builder<double>::halving_level(int l);
template void Builder<float>::sum_partials_over_holders(int l);
template void Builder<double>::sum_partials_over_holders(int l);
template void Builder<float>::gather_level(int l);
template void Builder<double>::gather_level(int l);

}  // namespace impl
}  // namespace adasum
}  // namespace kdist
