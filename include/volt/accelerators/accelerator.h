#pragma once
/// Accelerator: one kind of device (CPU, CUDA) — availability, device objects, sync.

#include <c10/core/Device.h>

#include <cstdint>
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
};

/// The host CPU: always available, one logical device (threads are set by the Trainer).
class CpuAccelerator : public Accelerator {
 public:
  std::string name() const override { return "cpu"; }
  c10::Device device(int64_t index) const override;
  int64_t device_count() const override { return 1; }
};

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
  /// True when libtorch has CUDA and at least one GPU is visible.
  static bool available();
};

}  // namespace volt
