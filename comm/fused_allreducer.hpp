// FusedAllreducer: tensors are handed over in ready order (flat, or square symmetric sent as
// their packed upper triangle), copied into the fusion buffer of their group, and each group is
// launched as soon as its last member arrives; wait() scatters the results back. The reduction
// is pluggable: sum, average, or any function that turns a buffer with tensor boundaries into a
// Request (Adasum plugs in here, coefficients per tensor).
#pragma once

#include <kdist/comm/engine.hpp>
#include <kdist/comm/fusion_plan.hpp>
#include <kdist/core/packed.hpp>
#include <kdist/core/timer.hpp>

#include <functional>
#include <string>
#include <vector>

namespace kdist {
namespace comm {

template <class T>
class FusedAllreducer {
 public:
  using Buffer = Kokkos::View<T*, Kokkos::HostSpace>;
  using Vector = Kokkos::View<T*, Kokkos::HostSpace>;
  using Symmetric = Kokkos::View<T**, Kokkos::LayoutLeft, Kokkos::HostSpace>;
  /// Reduces `buffer` in place; `bounds` are the element offsets of the tensors in it
  /// (bounds.front() == 0, bounds.back() == buffer.extent(0)), `labels` their names.
  using Reduction = std::function<Request(Engine&, const Buffer& buffer, const std::vector<std::size_t>& bounds,
                                          const std::vector<std::string>& labels, const std::string& group)>;

  static Reduction sum() { return elementwise(ReduceOp::sum); }
  static Reduction average() { return elementwise(ReduceOp::average); }
  static Reduction elementwise(ReduceOp op) {
    return [op](Engine& e, const Buffer& b, const std::vector<std::size_t>&, const std::vector<std::string>&,
                const std::string& group) { return e.allreduce(Kokkos::DefaultHostExecutionSpace(), b, op, group); };
  }

  struct Tensor {
    std::string label;
    std::size_t dim = 0;     ///< elements (flat) or matrix dimension (symmetric)
    bool symmetric = false;  ///< sent as the packed upper triangle, dim(dim+1)/2 elements
    std::size_t elements() const { return symmetric ? packed_size(dim) : dim; }
  };

  FusedAllreducer(Engine& engine, std::vector<Tensor> tensors, FusionPlan plan, Reduction reduction = average(),
                  const Clock* clock = nullptr)
      : engine_(engine), tensors_(std::move(tensors)), reduction_(std::move(reduction)), clock_(clock) {
    set_plan(std::move(plan));
  }

  /// Replaces the plan (e.g. after decide_plan_on_root with measured ready times); call between
  /// iterations.
  void set_plan(FusionPlan plan) {
    if (plan.group_end.empty() ? !tensors_.empty() : plan.group_end.back() != static_cast<int>(tensors_.size()))
      kdist::impl::throw_invalid("kdist::comm::FusedAllreducer",
                                 "plan covers " + std::to_string(plan.group_end.empty() ? 0 : plan.group_end.back()) +
                                     " tensors, there are " + std::to_string(tensors_.size()));
    plan_ = std::move(plan);
    groups_.assign(static_cast<std::size_t>(plan_.groups()), Group{});
    int begin = 0;
    for (int g = 0; g < plan_.groups(); ++g) {
      Group& gr = groups_[static_cast<std::size_t>(g)];
      gr.begin = begin;
      gr.end = plan_.group_end[static_cast<std::size_t>(g)];
      gr.bounds.push_back(0);
      for (int i = gr.begin; i < gr.end; ++i)
        gr.bounds.push_back(gr.bounds.back() + tensors_[static_cast<std::size_t>(i)].elements());
      gr.buffer = Buffer(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kdist::comm::fusion_buffer[" + std::to_string(g) + "]"),
          gr.bounds.back());
      for (int i = gr.begin; i < gr.end; ++i) gr.labels.push_back(tensors_[static_cast<std::size_t>(i)].label);
      gr.label = "fused[" + tensors_[static_cast<std::size_t>(gr.begin)].label + ".." +
                 tensors_[static_cast<std::size_t>(gr.end - 1)].label + "]";
      begin = gr.end;
    }
    flat_.assign(tensors_.size(), Vector());
    sym_.assign(tensors_.size(), Symmetric());
    ready_.assign(tensors_.size(), 0.0);
    next_ = 0;
  }

  const FusionPlan& plan() const noexcept { return plan_; }
  const std::vector<Tensor>& tensors() const noexcept { return tensors_; }

