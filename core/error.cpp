#include <kdist/core/error.hpp>

#include <sstream>

namespace kdist {

namespace {
std::string numerical_message(const std::string& op, long long dim, double damping, int info,
                              const std::string& reason) {
  std::ostringstream os;
  os << op << ": " << reason << " (dimension " << dim << ", damping " << damping << ", info " << info << ")";
  return os.str();
}
}  // namespace

NumericalError::NumericalError(std::string operation, long long dim, double damping, int info, std::string reason)
    : Error(numerical_message(operation, dim, damping, info, reason)),
      operation_(std::move(operation)),
      dim_(dim),
      damping_(damping),
      info_(info),
      reason_(std::move(reason)) {}

namespace impl {
void throw_invalid(const std::string& func, const std::string& message) {
  throw InvalidArgument(func + ": " + message);
}
}  // namespace impl

}  // namespace kdist
