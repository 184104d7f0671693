#pragma once
/// CpuAccelerator: the host CPU ("cpu").

#include "volt/accelerators/accelerator.h"

namespace volt {

/// The host CPU: always available, one logical device (threads are set by the Trainer).
class CpuAccelerator : public Accelerator {
 public:
  std::string name() const override { return "cpu"; }
  c10::Device device(int64_t index) const override;
  int64_t device_count() const override { return 1; }
  /// The counting allocator's ten metrics (volt/accelerators/cpu_memory.h); the first call
  /// installs it, so counts start there.
  std::map<std::string, double> device_stats() const override;
};

}  // namespace volt
