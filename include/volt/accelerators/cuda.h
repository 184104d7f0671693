#pragma once
/// CudaAccelerator: NVIDIA GPUs through libtorch's CUDA runtime ("cuda").

#include <vector>

#include "volt/accelerators/accelerator.h"

namespace volt {

/// NVIDIA GPUs through libtorch's CUDA runtime. Constructing it in a build or on a machine
/// without CUDA throws NotAvailable with the reason.
class CudaAccelerator : public Accelerator {
 public:
  CudaAccelerator();
  std::string name() const override { return "cuda"; }
  c10::Device device(int64_t index) const override;
  int64_t device_count() const override;
  void setup_device(const c10::Device& device) override;
  void synchronize() const override;
  /// The default generator state of each GPU set up for the run (every visible one when none
  /// was), as "torch_cuda_<index>": what exact resume needs beside the CPU generator.
  std::map<std::string, at::Tensor> rng_states() const override;
  /// Restores the states rng_states() wrote; a checkpoint written on more GPUs than are visible
  /// restores those that exist, one written on CPU leaves the GPU generators as they are.
  void set_rng_states(const std::map<std::string, at::Tensor>& states) override;
  /// The caching allocator's statistics for the run's (first) GPU, under the CPU's metric names
  /// (docs/OBSERVABILITY.md): Limit (the device's total memory), InUse / MaxInUse (allocated
  /// bytes now / at the peak), NumAllocs, NumFrees, ActiveAllocs, and TotalSystemAllocs /
  /// TotalSystemFrees / TotalActiveAllocs (cudaMalloc'd segments). No MaxAllocSize: the
  /// allocator keeps no such statistic. Empty in a build without CUDA.
  std::map<std::string, double> device_stats() const override;
  /// True when libtorch has CUDA and at least one GPU is visible.
  static bool available();

 private:
  std::vector<int64_t> devices_;  // set up by setup_device, in order
};

}  // namespace volt
