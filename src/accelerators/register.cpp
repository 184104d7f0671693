// Registers this folder's built-in names; called once from registry() (src/trainer/builtins.cpp).
#include "volt/accelerators/cpu.h"
#include "volt/accelerators/cuda.h"
#include "volt/core/registry.h"

namespace volt::detail {

void register_accelerators(Registry& r) {
  r.accelerators.add("cpu", "the host CPU", [] { return std::make_shared<CpuAccelerator>(); });
  r.accelerators.add("cuda", "NVIDIA GPUs (needs a CUDA build of libtorch)",
                     [] { return std::make_shared<CudaAccelerator>(); });
  // Lightning's accelerator="gpu" (CUDA or Apple's MPS there; CUDA is volt's only GPU).
  r.accelerators.add("gpu", "Lightning's name for the GPU: cuda",
                     [] { return std::make_shared<CudaAccelerator>(); });
}

}  // namespace volt::detail
