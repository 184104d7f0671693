#pragma once
// Private: HostSyncMonitor's decision for one op, apart so that it is tested on its own (its
// accelerator branch cannot run on a CPU-only machine).

#include <c10/core/DeviceType.h>

#include <string_view>
#include <vector>

namespace volt {
namespace detail {

enum class OpFinding { kNone, kHostSync, kCpuOp };

/// Where an op sits among the ops observed on its thread.
struct OpNesting {
  int depth = 0;             ///< enclosing ops (FUNCTION scope) being observed
  bool inside_sync = false;  ///< an enclosing op was already reported as a host sync
};

/// Whether op `name`, whose tensor inputs are on `inputs` (device types in argument order; empty
/// when the model is on the CPU, where inputs are not read), is a host sync or an op on host
/// tensors, for a model whose parameters are on `model`. With the model on the CPU every sync
/// op counts: it is the read an accelerator would wait for. With the model on an accelerator,
/// a sync op counts when an input is on the device, a copy_ from the device into host memory
/// is a sync, and an outermost op whose tensor inputs are all on the host is a CPU op (moving
/// host data to the device is not).
OpFinding classify_op(std::string_view name, c10::DeviceType model,
                      const std::vector<c10::DeviceType>& inputs, OpNesting nesting);

}  // namespace detail
}  // namespace volt
