#pragma once
/// resolve_plan: the one place where "auto" and registry names become typed objects.

#include <memory>
#include <string>
#include <vector>

#include "volt/accelerators/accelerator.h"
#include "volt/core/spec.h"
#include "volt/precision/precision.h"
#include "volt/strategies/strategy.h"

namespace volt {

/// The typed result of resolving accelerator / devices / strategy / precision choices.
struct RunPlan {
  std::shared_ptr<Accelerator> accelerator;
  std::shared_ptr<Precision> precision;
  std::shared_ptr<Strategy> strategy;
  int64_t devices = 1;  ///< processes per node
  int64_t num_nodes = 1;
};

/// "auto" accelerator: cuda when available, else cpu. devices -1: every device of the
/// accelerator (1 on the CPU, where an explicit N runs N processes). Strategy "auto":
/// single_device for one process, ddp for devices x num_nodes > 1. Unknown names throw
/// ConfigError listing the valid ones; unavailable hardware throws NotAvailable. `component`
/// tags the messages ("[Trainer] unknown precision ..."; Fabric passes "Fabric").
RunPlan resolve_plan(const Spec<Accelerator>& accelerator, int64_t devices,
                     const Spec<Strategy>& strategy, const Spec<Precision>& precision,
                     int64_t num_nodes = 1, const std::string& component = "Trainer");

/// Registered names, for messages and the CLI.
std::vector<std::string> accelerator_names();
std::vector<std::string> strategy_names();
std::vector<std::string> precision_names();

}  // namespace volt
