// The element types kdist moves and models: one enum for the engine, its backends (MPI, NCCL),
// cost-model keys and error messages. dtype_of<T>() maps a C++ type onto it at compile time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kdist {

enum class DType : int { float32 = 1, float64 = 2, int32 = 3, int64 = 4, bytes = 5 };

/// "float32", "float64", "int32", "int64", "bytes".
const char* to_string(DType dtype);
/// Parses to_string()'s spelling; returns false for anything else.
bool parse_dtype(const char* text, DType* out);
/// Bytes per element (1 for bytes).
std::size_t size_of(DType dtype);

template <class T>
constexpr DType dtype_of() {
  using U = std::remove_cv_t<T>;
  static_assert(std::is_same<U, float>::value || std::is_same<U, double>::value || std::is_same<U, int>::value ||
                    std::is_same<U, std::int64_t>::value || std::is_same<U, char>::value,
                "kdist: element type must be float, double, int, int64_t or char");
  return std::is_same<U, float>::value    ? DType::float32
         : std::is_same<U, double>::value ? DType::float64
         : std::is_same<U, int>::value    ? DType::int32
         : std::is_same<U, char>::value   ? DType::bytes
                                          : DType::int64;
}

}  // namespace kdist
