// Counts the Kokkos::deep_copy calls that read or write a range of memory, through Kokkos Tools'
// begin-deep-copy callback (called before deep_copy looks at its arguments, so a copy of a range
// onto itself counts too): how a test sees that data was reduced where it lies, not copied. One
// counter at a time; the callback that was set before is restored (and kept being called).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>

namespace kdist_test {

class DeepCopiesTouching {
 public:
  DeepCopiesTouching(const void* begin, std::size_t bytes)
      : previous_(Kokkos::Tools::Experimental::get_callbacks().begin_deep_copy) {
    state() = {static_cast<const char*>(begin), static_cast<const char*>(begin) + bytes, 0, previous_};
    Kokkos::Tools::Experimental::set_begin_deep_copy_callback(&on_copy);
  }
  ~DeepCopiesTouching() { Kokkos::Tools::Experimental::set_begin_deep_copy_callback(previous_); }
  DeepCopiesTouching(const DeepCopiesTouching&) = delete;
  DeepCopiesTouching& operator=(const DeepCopiesTouching&) = delete;

  /// Copies so far whose source or destination starts inside the range.
  int count() const { return state().count; }

 private:
  using Callback = Kokkos_Profiling_beginDeepCopyFunction;
  struct State {
    const char *begin, *end;
    int count;
    Callback previous;
  };
  static State& state() {
    static State s{};
    return s;
  }
  static void on_copy(Kokkos_Profiling_SpaceHandle dst_space, const char* dst_label, const void* dst,
                      Kokkos_Profiling_SpaceHandle src_space, const char* src_label, const void* src,
                      std::uint64_t bytes) {
    const auto inside = [](const void* p) {
      const char* c = static_cast<const char*>(p);
      return c >= state().begin && c < state().end;
    };
    if (inside(dst) || inside(src)) ++state().count;
    if (state().previous) state().previous(dst_space, dst_label, dst, src_space, src_label, src, bytes);
  }

  Callback previous_;
};

}  // namespace kdist_test
