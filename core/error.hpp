// Errors thrown by kdist. Every message names the operation and the sizes involved, and
// communication errors name the rank, so a failure in a 64-rank job points at its cause.
#pragma once

#include <stdexcept>
#include <string>

namespace kdist {

/// Base of every kdist exception.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// A caller passed views or parameters that do not fit the operation.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// A numerical method failed: non-finite input, a matrix that is not SPD after damping, ...
/// The caller's input is left untouched.
class NumericalError : public Error {
 public:
  NumericalError(std::string operation, long long dim, double damping, int info, std::string reason);
  const std::string& operation() const noexcept { return operation_; }
  long long dim() const noexcept { return dim_; }
  double damping() const noexcept { return damping_; }
  /// LAPACK/cuSOLVER info value (0 when the failure was found before factorising).
  int info() const noexcept { return info_; }
  const std::string& reason() const noexcept { return reason_; }

 protected:
  /// For subclasses that format their own message.
  NumericalError(const std::string& message, std::string operation, long long dim, int info, std::string reason);

 private:
  std::string operation_;
  long long dim_;
  double damping_;
  int info_;
  std::string reason_;
};

/// NaN or Inf where finite values are required (a matrix to invert, a tensor of an Adasum
/// all-reduce, K-FAC activations). Names the operation, the view or tensor label, its size and
/// the rank where the value was found (-1 when only this process looked).
class NonFiniteError : public NumericalError {
 public:
  NonFiniteError(std::string operation, std::string label, long long elements, int rank, std::string detail = "");
  const std::string& label() const noexcept { return label_; }
  int rank() const noexcept { return rank_; }

 private:
  std::string label_;
  int rank_;
};

/// An error reported by a third-party library (BLAS, LAPACK, cuSOLVER, cuBLAS, NCCL, MPI).
class BackendError : public Error {
 public:
  using Error::Error;
};

namespace impl {
/// Throws InvalidArgument("<func>: <message>").
[[noreturn]] void throw_invalid(const std::string& func, const std::string& message);
}  // namespace impl

}  // namespace kdist
