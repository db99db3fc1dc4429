// The Preconditioner's non-template members, compiled once for float and double on the memory
// spaces of this build (KDIST_KFAC_FOR_BUILT_SPACES); kfac/preconditioner.hpp declares them extern.
#include <kdist/kfac/preconditioner.hpp>

namespace kdist {
namespace kfac {

#define KDIST_KFAC_INSTANTIATE_PRECONDITIONER(T, M) template class Preconditioner<T, M>;
KDIST_KFAC_FOR_BUILT_SPACES(KDIST_KFAC_INSTANTIATE_PRECONDITIONER)
#undef KDIST_KFAC_INSTANTIATE_PRECONDITIONER

}  // namespace kfac
}  // namespace kdist