  /// Starts an iteration (ready times are measured from here).
  void begin() {
    next_ = 0;
    t0_ = now();
  }
  /// Tensor i (flat) is ready. Tensors must arrive in index order.
  void ready(int i, const Vector& v) {
    arrive(i, v.extent(0), false, v.label());
    flat_[static_cast<std::size_t>(i)] = v;
    Group& g = group(i);
    const std::size_t off = g.bounds[static_cast<std::size_t>(i - g.begin)];
    for (std::size_t k = 0; k < v.extent(0); ++k) g.buffer(off + k) = v(k);
    launch_if_complete(i);
  }
  /// Tensor i (square symmetric) is ready; its upper triangle is packed into the buffer.
  void ready(int i, const Symmetric& m) {
    if (m.extent(0) != m.extent(1))
      kdist::impl::throw_invalid("kdist::comm::FusedAllreducer::ready",
                                 "symmetric tensor '" + m.label() + "' is not square");
    arrive(i, m.extent(0), true, m.label());
    sym_[static_cast<std::size_t>(i)] = m;
    Group& g = group(i);
    const std::size_t off = g.bounds[static_cast<std::size_t>(i - g.begin)];
    pack_upper(Kokkos::DefaultHostExecutionSpace(), m,
               Kokkos::subview(g.buffer, std::make_pair(off, off + packed_size(m.extent(0)))));
    launch_if_complete(i);
  }
  /// Waits for every group's reduction (results still in the fusion buffers).
  void wait_reduced() {
    if (next_ != static_cast<int>(tensors_.size()))
      kdist::impl::throw_invalid("kdist::comm::FusedAllreducer::wait",
                                 std::to_string(next_) + " of " + std::to_string(tensors_.size()) + " tensors arrived");
    for (Group& g : groups_) g.request.wait();
  }
  /// Writes the reduced values back into the tensors' views (symmetric ones mirrored in full).
  void scatter() {
    for (Group& g : groups_) {
      for (int i = g.begin; i < g.end; ++i) {
        const std::size_t off = g.bounds[static_cast<std::size_t>(i - g.begin)];
        if (tensors_[static_cast<std::size_t>(i)].symmetric) {
          const Symmetric& m = sym_[static_cast<std::size_t>(i)];
          unpack_upper(Kokkos::DefaultHostExecutionSpace(),
                       Kokkos::subview(g.buffer, std::make_pair(off, off + packed_size(m.extent(0)))), m);
        } else {
          const Vector& v = flat_[static_cast<std::size_t>(i)];
          for (std::size_t k = 0; k < v.extent(0); ++k) v(k) = g.buffer(off + k);
        }
      }
    }
  }
  /// wait_reduced() then scatter().
  void wait() {
    wait_reduced();
    scatter();
  }
  /// Ready times of the last iteration, seconds since begin(), with sizes: planner input.
  std::vector<FusionTensor> measured() const {
    std::vector<FusionTensor> t(tensors_.size());
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = {tensors_[i].elements() * sizeof(T), ready_[i]};
    return t;
  }

 private:
  struct Group {
    int begin = 0, end = 0;
    std::vector<std::size_t> bounds;
    Buffer buffer;
    Request request;
    std::vector<std::string> labels;
    std::string label;
  };
  double now() const { return clock_ ? clock_->now() : Clock::local_now(); }
  Group& group(int i) { return groups_[static_cast<std::size_t>(plan_.group_of(i))]; }
  void arrive(int i, std::size_t dim, bool symmetric, const std::string& label) {
    constexpr const char* func = "kdist::comm::FusedAllreducer::ready";
    if (i != next_)
      kdist::impl::throw_invalid(func, "tensor " + std::to_string(i) + " ('" + label +
                                           "') arrived out of order; expected " + std::to_string(next_) + " (rank " +
                                           std::to_string(engine_.rank()) + ")");
    const Tensor& t = tensors_[static_cast<std::size_t>(i)];
    if (t.dim != dim || t.symmetric != symmetric)
      kdist::impl::throw_invalid(func, "tensor " + std::to_string(i) + " ('" + label + "') has " +
                                           (symmetric ? "dimension " : "size ") + std::to_string(dim) +
                                           ", registered as " + (t.symmetric ? "dimension " : "size ") +
                                           std::to_string(t.dim) + " (rank " + std::to_string(engine_.rank()) + ")");
    ready_[static_cast<std::size_t>(i)] = now() - t0_;
    ++next_;
  }
  void launch_if_complete(int i) {
    Group& g = group(i);
    if (i == g.end - 1) g.request = reduction_(engine_, g.buffer, g.bounds, g.labels, g.label);
    engine_.progress();
  }

  Engine& engine_;
  std::vector<Tensor> tensors_;
  Reduction reduction_;
  const Clock* clock_;
  FusionPlan plan_;
  std::vector<Group> groups_;
  std::vector<Vector> flat_;
  std::vector<Symmetric> sym_;
  std::vector<double> ready_;
  int next_ = 0;
  double t0_ = 0.0;
};

}  // namespace comm
}  // namespace kdist
