#pragma once
// Skips for tests that need something a build may lack, each with the reason in the skip
// message (ctest lists them as skipped, never as passed).

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <volt/distributed/process_group.h>

#include <string>

/// Skips the test when this build has no Gloo process group (libtorch without gloo headers, as
/// the CUDA wheels): multi-process CPU tests need it.
#define VOLT_REQUIRE_GLOO()                                                                      \
  do {                                                                                           \
    if (!volt::ProcessGroup::gloo_available()) {                                                 \
      GTEST_SKIP() << "this build has no Gloo process group (libtorch without gloo headers, "    \
                      "e.g. the CUDA wheels); the test runs multi-process CPU training on Gloo"; \
    }                                                                                            \
  } while (0)

namespace volt_test {

/// Whether this build has the Gloo process group. A test whose main point needs none keeps its
/// one-process DeepSpeed or DDP parts on the CPU (which make a Gloo group) under `if (gloo())`.
inline bool gloo() {
  return volt::ProcessGroup::gloo_available();
}

/// Why NCCL process groups cannot run here ("" when they can): no GPU, or a build without them
/// (a CUDA libtorch >= 2.0 with nccl.h).
inline std::string nccl_unavailable_reason() {
  if (!torch::cuda::is_available()) return "no CUDA device";
  const std::string missing = volt::ProcessGroup::backend_unavailable_reason(volt::Backend::kNccl);
  return missing.empty() ? "" : "this build has no NCCL process group: " + missing;
}

}  // namespace volt_test

/// Skips the test unless NCCL process groups can run here (volt_test::nccl_unavailable_reason).
#define VOLT_REQUIRE_NCCL()                                                     \
  do {                                                                          \
    const std::string volt_nccl_missing = volt_test::nccl_unavailable_reason(); \
    if (!volt_nccl_missing.empty()) GTEST_SKIP() << volt_nccl_missing;          \
  } while (0)

/// Skips the test without a CUDA device (a CPU libtorch, or no GPU on this machine).
#define VOLT_REQUIRE_CUDA()                                                                    \
  do {                                                                                         \
    if (!torch::cuda::is_available()) {                                                        \
      GTEST_SKIP() << "no CUDA device (a CPU libtorch or no GPU here); the test runs on CUDA"; \
    }                                                                                          \
  } while (0)
