#pragma once
// scheduler.step(*metric), or scheduler.step() without a metric: how a run steps a scheduler for
// Module::lr_scheduler_step's default (the Trainer's run and Fabric's both call it; the default
// itself lives in core, which reaches it through RunContext::step_lr_scheduler).

#include <c10/util/Optional.h>

#include "volt/optim/lr_scheduler.h"

namespace volt::detail {

inline void step_scheduler(LRScheduler& scheduler, c10::optional<double> metric) {
  if (metric) {
    scheduler.step(*metric);
  } else {
    scheduler.step();
  }
}

}  // namespace volt::detail
