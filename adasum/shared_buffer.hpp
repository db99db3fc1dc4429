// SharedBuffer: a host buffer of n elements per rank that ranks on one node can read in place,
// for the zero-copy Adasum all-reduce (allreduce(engine, SharedBuffer&, ...)). Its memory is
// this rank's block of a comm::SharedWindow (MPI_Win_allocate_shared over the Engine's node
// group), with a few elements of padding past n that the hierarchical node phase uses.
//
// - Construction is collective over the Engine and checked: every rank must ask for the same n
//   (else kdist::InvalidArgument on every rank). Destroy buffers in the same order on every rank.
// - view() is an unmanaged HostSpace view of the n elements: fill it (or pack gradients into it)
//   before the all-reduce, read the result after wait(). Host memory only: a device build copies
//   into it, as the view overload of allreduce stages device views through the host anyway.
// - Ranks on other nodes are reached through MPI as before; the buffer works on any layout.
#pragma once

#include <kdist/comm/shared_window.hpp>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <memory>

namespace kdist {
namespace adasum {

template <class T>
class SharedBuffer {
 public:
  using View = Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  SharedBuffer(comm::Engine& engine, std::size_t n)
      : n_(n), window_(new comm::SharedWindow(engine, (n + static_cast<std::size_t>(engine.size())) * sizeof(T))) {}

  std::size_t size() const noexcept { return n_; }
  T* data() const noexcept { return static_cast<T*>(window_->local()); }
  View view() const { return View(data(), n_); }
  const comm::SharedWindow& window() const noexcept { return *window_; }

 private:
  std::size_t n_;
  std::unique_ptr<comm::SharedWindow> window_;
};

}  // namespace adasum
}  // namespace kdist
