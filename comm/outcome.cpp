#include <kdist/comm/outcome.hpp>
#include <kdist/core/error.hpp>

#include <limits>
#include <string>
#include <vector>

namespace kdist {
namespace comm {

namespace {

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// `text` of rank `root`, on every rank: its length, then its bytes one per int, by max
// all-reduces to which only the root contributes; then one more all-reduce, which no rank leaves
// before every rank holds the text. A rank whose peer left and destroyed its Engine sees that
// only there, with the text in hand.
std::string text_of(Engine& engine, int root, const std::string& text, const std::string& operation) {
  const bool mine = engine.rank() == root;
  const int length = engine.allreduce_values<int>({mine ? static_cast<int>(text.size()) : 0}, ReduceOp::max,
                                                  operation + ": length")[0];
  std::vector<int> bytes(static_cast<std::size_t>(length), 0);
  if (mine)
    for (int i = 0; i < length; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<unsigned char>(text[i]);
  bytes = engine.allreduce_values<int>(std::move(bytes), ReduceOp::max, operation + ": message");
  try {
    engine.allreduce_values<int>({0}, ReduceOp::max, operation + ": message received");
  } catch (const RemoteError&) {
  }
  std::string out;
  for (const int b : bytes) out.push_back(static_cast<char>(b));
  return out;
}

}  // namespace

void agree_on_outcome(Engine& engine, std::exception_ptr error, const std::string& operation) {
  constexpr int none = std::numeric_limits<int>::max();
  const int first =
      engine.allreduce_values<int>({error ? engine.rank() : none}, ReduceOp::min, operation + ": outcome")[0];
  if (first == none) return;
  const std::string text = text_of(engine, first, error ? what_of(error) : std::string(), operation);
  if (error) std::rethrow_exception(error);
  throw RemoteError(operation + ": rank " + std::to_string(first) + " failed: " + text + " (reported on rank " +
                    std::to_string(engine.rank()) + ")");
}

void agree_on_value(Engine& engine, std::int64_t value, const std::string& operation, const std::string& what) {
  // min(v) = ~max(~v), defined for every int64 (unlike -v).
  const auto range = engine.allreduce_values<std::int64_t>({value, ~value}, ReduceOp::max, operation + ": " + what);
  const std::int64_t high = range[0], low = ~range[1];
  if (low == high) return;
  constexpr int none = std::numeric_limits<int>::max();
  const int me = engine.rank();
  const auto holders = engine.allreduce_values<int>({value == low ? me : none, value == high ? me : none},
                                                    ReduceOp::min, operation + ": ranks with " + what);
  kdist::impl::throw_invalid(operation, "ranks hold different " + what + ": rank " + std::to_string(holders[0]) +
                                            " has " + std::to_string(low) + ", rank " + std::to_string(holders[1]) +
                                            " " + std::to_string(high));
}

}  // namespace comm
}  // namespace kdist
