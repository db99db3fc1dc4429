// Host LAPACK entry points for the SPD inverse and the symmetric eigendecomposition (no
// KokkosLapack before 4.2, and none has Cholesky). Every function returns LAPACK's info.
#pragma once

namespace kdist {
namespace impl {
namespace host {

template <class T>
int potrf(char uplo, int n, T* A, int lda);
template <class T>
int potri(char uplo, int n, T* A, int lda);
/// potri('U') by halves: R^-1 recursively (R11^-1 and R22^-1, then R12 := -R11^-1 R12 R22^-1 by
/// two trmm), LAPACK's trtri below order 128, then lauum. OpenBLAS 0.3.21's strtri runs at about a
/// third of strmm's rate at order 785 (4.4 against 1.65 ms), the whole inverse 1.2-1.6x faster
/// from order 257 to 1569, with the same rounding (within 3e-7 of potri's in float).
template <class T>
int potri_by_halves(int n, T* A, int lda);

/// ?syevd's work array sizes: at least LAPACK's documented minimum (the query alone can be short,
/// see the .cpp); lwork is -1 when that minimum does not fit LAPACK's int (n above about 32767).
struct SyevdWorkspace {
  int lwork = 0;
  int liwork = 0;
};
template <class T>
SyevdWorkspace syevd_workspace(char jobz, char uplo, int n);
template <class T>
int syevd(char jobz, char uplo, int n, T* A, int lda, T* w, T* work, int lwork, int* iwork, int liwork);

}  // namespace host
}  // namespace impl
}  // namespace kdist
