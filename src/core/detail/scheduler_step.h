#pragma once
// Module::lr_scheduler_step's default, scheduler.step(*metric) or scheduler.step(), defined
// beside LRScheduler (src/optim/lr_scheduler.cpp): core may not include optim's header.
// A stop-gap of session 63 (see the session note): the run-context hook it replaced is the
// layered way back.

#include <c10/util/Optional.h>

namespace volt {
class LRScheduler;
namespace detail {
void step_scheduler(LRScheduler& scheduler, c10::optional<double> metric);
}  // namespace detail
}  // namespace volt
