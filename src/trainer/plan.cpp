#include "volt/trainer/plan.h"

#include <functional>
#include <map>

#include "trainer/detail/tuner_trial.h"
#include "volt/accelerators/cuda.h"
#include "volt/core/check.h"
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
std::vector<std::string> precision_names() {
  return registry().precisions.names();
}

namespace detail {

std::shared_ptr<Precision> make_precision(const Spec<Precision>& precision,
                                          const std::string& component) {
  if (precision.is_object()) return precision.object();
  const Registry& reg = registry();
  VOLT_CHECK(reg.precisions.contains(precision.name()), ConfigError, "[", component,
             "] unknown precision \"", precision.name(),
             "\"; valid names: ", quoted_list(precision_names()), ".");
  return precision.args() != nullptr ? reg.precisions.create(precision.name(), *precision.args())
                                     : reg.precisions.create(precision.name());
}

}  // namespace detail

RunPlan resolve_plan(const Spec<Accelerator>& accelerator, int64_t devices,
                     const Spec<Strategy>& strategy, const Spec<Precision>& precision,
                     int64_t num_nodes, const std::string& component) {
  const Registry& reg = registry();
  const std::string tag = "[" + component + "]";
  RunPlan plan;
  if (accelerator.is_object()) {
    plan.accelerator = accelerator.object();
  } else if (accelerator.name() == "auto") {
    plan.accelerator = reg.accelerators.create(CudaAccelerator::available() ? "cuda" : "cpu");
  } else {
    VOLT_CHECK(reg.accelerators.contains(accelerator.name()), ConfigError, tag,
               " unknown accelerator \"", accelerator.name(),
               "\"; valid names: ", quoted_list(accelerator_names()), ".");
    plan.accelerator = reg.accelerators.create(accelerator.name());
  }

  VOLT_CHECK(devices == -1 || devices >= 1, ConfigError, tag, " devices=", devices,
             " is invalid; pass a positive device count or -1 for all devices.");
  VOLT_CHECK(num_nodes >= 1, ConfigError, tag, " num_nodes=", num_nodes,
             " is invalid; pass the number of nodes (>= 1).");
  // On the CPU, devices counts processes sharing the host (an explicit N; -1 means one).
  const bool cpu = plan.accelerator->name() == "cpu";
  plan.devices = devices == -1 ? (cpu ? 1 : plan.accelerator->device_count()) : devices;
  plan.num_nodes = num_nodes;
  VOLT_CHECK(cpu || plan.devices <= plan.accelerator->device_count(), ConfigError, tag,
             " devices=", plan.devices, " but the ", plan.accelerator->name(), " accelerator has ",
             plan.accelerator->device_count(), " device(s); lower devices.");
  const int64_t world = plan.devices * plan.num_nodes;

  plan.precision = detail::make_precision(precision, component);

  if (strategy.is_object()) {
    plan.strategy = strategy.object();
    return plan;
  }
  const std::string& s = strategy.name();
  VOLT_CHECK(s == "auto" || reg.strategies.contains(s), ConfigError, tag, " unknown strategy \"", s,
             "\"; valid names: ", quoted_list(strategy_names()), did_you_mean(s, strategy_names()),
             ".");
  // "auto": one process -> single_device, several -> ddp.
  const std::string chosen = s != "auto" ? s : world == 1 ? "single_device" : "ddp";
  VOLT_CHECK(reg.strategies.contains(chosen), NotAvailable, tag, " devices=", plan.devices,
             " x num_nodes=", plan.num_nodes, " needs the \"", chosen,
             "\" strategy, which this build does not register; use devices=1.");
  VOLT_CHECK(chosen != "single_device" || world == 1, ConfigError, tag,
             " strategy \"single_device\" runs one process but devices=", plan.devices,
             " x num_nodes=", plan.num_nodes,
             "; set devices=1 and num_nodes=1, or use "
             "strategy \"ddp\".");
  StrategyContext ctx{plan.accelerator, plan.precision, plan.devices, plan.num_nodes};
  plan.strategy = strategy.args() != nullptr ? reg.strategies.create(chosen, *strategy.args(), ctx)
                                             : reg.strategies.create(chosen, ctx);
  return plan;
}

}  // namespace volt
