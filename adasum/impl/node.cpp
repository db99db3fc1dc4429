// Hierarchical mode (node size s > 1): average inside each node by reduce-scatter of a padded
// copy (or, in place, by reading every node peer's block), run the cross-node algorithm on this
// rank's slice with each tensor's partials summed over the node's slices too, then all-gather the
// slices inside the node (or push them into the peers' blocks).
#include <kdist/adasum/impl/builder.hpp>
#include <kdist/core/phase.hpp>

namespace kdist {
namespace adasum {
namespace impl {

template <class T>
void Builder<T>::node_average() {
  if (node_size_ <= 1) {
    state_.m = state_.n;
    state_.g0 = 0;
    state_.S = state_.data;
    return;
  }
  const std::size_t k = static_cast<std::size_t>(node_size_);
  state_.m = (state_.n + k - 1) / k;
  state_.g0 = state_.m * static_cast<std::size_t>(state_.local);
  state_.node_parts.assign(k, std::vector<double>(state_.msg(), 0.0));
  if (node_in_place_) return node_average_in_place();
  state_.padded.assign(state_.m * k, T(0));
  std::copy(state_.data, state_.data + state_.n, state_.padded.begin());
  state_.slice.assign(state_.m, T(0));
  state_.S = state_.slice.data();
  sched_.step()
      .reduce_scatter(comm::Group::of(hier_->node()), Buffer::host(state_.padded.data(), state_.padded.size()),
                      Buffer::host(state_.slice.data(), state_.m))
      .then([st = shared_, k] {
        Phase phase("kdist::adasum::node_average");
        const T f = T(1) / static_cast<T>(k);
        for (auto& x : st->slice) x *= f;
      });
}

template <class T>
void Builder<T>::node_sum(int tag) {
  if (node_size_ <= 1) return;
  sched_.step();
  for (int l = 0; l < node_size_; ++l) {
    if (l == state_.local) continue;
    sched_.send(hier_->node_peer(l), Buffer::host(state_.part.data(), state_.msg()), tag);
    sched_.recv(hier_->node_peer(l), Buffer::host(state_.node_parts[static_cast<std::size_t>(l)].data(), state_.msg()),
                tag);
  }
  sched_.then([st = shared_] { st->sum_node(); });
  state_.planned.partial_bytes_sent += static_cast<long long>(node_size_ - 1) * msg() * 8;
}

template <class T>
void Builder<T>::node_average_in_place() {
  std::vector<int> peers;
  for (int l = 0; l < node_size_; ++l)
    if (l != state_.local) peers.push_back(hier_->node_peer(l));
  std::vector<const T*> blocks;
  for (int l = 0; l < node_size_; ++l) blocks.push_back(state_.block(hier_->node_peer(l)));
  state_.S = state_.data + state_.g0;
  hear_inputs_final(peers, Tags::node_ready);
  sched_.then([st = shared_, blocks] {
    st->window->sync();
    Phase phase("kdist::adasum::node_average");
    const T f = T(1) / static_cast<T>(blocks.size());
    for (std::size_t i = 0; i < st->m; ++i) {
      const std::size_t g = st->g0 + i;
      T x = T(0);
      if (g < st->n)
        for (const T* b : blocks) x += b[g];
      st->S[i] = x * f;
    }
  });
  state_.planned.in_place_levels += 1;
}

template <class T>
void Builder<T>::node_gather_in_place() {
  std::vector<int> peers;
  std::vector<T*> blocks;
  for (int l = 0; l < node_size_; ++l)
    if (l != state_.local) {
      peers.push_back(hier_->node_peer(l));
      blocks.push_back(state_.block(hier_->node_peer(l)));
    }
  sched_.step().then([st = shared_, blocks] {
    st->window->sync();
    Phase phase("kdist::adasum::node_gather");
    const std::size_t lo = std::min(st->g0, st->n), hi = std::min(st->g0 + st->m, st->n);
    for (T* b : blocks) std::copy(st->data + lo, st->data + hi, b + lo);
  });
  tell_and_hear(peers, Tags::node_gathered);
  state_.planned.in_place_levels += 1;
}

template <class T>
void Builder<T>::node_gather() {
  if (node_size_ <= 1) return;
  if (levels_ == 0) node_sum(Tags::node + 62);  // one node: still agree on non-finite inputs
  if (node_in_place_) return node_gather_in_place();
  sched_.step()
      .allgather(comm::Group::of(hier_->node()), Buffer::host(state_.slice.data(), state_.m),
                 Buffer::host(state_.padded.data(), state_.padded.size()))
      .then([st = shared_] { std::copy(st->padded.begin(), st->padded.begin() + static_cast<long>(st->n), st->data); });
}

// The methods above, for the element types Builder is built for.
template void Builder<float>::node_average();
template void Builder<double>::node_average();
template void Builder<float>::node_sum(int tag);
template void Builder<double>::node_sum(int tag);
template void Builder<float>::node_average_in_place();
template void Builder<double>::node_average_in_place();
template void Builder<float>::node_gather_in_place();
template void Builder<double>::node_gather_in_place();
template void Builder<float>::node_gather();
template void Builder<double>::node_gather();

}  // namespace impl
}  // namespace adasum
}  // namespace kdist
