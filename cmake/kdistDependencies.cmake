# Finds kdist's dependencies and papers over differences between Debian's Kokkos 3.4 (TriBITS
# export) and a standalone Kokkos 4.x install. Included by the top-level CMakeLists.txt and by the
# installed kdistConfig.cmake, so an in-tree build and a consumer see the same targets.
include(CMakeFindDependencyMacro)

find_dependency(Kokkos 3.4)
# Debian's Kokkos::kokkos points its include dir at /usr/lib/include, which does not exist.
if(TARGET Kokkos::kokkos)
  get_target_property(_kdist_kokkos_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  set(_kdist_fix_inc FALSE)
  foreach(_d IN LISTS _kdist_kokkos_inc)
    if(NOT _d MATCHES "^\\$<" AND NOT EXISTS "${_d}")
      set(_kdist_fix_inc TRUE)
    endif()
  endforeach()
  if(_kdist_fix_inc AND Kokkos_INCLUDE_DIRS)
    set_target_properties(Kokkos::kokkos PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${Kokkos_INCLUDE_DIRS}")
  endif()
endif()

# Kokkos Kernels: 4.x exports Kokkos::kokkoskernels; Debian's TriBITS build exports none.
if(NOT TARGET Kokkos::kokkoskernels AND NOT TARGET kdist::kokkoskernels)
  find_dependency(KokkosKernels)
endif()
if(TARGET Kokkos::kokkoskernels)
  set(KDIST_KOKKOSKERNELS_TARGET Kokkos::kokkoskernels)
else()
  if(NOT TARGET kdist::kokkoskernels)
    add_library(kdist::kokkoskernels INTERFACE IMPORTED)
    set_target_properties(kdist::kokkoskernels PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${KokkosKernels_INCLUDE_DIRS}"
      INTERFACE_LINK_LIBRARIES "${KokkosKernels_LIBRARIES};${KokkosKernels_TPL_LIBRARIES}")
  endif()
  set(KDIST_KOKKOSKERNELS_TARGET kdist::kokkoskernels)
endif()

find_dependency(MPI COMPONENTS CXX)
find_dependency(BLAS)
find_dependency(LAPACK)
# kdist::core (state files: CRC-32) and kdist::nn (gzip'ed IDX) link zlib privately; a static
# library still needs it at the consumer's link.
find_dependency(ZLIB)
