#include "volt/profiler/profiler.h"

#include <exception>

#include "volt/core/log.h"

namespace volt {

ProfileRegion::~ProfileRegion() {
  if (profiler_ == nullptr) return;
  try {
    profiler_->stop(name_);
  } catch (const std::exception& e) {
    // A destructor must not throw (it may run during unwinding); the region was already
    // stopped by hand, which the user learns here.
    log_warning("Profiler", e.what());
  }
}

}  // namespace volt
