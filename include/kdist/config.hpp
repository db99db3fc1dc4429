// <kdist/config.hpp>: the configuration kdist was built with.
//
// A CMake configure writes <kdist/build_config.hpp> (from core/build_config.hpp.in) into the build
// tree and installs it beside this file; every kdist target has it on its include path. Tools
// that read the bare source tree without a configure (an editor, clangd, a grep-and-compile
// script) get the host-only defaults below, marked KDIST_CONFIGURED 0, so that every <kdist/...>
// include resolves from a fresh clone.
//
//   KDIST_CONFIGURED            1 when the configuration comes from a configure
//   KDIST_VERSION[_MAJOR|...]   the project's version
//   KDIST_ENABLE_CUDA           cuSOLVER/cuBLAS on device views
//   KDIST_ENABLE_CUSOLVER       same as KDIST_ENABLE_CUDA
//   KDIST_ENABLE_NCCL           the Engine's NCCL backend
//   KDIST_ENABLE_GPU_AWARE_MPI  device views handed to MPI directly
#pragma once

#if __has_include(<kdist/build_config.hpp>)
#include <kdist/build_config.hpp>
#else
#define KDIST_CONFIGURED 0
#define KDIST_VERSION_MAJOR 0
#define KDIST_VERSION_MINOR 0
#define KDIST_VERSION_PATCH 0
#define KDIST_VERSION "unconfigured"
#define KDIST_ENABLE_CUDA 0
#define KDIST_ENABLE_CUSOLVER 0
#define KDIST_ENABLE_NCCL 0
#define KDIST_ENABLE_GPU_AWARE_MPI 0
#endif
