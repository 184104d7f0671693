// The one place above every component: registry() is declared in core/registry.h (the ground
// floor, which includes no component) and defined here, where each component folder's own
// registration is called. A static library drops unreferenced self-registering objects, so the
// calls are explicit: adding a strategy touches src/strategies/register.cpp only.
#include "volt/core/registry.h"

namespace volt {
namespace detail {
void register_accelerators(Registry& r);               // src/accelerators/register.cpp
void register_strategies(Registry& r);                 // src/strategies/register.cpp
void register_precisions(Registry& r);                 // src/precision/register.cpp
void register_callbacks(Registry& r);                  // src/callbacks/register.cpp
void register_loggers(Registry& r);                    // src/loggers/register.cpp
void register_profilers(Registry& r);                  // src/profiler/register.cpp
void register_checkpoint_ios(Registry& r);             // src/io/register.cpp
void register_tuner_callbacks(Registry& r);            // src/tuner/register.cpp
void register_optimizers_and_schedulers(Registry& r);  // src/optim/register.cpp
}  // namespace detail

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();  // never destroyed: factories may run during static teardown
    detail::register_accelerators(*reg);
    detail::register_strategies(*reg);
    detail::register_precisions(*reg);
    detail::register_callbacks(*reg);
    detail::register_loggers(*reg);
    detail::register_profilers(*reg);
    detail::register_checkpoint_ios(*reg);
    detail::register_tuner_callbacks(*reg);
    detail::register_optimizers_and_schedulers(*reg);
    return reg;
  }();
  return *r;
}

}  // namespace volt
