// FusedAllreducer<T, MemorySpace>: tensors described once (flat, or square symmetric sent as
// their packed upper triangle), handed over in ready order with ready(exec, i, view), packed into
// the fusion buffer of their group in MemorySpace by core/ kernels on `exec`; a group is launched
// as soon as its last member arrives, and wait(exec) scatters the results back with the same
// kernels (a symmetric tensor in full, or, marked upper_only, only its upper triangle: no mirror
// pass for a reader that uses no more). Nothing is staged through the host except where the
// Engine's wire needs it.
//
// The plan starts as one call per tensor; replan(cost, options) runs the planner collectively
// through the Engine with the ready times measured in the last iteration. Each group's layout
// (tensor count, boundaries, labels) is part of its signature, so ranks that registered tensors
// in a different order or fused them differently get a MismatchError, not a wrong sum.
//
// The reduction is pluggable: sum, average, or any function that turns a buffer with its layout
// into a Request (Adasum plugs in here, coefficients per tensor).
//
// use_storage(buffer) makes the groups' buffers consecutive pieces of a buffer the caller owns
// (PyTorch DDP's gradient_as_bucket_view): a flat tensor that already lives in its slot
// (slot_data) is handed over and written back without a copy.
//
// Errors: a tensor out of order or with the wrong size fails the Engine on every rank (the peers
// would otherwise wait for this group forever) and throws InvalidArgument here. Views handed to
// ready() must stay alive until wait() returns.
#pragma once

#include <kdist/comm/engine.hpp>
#include <kdist/comm/fusion_plan.hpp>
#include <kdist/core/packed.hpp>
#include <kdist/core/phase.hpp>
#include <kdist/core/timer.hpp>

