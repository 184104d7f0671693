#include "volt/accelerators/cpu.h"

#include "volt/core/check.h"

namespace volt {

c10::Device CpuAccelerator::device(int64_t index) const {
  VOLT_CHECK(index == 0, ConfigError, "[CpuAccelerator] device index ", index,
             " requested; the CPU accelerator has one device (index 0).");
  return c10::Device(c10::kCPU);
}

}  // namespace volt
