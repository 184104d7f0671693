#pragma once
/// SingleDeviceStrategy: one process on one device ("single_device").

#include <memory>

#include "volt/strategies/strategy.h"

namespace volt {

/// One process, one device: every seam keeps the Strategy defaults.
class SingleDeviceStrategy : public Strategy {
 public:
  SingleDeviceStrategy(c10::Device device, std::shared_ptr<Accelerator> accelerator,
                       std::shared_ptr<Precision> precision,
                       std::shared_ptr<CheckpointIO> checkpoint_io = nullptr);
  std::string name() const override { return "single_device"; }
  c10::Device root_device() const override { return device_; }

 private:
  c10::Device device_;
};

}  // namespace volt
