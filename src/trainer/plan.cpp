#include "volt/trainer/plan.h"

#include <functional>
#include <map>

#include "volt/core/check.h"

namespace volt {
namespace {

template <typename T>
using Factories = std::map<std::string, std::function<std::shared_ptr<T>()>>;

const Factories<Accelerator>& accelerators() {
  static const Factories<Accelerator> f = {
      {"cpu", [] { return std::make_shared<CpuAccelerator>(); }},
      {"cuda", [] { return std::make_shared<CudaAccelerator>(); }},
  };
  return f;
}

const Factories<Precision>& precisions() {
  static const Factories<Precision> f = {
      {"32-true", [] { return std::make_shared<Fp32Precision>(); }},
      {"32", [] { return std::make_shared<Fp32Precision>(); }},
  };
  return f;
}

template <typename T>
std::vector<std::string> keys(const Factories<T>& f) {
  std::vector<std::string> out;
  for (const auto& kv : f) out.push_back(kv.first);
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "\"" : ", \"") + x + "\"";
  return s;
}

}  // namespace

std::vector<std::string> accelerator_names() {
  auto v = keys(accelerators());
  v.insert(v.begin(), "auto");
  return v;
}
std::vector<std::string> strategy_names() { return {"auto", "single_device"}; }
std::vector<std::string> precision_names() { return keys(precisions()); }

RunPlan resolve_plan(const Spec<Accelerator>& accelerator, int64_t devices,
                     const Spec<Strategy>& strategy, const Spec<Precision>& precision) {
  RunPlan plan;
  if (accelerator.is_object()) {
    plan.accelerator = accelerator.object();
  } else if (accelerator.name() == "auto") {
    plan.accelerator = CudaAccelerator::available() ? accelerators().at("cuda")()
                                                    : accelerators().at("cpu")();
  } else {
    auto it = accelerators().find(accelerator.name());
    VOLT_CHECK(it != accelerators().end(), ConfigError, "[Trainer] unknown accelerator \"",
               accelerator.name(), "\"; valid names: ", join(accelerator_names()), ".");
    plan.accelerator = it->second();
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
    auto it = precisions().find(precision.name());
    VOLT_CHECK(it != precisions().end(), ConfigError, "[Trainer] unknown precision \"",
               precision.name(), "\"; valid names: ", join(precision_names()),
               " (bf16-mixed, 16-mixed and fp8 are on the roadmap).");
    plan.precision = it->second();
  }

  if (strategy.is_object()) {
    plan.strategy = strategy.object();
    return plan;
  }
  const std::string& s = strategy.name();
  VOLT_CHECK(s == "auto" || s == "single_device", ConfigError, "[Trainer] unknown strategy \"", s,
             "\"; valid names: ", join(strategy_names()), " (ddp is on the roadmap).");
  VOLT_CHECK(plan.devices == 1, NotAvailable, "[Trainer] devices=", plan.devices,
             " needs a multi-process strategy (ddp), which volt does not have yet; use "
             "devices=1.");
  plan.strategy = std::make_shared<SingleDeviceStrategy>(plan.accelerator->device(0),
                                                         plan.accelerator, plan.precision);
  return plan;
}

}  // namespace volt
