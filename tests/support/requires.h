#pragma once
// Skips for tests that need something a build may lack, each with the reason in the skip
// message (ctest lists them as skipped, never as passed).

#include <gtest/gtest.h>
#include <volt/distributed/process_group.h>

/// Skips the test when this build has no Gloo process group (libtorch without gloo headers, as
/// the CUDA wheels): multi-process CPU tests need it.
#define VOLT_REQUIRE_GLOO()                                                                      \
  do {                                                                                           \
    if (!volt::ProcessGroup::gloo_available()) {                                                 \
      GTEST_SKIP() << "this build has no Gloo process group (libtorch without gloo headers, "    \
                      "e.g. the CUDA wheels); the test runs multi-process CPU training on Gloo"; \
    }                                                                                            \
  } while (0)

/// Skips the test unless this build has NCCL process groups (a CUDA libtorch >= 2.0 with
/// nccl.h) and a GPU is present.
#define VOLT_REQUIRE_NCCL()                                                 \
  do {                                                                      \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";     \
    try {                                                                   \
      volt::resolve_backend("nccl", c10::DeviceType::CUDA);                 \
    } catch (const std::exception& e) {                                     \
      GTEST_SKIP() << "this build has no NCCL process group: " << e.what(); \
    }                                                                       \
  } while (0)
