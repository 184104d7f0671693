#include "volt/precision/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

#include "volt/core/check.h"
#include "volt/core/version.h"

namespace volt {
namespace {

// libtorch 2.4 replaced the per-device setters with device-typed ones (LIBTORCH_NOTES §2).
bool get_enabled(c10::DeviceType d) {
#if VOLT_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(d);
#else
  return d == c10::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

void set_enabled(c10::DeviceType d, bool on) {
#if VOLT_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(d, on);
#else
  if (d == c10::kCPU) {
    at::autocast::set_cpu_enabled(on);
  } else {
    at::autocast::set_enabled(on);
  }
#endif
}

c10::ScalarType get_dtype(c10::DeviceType d) {
#if VOLT_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(d);
#else
  return d == c10::kCPU ? at::autocast::get_autocast_cpu_dtype()
                        : at::autocast::get_autocast_gpu_dtype();
#endif
}

void set_dtype(c10::DeviceType d, c10::ScalarType t) {
#if VOLT_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(d, t);
#else
  if (d == c10::kCPU) {
    at::autocast::set_autocast_cpu_dtype(t);
  } else {
    at::autocast::set_autocast_gpu_dtype(t);
  }
#endif
}

// Also for a disabled guard, as torch.autocast checks device_type whatever `enabled` says: a
// disabled guard on another device type would switch off (and later restore) CUDA's autocast,
// which libtorch's per-device flags below 2.4 give every non-CPU device.
void check_device_type(c10::DeviceType device) {
  VOLT_CHECK(device == c10::kCPU || device == c10::kCUDA, ConfigError,
             "[AutocastGuard] autocast on device type ", device,
             " is not supported; use c10::kCPU or c10::kCUDA.");
}

// An enabled guard: the dtype, and a device this process can run.
void check_supported(c10::DeviceType device, c10::ScalarType dtype) {
  VOLT_CHECK(dtype == c10::kBFloat16 || dtype == c10::kHalf, ConfigError,
             "[AutocastGuard] autocast lowers to bf16 or fp16, not ", dtype,
             "; pass at::kBFloat16 or at::kHalf.");
  if (device == c10::kCPU) {
#if !VOLT_TORCH_AT_LEAST(2, 4)
    VOLT_CHECK(dtype == c10::kBFloat16, NotAvailable, "[AutocastGuard] CPU autocast in libtorch ",
               TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR,
               " supports bf16 only; use at::kBFloat16 on CPU "
               "(fp16 autocast on CPU needs libtorch >= 2.4, or run on CUDA).");
#endif
  } else {
    VOLT_CHECK(
        torch::cuda::is_available(), NotAvailable, "[AutocastGuard] CUDA autocast asked for, but ",
        torch::cuda::device_count() == 0 ? "no CUDA device is visible" : "CUDA is not available",
        "; use c10::kCPU or run on a CUDA machine with a CUDA build of libtorch.");
  }
}

}  // namespace

AutocastGuard::AutocastGuard(c10::DeviceType device, c10::ScalarType dtype, bool enabled,
                             bool cache_enabled)
    : device_(device) {
  check_device_type(device);
  if (enabled) check_supported(device, dtype);
  prev_enabled_ = get_enabled(device);
  prev_dtype_ = get_dtype(device);
  prev_cache_ = at::autocast::is_autocast_cache_enabled();
  set_enabled(device, enabled);
  if (enabled) set_dtype(device, dtype);
  at::autocast::set_autocast_cache_enabled(cache_enabled);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  // The cast cache holds lowered copies of leaf tensors (weights) for the region; it must die
  // with the outermost region or the next step would reuse stale copies of updated weights.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_enabled(device_, prev_enabled_);
  set_dtype(device_, prev_dtype_);
  at::autocast::set_autocast_cache_enabled(prev_cache_);
}

bool AutocastGuard::is_enabled(c10::DeviceType device) {
  return get_enabled(device);
}

c10::ScalarType AutocastGuard::dtype(c10::DeviceType device) {
  return get_dtype(device);
}

}  // namespace volt
