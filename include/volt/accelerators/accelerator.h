#pragma once
/// Accelerator: one kind of device (CPU, CUDA) — availability, device objects, sync.

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <string>

namespace volt {

/// Device-kind facts the Strategy needs; owns no model or data.
class Accelerator {
 public:
  virtual ~Accelerator() = default;
  /// Registry name ("cpu", "cuda").
  virtual std::string name() const = 0;
  /// The `index`-th device of this kind.
  virtual c10::Device device(int64_t index) const = 0;
  /// Devices of this kind present now.
  virtual int64_t device_count() const = 0;
  /// Makes `device` current for this process (e.g. cudaSetDevice).
  virtual void setup_device(const c10::Device& device) {}
  /// Waits for queued work on the current device.
  virtual void synchronize() const {}
  /// Random-generator states of this device kind by name, beyond the CPU generator (which the
  /// Strategy always keeps); empty for the CPU.
  virtual std::map<std::string, at::Tensor> rng_states() const { return {}; }
  /// Restores states returned by rng_states(); names it does not know are ignored.
  virtual void set_rng_states(const std::map<std::string, at::Tensor>& states) {}
  /// Memory statistics of this process's device by the reference's names (Limit, InUse, ...;
  /// docs/OBSERVABILITY.md); empty when this device kind keeps none yet.
  virtual std::map<std::string, double> device_stats() const { return {}; }
};

}  // namespace volt
