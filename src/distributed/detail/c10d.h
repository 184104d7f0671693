#pragma once
// The c10d headers volt's distributed code uses, and which process groups this build can run:
// - VOLT_DIST_GLOO: the gloo headers exist (CMake's VOLT_HAVE_GLOO_HEADERS) and libtorch was
//   built with USE_C10D_GLOO. Debian's libtorch-dev; not the 2.11 CUDA wheel (no gloo headers).
// - VOLT_DIST_NCCL: libtorch >= 2.0 built with USE_C10D_NCCL, and nccl.h found
//   (VOLT_HAVE_NCCL_HEADERS). The CUDA wheel; never the CPU-only Debian libtorch.
// - VOLT_DIST: either. Without one the process group throws NotAvailable.

#include "volt/core/version.h"

#if defined(VOLT_HAVE_GLOO_HEADERS) && defined(USE_C10D_GLOO)
#define VOLT_DIST_GLOO 1
#else
#define VOLT_DIST_GLOO 0
#endif

#if defined(VOLT_HAVE_NCCL_HEADERS) && defined(USE_C10D_NCCL) && VOLT_TORCH_AT_LEAST(2, 0)
#define VOLT_DIST_NCCL 1
#else
#define VOLT_DIST_NCCL 0
#endif

#define VOLT_DIST (VOLT_DIST_GLOO || VOLT_DIST_NCCL)

#if VOLT_DIST
#include <c10/core/Device.h>

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if VOLT_DIST_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include "volt/distributed/process_group.h"

namespace volt {

// The connection to (on rank 0 usually also the server of) a job's rendezvous store.
struct RendezvousStore {
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  std::string address;  // MASTER_ADDR
  int port = 0;         // MASTER_PORT
  bool server = false;  // this process hosts it
};

// The c10d objects behind a volt::ProcessGroup.
struct ProcessGroup::Impl {
  std::shared_ptr<RendezvousStore> rendezvous;
  // The rendezvous store seen through this attempt's key prefix: every key of the group.
  c10::intrusive_ptr<c10d::Store> store;
  // What the Reducer takes: in 1.13 the Gloo group itself; since 2.0 (Gloo and NCCL are
  // c10d::Backends) a c10d::ProcessGroup wrapping it.
  c10::intrusive_ptr<c10d::ProcessGroup> group;
#if VOLT_TORCH_AT_LEAST(2, 0)
  c10::intrusive_ptr<c10d::Backend> backend;
#endif
#if VOLT_DIST_GLOO
  std::shared_ptr<gloo::transport::Device> device;  // reused by subgroups (new_group)
#endif
  // Where collectives run: the CPU for Gloo; for NCCL this rank's CUDA device, to which volt
  // moves host tensors for the collective and from which it moves the results back.
  c10::Device wire_device = c10::Device(c10::kCPU);
  std::string address;       // MASTER_ADDR:MASTER_PORT, for messages
  bool agent_store = false;  // torchrun's agent hosts the store, not rank 0 (for messages)
  std::string gloo_address;  // where this rank's Gloo device listens, for messages
  // Set by the first failed collective; later calls fail at once with it.
  std::string broken;
  // The key prefix of this attempt (a connection of its own, as run_on_leaders' heartbeat
  // opens, needs it) and the run_on_leaders calls so far (each call's keys are its own).
  std::string prefix;
  int64_t lead_rounds = 0;
  // A subgroup's key under the root's store ("volt/gloo/group/<tag>/<ranks>"; empty for the
  // root): its own subgroups' keys start with it, so sibling groups' subgroups of the same tag
  // and local ranks (each replica's) do not meet.
  std::string key;
};

namespace detail {

/// Turns the failure of collective `op` into a DistributedError (timeout or lost peer, with the
/// lost rank when some process reported it) and marks `pg` broken.
[[noreturn]] void throw_collective_error(ProcessGroup& pg, const char* op, const std::exception& e);

}  // namespace detail
}  // namespace volt
#endif
