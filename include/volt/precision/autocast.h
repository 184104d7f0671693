#pragma once
/// AutocastGuard: an RAII autocast region (the reference's `torch.autocast` context manager) and
/// autocast_forward, its decorator form.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <utility>

namespace volt {

/// Turns autocast on (or off: `enabled=false` carves an fp32 island inside an autocast region)
/// for one device type for the guard's lifetime, then restores exactly what was there before.
/// Nestable. The autocast cast cache is cleared when the outermost region on the thread ends.
/// CPU accepts bf16 (libtorch 1.13's CPU autocast has no fp16); CUDA accepts bf16 and fp16 and
/// needs a CUDA build and device (a disabled guard needs neither, only one of the two device
/// types). Bad arguments throw ConfigError / NotAvailable.
///
///   { volt::AutocastGuard bf16(c10::kCPU);             // matmuls, convs in bf16
///     auto h = net->forward(x);
///     { volt::AutocastGuard fp32(c10::kCPU, at::kBFloat16, false);
///       auto s = h.softmax(-1); }                      // this part in fp32
///   }
class AutocastGuard {
 public:
  explicit AutocastGuard(c10::DeviceType device, c10::ScalarType dtype = c10::kBFloat16,
                         bool enabled = true, bool cache_enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

  /// Whether autocast is on for `device` on this thread right now.
  static bool is_enabled(c10::DeviceType device);
  /// The dtype autocast lowers to for `device` on this thread right now.
  static c10::ScalarType dtype(c10::DeviceType device);

 private:
  c10::DeviceType device_;
  bool prev_enabled_;
  c10::ScalarType prev_dtype_;
  bool prev_cache_;
};

/// The decorator form: returns a callable that runs `fn(args...)` inside
/// AutocastGuard(device, dtype, enabled), e.g. a module's forward:
///   auto fwd = volt::autocast_forward(c10::kCPU, at::kBFloat16,
///                                     [&](const at::Tensor& x) { return net->forward(x); });
template <typename Fn>
auto autocast_forward(c10::DeviceType device, c10::ScalarType dtype, Fn fn, bool enabled = true) {
  return [device, dtype, enabled, fn = std::move(fn)](auto&&... args) {
    AutocastGuard guard(device, dtype, enabled);
    return fn(std::forward<decltype(args)>(args)...);
  };
}

}  // namespace volt
