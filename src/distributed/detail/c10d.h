#pragma once
// The c10d headers volt's distributed code uses, and VOLT_DIST_GLOO: 1 when this build can run
// Gloo (the gloo headers exist, which CMake checks as VOLT_HAVE_GLOO_HEADERS, and libtorch was
// built with USE_C10D_GLOO). The 2.11 CUDA wheel ships no gloo headers: there it is 0 and the
// process group throws NotAvailable.

#include "volt/core/version.h"

#if defined(VOLT_HAVE_GLOO_HEADERS) && defined(USE_C10D_GLOO)
#define VOLT_DIST_GLOO 1
#else
#define VOLT_DIST_GLOO 0
#endif

#if VOLT_DIST_GLOO
#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "volt/distributed/process_group.h"

namespace volt {

// The c10d objects behind a volt::ProcessGroup.
struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
  // What the Reducer takes: in 1.13 the Gloo group itself; since 2.0 (Gloo is a c10d::Backend)
  // a c10d::ProcessGroup wrapping it.
  c10::intrusive_ptr<c10d::ProcessGroup> group;
#if VOLT_TORCH_AT_LEAST(2, 0)
  c10::intrusive_ptr<c10d::Backend> backend;
#endif
  std::shared_ptr<gloo::transport::Device> device;  // reused by subgroups (new_group)
  std::string address;                              // MASTER_ADDR:MASTER_PORT, for messages
  std::string gloo_address;  // where this rank's Gloo device listens, for messages
  // Set by the first failed collective; later calls fail at once with it.
  std::string broken;
};

namespace detail {

/// Turns the failure of collective `op` into a DistributedError (timeout or lost peer, with the
/// lost rank when some process reported it) and marks `pg` broken.
[[noreturn]] void throw_collective_error(ProcessGroup& pg, const char* op, const std::exception& e);

}  // namespace detail
}  // namespace volt
#endif
