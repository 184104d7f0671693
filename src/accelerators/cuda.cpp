#include "volt/accelerators/cuda.h"

#include <torch/cuda.h>

#include "volt/core/check.h"

namespace volt {

bool CudaAccelerator::available() { return torch::cuda::is_available(); }

CudaAccelerator::CudaAccelerator() {
#ifndef VOLT_CUDA
  VOLT_CHECK(false, NotAvailable,
             "[CudaAccelerator] accelerator=\"cuda\" requested but volt was built against a "
             "libtorch without CUDA; use accelerator=\"cpu\" (or \"auto\"), or rebuild volt "
             "against a CUDA libtorch.");
#endif
  VOLT_CHECK(available(), NotAvailable,
             "[CudaAccelerator] accelerator=\"cuda\" requested but no CUDA device is visible "
             "(torch::cuda::device_count()=", torch::cuda::device_count(),
             "); check CUDA_VISIBLE_DEVICES and the driver, or use accelerator=\"cpu\".");
}

c10::Device CudaAccelerator::device(int64_t index) const {
  VOLT_CHECK(index >= 0 && index < device_count(), ConfigError, "[CudaAccelerator] device index ",
             index, " requested but ", device_count(), " CUDA device(s) are visible.");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

int64_t CudaAccelerator::device_count() const {
  return static_cast<int64_t>(torch::cuda::device_count());
}

void CudaAccelerator::setup_device(const c10::Device& device) {
  // The current-device switch lives in c10::cuda, which exists only in CUDA builds; with one
  // process per device (DDP) the strategy sets it from LOCAL_RANK.
  VOLT_CHECK(device.is_cuda(), ConfigError, "[CudaAccelerator] setup_device got ", device.str(),
             "; expected a cuda device.");
}

void CudaAccelerator::synchronize() const { torch::cuda::synchronize(); }

}  // namespace volt
