#include "volt/trainer/plan.h"

#include <functional>
#include <map>

#include "volt/core/check.h"
#include "volt/accelerators/cuda.h"
#include "volt/core/registry.h"

namespace volt {
std::vector<std::string> accelerator_names() {
  auto v = registry().accelerators.names();
  v.insert(v.begin(), "auto");
  return v;
}
std::vector<std::string> strategy_names() {
  auto v = registry().strategies.names();
  v.insert(v.begin(), "auto");
  return v;
}
std::vector<std::string> precision_names() { return registry().precisions.names(); }

RunPlan resolve_plan(const Spec<Accelerator>& accelerator, int64_t devices,
                     const Spec<Strategy>& strategy, const Spec<Precision>& precision) {
  const Registry& reg = registry();
  RunPlan plan;
  if (accelerator.is_object()) {
    plan.accelerator = accelerator.object();
  } else if (accelerator.name() == "auto") {
    plan.accelerator = reg.accelerators.create(CudaAccelerator::available() ? "cuda" : "cpu");
  } else {
    VOLT_CHECK(reg.accelerators.contains(accelerator.name()), ConfigError,
               "[Trainer] unknown accelerator \"", accelerator.name(), "\"; valid names: ",
               quoted_list(accelerator_names()), ".");
    plan.accelerator = reg.accelerators.create(accelerator.name());
  }

  VOLT_CHECK(devices == -1 || devices >= 1, ConfigError, "[Trainer] devices=", devices,
             " is invalid; pass a positive device count or -1 for \"auto\".");
  plan.devices = devices == -1 ? 1 : devices;
  VOLT_CHECK(plan.devices <= plan.accelerator->device_count(), ConfigError, "[Trainer] devices=",
             plan.devices, " but the ", plan.accelerator->name(), " accelerator has ",
             plan.accelerator->device_count(), " device(s); lower devices.");

  if (precision.is_object()) {
    plan.precision = precision.object();
  } else {
    VOLT_CHECK(reg.precisions.contains(precision.name()), ConfigError,
               "[Trainer] unknown precision \"", precision.name(), "\"; valid names: ",
               quoted_list(precision_names()), " (bf16-mixed, 16-mixed and fp8 are on the roadmap).");
    plan.precision = reg.precisions.create(precision.name());
  }

  if (strategy.is_object()) {
    plan.strategy = strategy.object();
    return plan;
  }
  const std::string& s = strategy.name();
  VOLT_CHECK(s == "auto" || reg.strategies.contains(s), ConfigError,
             "[Trainer] unknown strategy \"", s, "\"; valid names: ", quoted_list(strategy_names()),
             " (ddp is on the roadmap).");
  // "auto" is single_device for one device; a multi-process strategy (ddp, ROADMAP) will be
  // picked here for several.
  VOLT_CHECK(s != "auto" || plan.devices == 1, NotAvailable, "[Trainer] devices=", plan.devices,
             " needs a multi-process strategy (ddp), which volt does not have yet; use "
             "devices=1.");
  VOLT_CHECK(s != "single_device" || plan.devices == 1, ConfigError,
             "[Trainer] strategy \"single_device\" runs on one device but devices=",
             plan.devices, "; set devices=1.");
  StrategyContext ctx{plan.accelerator, plan.precision, plan.devices};
  plan.strategy = reg.strategies.create(s == "auto" ? "single_device" : s, ctx);
  return plan;
}

}  // namespace volt
