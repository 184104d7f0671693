#include "volt/accelerators/cpu.h"

#include "volt/accelerators/cpu_memory.h"
#include "volt/core/check.h"

namespace volt {

c10::Device CpuAccelerator::device(int64_t index) const {
  VOLT_CHECK(index == 0, ConfigError, "[CpuAccelerator] device index ", index,
             " requested; the CPU accelerator has one device (index 0).");
  return c10::Device(c10::kCPU);
}

std::map<std::string, double> CpuAccelerator::device_stats() const {
  install_counting_cpu_allocator();
  return cpu_memory_stats().to_metrics();
}

}  // namespace volt
