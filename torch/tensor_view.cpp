#include <kdist/torch/tensor_view.hpp>

#include <mpi.h>
#include <sstream>

namespace kdist {
namespace torch {
namespace impl {

namespace {
std::string list(c10::IntArrayRef v) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}
int world_rank() {
  int initialized = 0, finalized = 0, rank = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
}  // namespace

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  std::ostringstream os;
  os << "sizes " << list(t.sizes()) << ", " << c10::toString(t.scalar_type()) << ", " << t.device();
  // Only a strided tensor has strides (a sparse or MKL-DNN one throws on asking).
  if (t.layout() == at::kStrided)
    os << ", strides " << list(t.strides());
  else
    os << ", layout " << t.layout();
  return os.str();
}

void refuse(const char* operation, const std::string& what, const std::string& problem, const at::Tensor& t) {
  kdist::impl::throw_invalid(
      std::string("kdist::torch::") + operation,
      what + ": " + problem + ": " + describe(t) + " (rank " + std::to_string(world_rank()) + ")");
}

void check_tensor(const char* operation, const std::string& what, const at::Tensor& t, at::ScalarType dtype, int rank,
                  c10::DeviceType device_type) {
  if (!t.defined()) refuse(operation, what, "undefined", t);
  // Sparse and MKL-DNN tensors have no dense storage to alias (a sparse one even says contiguous).
  if (t.layout() != at::kStrided) refuse(operation, what, "not a strided (dense) tensor", t);
  if (t.scalar_type() != dtype) refuse(operation, what, std::string("not ") + c10::toString(dtype), t);
  if (rank >= 0 && t.dim() != rank) refuse(operation, what, "not of rank " + std::to_string(rank), t);
  if (t.device().type() != device_type)
    refuse(operation, what, "not on the " + c10::DeviceTypeName(device_type, /*lower_case=*/true) + " device", t);
  if (!t.is_contiguous()) refuse(operation, what, "not contiguous (kdist views alias, never copy)", t);
}

}  // namespace impl
}  // namespace torch
}  // namespace kdist
