#include <kdist/core/dtype.hpp>

#include <cstring>

namespace kdist {

namespace {
constexpr DType kAll[] = {DType::float32, DType::float64, DType::int32, DType::int64, DType::bytes};
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return "float32";
    case DType::float64:
      return "float64";
    case DType::int32:
      return "int32";
    case DType::int64:
      return "int64";
    case DType::bytes:
      return "bytes";
  }
  return "unknown";
}

bool parse_dtype(const char* text, DType* out) {
  for (DType d : kAll)
    if (std::strcmp(text, to_string(d)) == 0) {
      *out = d;
      return true;
    }
  return false;
}

std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::float32:
    case DType::int32:
      return 4;
    case DType::float64:
    case DType::int64:
      return 8;
    case DType::bytes:
      return 1;
  }
  return 1;
}

}  // namespace kdist
