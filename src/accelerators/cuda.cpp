#include "volt/accelerators/cuda.h"

#include <ATen/Context.h>
#include <torch/cuda.h>
#ifdef VOLT_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <mutex>

#include "volt/core/check.h"

namespace volt {

bool CudaAccelerator::available() {
  return torch::cuda::is_available();
}

CudaAccelerator::CudaAccelerator() {
#ifndef VOLT_CUDA
  VOLT_CHECK(false, NotAvailable,
             "[CudaAccelerator] accelerator=\"cuda\" requested but volt was built against a "
             "libtorch without CUDA; use accelerator=\"cpu\" (or \"auto\"), or rebuild volt "
             "against a CUDA libtorch.");
#endif
  VOLT_CHECK(available(), NotAvailable,
             "[CudaAccelerator] accelerator=\"cuda\" requested but no CUDA device is visible "
             "(torch::cuda::device_count()=",
             torch::cuda::device_count(),
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
  const int64_t index = device.has_index() ? device.index() : 0;
  if (std::find(devices_.begin(), devices_.end(), index) == devices_.end()) {
    devices_.push_back(index);
  }
}

void CudaAccelerator::synchronize() const {
  torch::cuda::synchronize();
}

std::map<std::string, double> CudaAccelerator::device_stats() const {
#ifdef VOLT_CUDA
  const auto index = static_cast<c10::DeviceIndex>(devices_.empty() ? c10::cuda::current_device()
                                                                    : devices_.front());
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  constexpr size_t kAll = 0;  // StatType::AGGREGATE: both pools
  size_t free_bytes = 0, total_bytes = 0;
  {
    const c10::cuda::CUDAGuard on(index);
    VOLT_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess, NotAvailable,
               "[CudaAccelerator] cudaMemGetInfo failed on cuda:", static_cast<int>(index),
               "; the device or its driver is in a bad state.");
  }
  auto d = [](int64_t v) { return static_cast<double>(v); };
  return {{"Limit", static_cast<double>(total_bytes)},
          {"InUse", d(stats.allocated_bytes[kAll].current)},
          {"MaxInUse", d(stats.allocated_bytes[kAll].peak)},
          {"NumAllocs", d(stats.allocation[kAll].allocated)},
          {"NumFrees", d(stats.allocation[kAll].freed)},
          {"ActiveAllocs", d(stats.allocation[kAll].current)},
          {"TotalSystemAllocs", d(stats.segment[kAll].allocated)},
          {"TotalSystemFrees", d(stats.segment[kAll].freed)},
          {"TotalActiveAllocs", d(stats.segment[kAll].current)}};
#else
  return {};
#endif
}

// Through the device-generic context API: no CUDA headers, and a GPU never used by the run is
// initialised only here (its generator exists once the CUDA context does).
std::map<std::string, at::Tensor> CudaAccelerator::rng_states() const {
  std::vector<int64_t> devices = devices_;
  if (devices.empty()) {
    for (int64_t i = 0; i < device_count(); ++i) devices.push_back(i);
  }
  std::map<std::string, at::Tensor> out;
  for (const int64_t i : devices) {
    auto gen = at::globalContext().defaultGenerator(
        c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
    std::lock_guard<std::mutex> lock(gen.mutex());
    out["torch_cuda_" + std::to_string(i)] = gen.get_state();
  }
  return out;
}

void CudaAccelerator::set_rng_states(const std::map<std::string, at::Tensor>& states) {
  for (int64_t i = 0; i < device_count(); ++i) {
    auto it = states.find("torch_cuda_" + std::to_string(i));
    if (it == states.end()) continue;
    auto gen = at::globalContext().defaultGenerator(
        c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(i)));
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(it->second);
  }
}

}  // namespace volt
