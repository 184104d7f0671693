#pragma once
/// CudaAccelerator: NVIDIA GPUs through libtorch's CUDA runtime ("cuda").

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
  // TODO(#14): rng_states() with the CUDA generators once a GPU run can verify exact resume.
  /// True when libtorch has CUDA and at least one GPU is visible.
  static bool available();
};

}  // namespace volt
