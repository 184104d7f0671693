// Registers this folder's built-in names; called once from registry() (src/trainer/builtins.cpp).
#include "volt/core/registry.h"
#include "volt/strategies/single_device.h"

namespace volt::detail {

void register_strategies(Registry& r) {
  r.strategies.add("single_device", "one process on one device",
                   [](const StrategyContext& c) -> std::shared_ptr<Strategy> {
                     return std::make_shared<SingleDeviceStrategy>(c.accelerator->device(0),
                                                                   c.accelerator, c.precision);
                   });
}

}  // namespace volt::detail
