// The preconditioner's saved state: one file with a JSON header and the raw factors and
// inverses, so a resumed run makes exactly the same next update as an uninterrupted one.
//
//   "KDIST-KFAC-STATE\n" | header bytes (decimal) "\n" | JSON header | payload
//   header: {"version": 1, "dtype": "float32", "ranks": P, "layers": ["Dense(784, 256, bias)", ...],
//            "dims": [d per factor], "step": k, "factor_steps": n, "replan_after": m,
//            "have_inverses": true, "fusion_groups": [...], "owners": [...]}
//   payload: every factor (d x d, column-major) then every inverse, in factor order.
//
// decode_state checks the magic, the version, the JSON fields and the payload length, and
// throws kdist::Error naming the file and what is wrong; check_compatible compares a header with
// the running preconditioner's and names the first difference (layer list, dtype, rank count).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kdist {
namespace kfac {

struct StateHeader {
  static constexpr int kVersion = 1;
  std::string dtype;
  int ranks = 1;
  std::vector<std::string> layers;
  std::vector<int> dims;
  long long step = 0, factor_steps = 0, replan_after = 0;
  bool have_inverses = false;
  std::vector<int> fusion_groups, owners;
  /// Bytes of the payload: 2 * sum d^2 elements of `element_bytes`.
  std::size_t payload_bytes(std::size_t element_bytes) const;
};

std::string encode_state(const StateHeader& header, const std::string& payload);
/// Reads `path`; returns the header and puts the payload in `payload`.
StateHeader decode_state(const std::string& path, std::string* payload);
/// InvalidArgument naming `path` and the first field where `saved` differs from `running`
/// (dtype, rank count, layer list, dimensions), then Error if the payload's length is wrong.
void check_compatible(const std::string& path, const StateHeader& saved, const StateHeader& running,
                      std::size_t payload_bytes, std::size_t element_bytes);

}  // namespace kfac
}  // namespace kdist