#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace kdist {
namespace comm {

template <class T, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class FusedAllreducer {
 public:
  using memory_space = MemorySpace;
  using execution_space = typename MemorySpace::execution_space;
  using Buffer = Kokkos::View<T*, MemorySpace>;
  using Vector = Kokkos::View<T*, MemorySpace>;
  using Symmetric = Kokkos::View<T**, Kokkos::LayoutLeft, MemorySpace>;
  /// Reduces `buffer` in place on `exec`; `layout` holds the tensors' offsets and labels.
  using Reduction = std::function<Request(Engine&, const execution_space& exec, const Buffer& buffer,
                                          const Layout& layout, const std::string& group)>;

  static Reduction sum() { return elementwise(ReduceOp::sum); }
  static Reduction average() { return elementwise(ReduceOp::average); }
  static Reduction elementwise(ReduceOp op) {
    return [op](Engine& e, const execution_space& exec, const Buffer& b, const Layout& layout,
                const std::string& group) { return e.allreduce(exec, b, op, group, layout); };
  }

  struct Tensor {
    std::string label;
    std::size_t dim = 0;      ///< elements (flat) or matrix dimension (symmetric)
    bool symmetric = false;   ///< sent as the packed upper triangle, dim(dim+1)/2 elements
    bool upper_only = false;  ///< symmetric: scattered back into the upper triangle only
    std::size_t elements() const { return symmetric ? packed_size(dim) : dim; }
  };

  FusedAllreducer(Engine& engine, std::vector<Tensor> tensors, Reduction reduction = average(),
                  const Clock* clock = nullptr)
      : engine_(engine), tensors_(std::move(tensors)), reduction_(std::move(reduction)), clock_(clock) {
    set_plan(plan_none(tensors_.size()));
  }

  /// Collective through the Engine: plans with the ready times of the last iteration (max over
  /// ranks, decided on rank 0) and installs the plan. Call between iterations.
  void replan(const CostFunction& cost, const PlannerOptions& options) {
    set_plan(decide_plan_on_root(engine_, measured(), cost, options));
  }
  /// Installs a plan every rank agrees on (a disagreement is caught by the layout check). The group
  /// ends must increase strictly within [1, N] and end at N (N tensors): every tensor in exactly one
  /// non-empty group. InvalidArgument otherwise, naming the plan; the previous plan stays.
  void set_plan(FusionPlan plan) {
    check_plan(plan);
    // Groups of an iteration left without wait() may still be in flight on buffers the new
    // groups reuse (the caller's storage): they finish first, their outcome unread.
    (void)settle_groups();
    plan_ = std::move(plan);
    groups_.assign(static_cast<std::size_t>(plan_.groups()), Group{});
    int begin = 0;
    for (int g = 0; g < plan_.groups(); ++g) {
      groups_[static_cast<std::size_t>(g)] = make_group(g, begin, plan_.group_end[static_cast<std::size_t>(g)]);
      begin = plan_.group_end[static_cast<std::size_t>(g)];
    }
    flat_.assign(tensors_.size(), Vector());
    sym_.assign(tensors_.size(), Symmetric());
    ready_.assign(tensors_.size(), 0.0);
    next_ = 0;
  }

  const FusionPlan& plan() const noexcept { return plan_; }
  const std::vector<Tensor>& tensors() const noexcept { return tensors_; }

  /// From now on the groups' buffers are consecutive pieces of `storage`, which holds every
  /// tensor's elements in order (its size their total) and which the caller keeps alive and does
  /// not touch between a tensor's ready() and wait(); kept across set_plan. Waits for groups still
  /// in flight first. A size that is not the total fails the Engine (the peers learn it at their
  /// next wait) and throws InvalidArgument here.
  void use_storage(const Buffer& storage) {
    const std::size_t total = offset_of(static_cast<int>(tensors_.size()));
    if (storage.extent(0) != total)
      fail_here(kdist::InvalidArgument("kdist::comm::FusedAllreducer::use_storage: storage " +
                                       kdist::impl::describe(storage) + " must hold the " + std::to_string(total) +
                                       " elements of the " + std::to_string(tensors_.size()) + " tensors (rank " +
                                       std::to_string(engine_.rank()) + ")"));
    storage_ = storage;
    set_plan(plan_);  // waits for groups in flight
  }
  /// Where tensor i's elements lie in the fusion buffers (its slot): a flat tensor whose view
  /// starts here is not copied by ready() or wait(). An i out of range fails as use_storage does.
  T* slot_data(int i) {
    if (i < 0 || i >= static_cast<int>(tensors_.size()))
      fail_here(kdist::InvalidArgument("kdist::comm::FusedAllreducer::slot_data: tensor " + std::to_string(i) + " of " +
                                       std::to_string(tensors_.size()) + " (rank " + std::to_string(engine_.rank()) +
                                       ")"));
    return slot(i).data();
  }

  /// Starts an iteration (ready times are measured from here).
  void begin() {
    // An iteration the caller left without wait() (its own exception) may still have groups in
    // flight, reading and writing the buffers this one packs into: they finish first. Their
    // outcome is not read; an Engine failure shows again when this iteration launches.
    (void)settle_groups();
    next_ = 0;
    t0_ = now();
  }
  /// Tensor i (flat) is ready; it is copied into its group's buffer on `exec`.
  void ready(const execution_space& exec, int i, const Vector& v) {
    arrive(i, v.extent(0), false, v.label());
    flat_[static_cast<std::size_t>(i)] = v;
    if (v.data() != slot_data(i)) Kokkos::deep_copy(exec, slot(i), v);
    launch_if_complete(exec, i);
  }
  /// Tensor i (square symmetric) is ready; its upper triangle is packed into the buffer.
  void ready(const execution_space& exec, int i, const Symmetric& m) {
    if (m.extent(0) != m.extent(1))
      fail_here(kdist::InvalidArgument("kdist::comm::FusedAllreducer::ready: symmetric tensor '" + m.label() +
                                       "' is not square (rank " + std::to_string(engine_.rank()) + ")"));
    arrive(i, m.extent(0), true, m.label());
    sym_[static_cast<std::size_t>(i)] = m;
    Phase phase("kdist::comm::FusedAllreducer::pack");
    pack_upper(exec, m, slot(i));
    launch_if_complete(exec, i);
  }
  /// Waits for every group's reduction (results still in the fusion buffers).
  void wait_reduced() {
    if (next_ != static_cast<int>(tensors_.size()))
      fail_here(kdist::InvalidArgument("kdist::comm::FusedAllreducer::wait: " + std::to_string(next_) + " of " +
                                       std::to_string(tensors_.size()) + " tensors arrived (rank " +
                                       std::to_string(engine_.rank()) + ")"));
    // Every group, even after one fails (e.g. Adasum's NonFiniteError, after which the Engine
    // stays usable): a group left in flight would go on reading and writing its fusion buffer
    // while the next iteration packs into it. The first error is rethrown.
    if (const std::exception_ptr first = settle_groups()) std::rethrow_exception(first);
  }
  /// Writes the reduced values back into the tensors' views on `exec` (symmetric ones in full,
  /// or their upper triangle when marked upper_only).
  void scatter(const execution_space& exec) {
    Phase phase("kdist::comm::FusedAllreducer::scatter");
    for (int i = 0; i < static_cast<int>(tensors_.size()); ++i) {
      const Tensor& t = tensors_[static_cast<std::size_t>(i)];
      if (t.symmetric && t.upper_only)
        unpack_upper_triangle(exec, slot(i), sym_[static_cast<std::size_t>(i)]);
      else if (t.symmetric)
        unpack_upper(exec, slot(i), sym_[static_cast<std::size_t>(i)]);
      else if (flat_[static_cast<std::size_t>(i)].data() != slot_data(i))
        Kokkos::deep_copy(exec, flat_[static_cast<std::size_t>(i)], slot(i));
    }
  }
  /// wait_reduced() then scatter(exec).
  void wait(const execution_space& exec) {
    wait_reduced();
    scatter(exec);
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
    Layout layout;
    Buffer buffer;
    Request request;
    std::string label;
  };
  /// Waits for every group's request and clears it; the first error, if any.
  std::exception_ptr settle_groups() {
    std::exception_ptr first;
    for (Group& g : groups_) {
      try {
        g.request.wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
      g.request = Request();
    }
    return first;
  }
  Group make_group(int g, int begin, int end) const {
    Group gr;
    gr.begin = begin;
    gr.end = end;
    gr.layout.bounds.push_back(0);
    for (int i = begin; i < end; ++i) {
      gr.layout.bounds.push_back(gr.layout.bounds.back() + tensors_[static_cast<std::size_t>(i)].elements());
      gr.layout.labels.push_back(tensors_[static_cast<std::size_t>(i)].label);
      if (tensors_[static_cast<std::size_t>(i)].symmetric)
        gr.layout.symmetric.push_back(static_cast<std::size_t>(i - begin));
    }
    if (storage_.data()) {  // a piece of the caller's storage, sharing its reference count
      const std::size_t off = offset_of(begin);
      gr.buffer = Kokkos::subview(storage_, std::make_pair(off, off + gr.layout.bounds.back()));
    } else {
      gr.buffer = Buffer(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kdist::comm::fusion_buffer[" + std::to_string(g) + "]"),
          gr.layout.bounds.back());
    }
    gr.label = "fused[" + tensors_[static_cast<std::size_t>(begin)].label + ".." +
               tensors_[static_cast<std::size_t>(end - 1)].label + "]";
    return gr;
  }
  /// Elements of tensors [0, i).
  std::size_t offset_of(int i) const {
    std::size_t n = 0;
    for (int k = 0; k < i; ++k) n += tensors_[static_cast<std::size_t>(k)].elements();
    return n;
  }
  double now() const { return clock_ ? clock_->now() : Clock::local_now(); }
  Group& group(int i) { return groups_[static_cast<std::size_t>(plan_.group_of(i))]; }
  auto slot(int i) {
    Group& g = group(i);
    const std::size_t off = g.layout.bounds[static_cast<std::size_t>(i - g.begin)];
    return Kokkos::subview(g.buffer, std::make_pair(off, off + tensors_[static_cast<std::size_t>(i)].elements()));
  }
  // A plan is rejected before anything is built from it: an end of 0 or a repeated end would make
  // an empty group (tensors_[begin - 1] read for its label), a decreasing end would leave tensors
  // in no group (never reduced), and only the last end was checked against N.
  void check_plan(const FusionPlan& plan) const {
    const int n = static_cast<int>(tensors_.size());
    std::string problem;
    int prev = 0;
    for (std::size_t g = 0; g < plan.group_end.size() && problem.empty(); ++g) {
      const int end = plan.group_end[g];
      if (end <= prev || end > n)
        problem = "group " + std::to_string(g) + " ends at " + std::to_string(end) + ", expected an end in [" +
                  std::to_string(prev + 1) + ", " + std::to_string(n) + "]";
      prev = end;
    }
    if (problem.empty() && prev != n)
      problem = "its groups cover " + std::to_string(prev) + " of " + std::to_string(n) + " tensors";
    if (problem.empty()) return;
    std::string ends;
    for (int e : plan.group_end) ends += (ends.empty() ? "" : ",") + std::to_string(e);
    kdist::impl::throw_invalid("kdist::comm::FusedAllreducer::set_plan",
                               "plan {" + ends + "} for " + std::to_string(n) + " tensors (rank " +
                                   std::to_string(engine_.rank()) + "): " + problem +
                                   "; group ends must increase strictly and the last must be " + std::to_string(n));
  }
  [[noreturn]] void fail_here(const kdist::InvalidArgument& e) {
    engine_.fail(e);
    throw e;
  }
  void arrive(int i, std::size_t dim, bool symmetric, const std::string& label) {
    const std::string where = " (rank " + std::to_string(engine_.rank()) + ")";
    if (i != next_ || i >= static_cast<int>(tensors_.size()))
      fail_here(kdist::InvalidArgument("kdist::comm::FusedAllreducer::ready: tensor " + std::to_string(i) + " ('" +
                                       label + "') arrived out of order; expected " + std::to_string(next_) + where));
    const Tensor& t = tensors_[static_cast<std::size_t>(i)];
    if (t.dim != dim || t.symmetric != symmetric)
      fail_here(kdist::InvalidArgument("kdist::comm::FusedAllreducer::ready: tensor " + std::to_string(i) + " ('" +
                                       label + "') has " + (symmetric ? "dimension " : "size ") + std::to_string(dim) +
                                       ", registered as " + (t.symmetric ? "dimension " : "size ") +
                                       std::to_string(t.dim) + where));
    ready_[static_cast<std::size_t>(i)] = now() - t0_;
    ++next_;
  }
  void launch_if_complete(const execution_space& exec, int i) {
    Group& g = group(i);
    if (i == g.end - 1) g.request = reduction_(engine_, exec, g.buffer, g.layout, g.label);
    engine_.progress();
  }

  Engine& engine_;
  std::vector<Tensor> tensors_;
  Reduction reduction_;
  const Clock* clock_;
  FusionPlan plan_;
  Buffer storage_;  // the caller's (use_storage), or empty: each group allocates its own
  std::vector<Group> groups_;
  std::vector<Vector> flat_;
  std::vector<Symmetric> sym_;
  std::vector<double> ready_;
  int next_ = 0;
  double t0_ = 0.0;
};

}  // namespace comm
}  // namespace kdist
