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

NumericalError::NumericalError(const std::string& message, std::string operation, long long dim, int info,
                               std::string reason)
    : Error(message),
      operation_(std::move(operation)),
      dim_(dim),
      damping_(0.0),
      info_(info),
      reason_(std::move(reason)) {}

namespace {
std::string nonfinite_message(const std::string& op, const std::string& label, long long elements, int rank,
                              const std::string& detail) {
  std::ostringstream os;
  os << op << ": non-finite value (NaN or Inf) in '" << label << "' (" << elements << " elements)";
  if (rank >= 0) os << " on rank " << rank;
  if (!detail.empty()) os << "; " << detail;
  return os.str();
}
}  // namespace

NonFiniteError::NonFiniteError(std::string operation, std::string label, long long elements, int rank,
                               std::string detail)
    : NumericalError(nonfinite_message(operation, label, elements, rank, detail), operation, elements, 0,
                     "non-finite input"),
      label_(std::move(label)),
      rank_(rank) {}

namespace impl {
void throw_invalid(const std::string& func, const std::string& message) {
  throw InvalidArgument(func + ": " + message);
}
}  // namespace impl

}  // namespace kdist
