#include "volt/strategies/single_device.h"

namespace volt {

SingleDeviceStrategy::SingleDeviceStrategy(c10::Device device,
                                           std::shared_ptr<Accelerator> accelerator,
                                           std::shared_ptr<Precision> precision,
                                           std::shared_ptr<CheckpointIO> checkpoint_io)
    : Strategy(std::move(accelerator), std::move(precision), std::move(checkpoint_io)),
      device_(device) {}

}  // namespace volt
