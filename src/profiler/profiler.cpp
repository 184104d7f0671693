#include "volt/profiler/profiler.h"

#include <exception>

#include "volt/core/log.h"

namespace volt {

namespace detail {
void stop_logging_errors(Profiler& profiler, const std::string& action) noexcept {
  try {
    profiler.stop(action);
  } catch (const std::exception& e) {
    // A destructor must not throw (it may run during unwinding); the region was already
    // stopped by hand, which the user learns here.
    try {
      log_warning("Profiler", e.what());
    } catch (...) {
    }
  } catch (...) {
  }
}
}  // namespace detail

ProfileRegion::~ProfileRegion() {
  if (profiler_ != nullptr) detail::stop_logging_errors(*profiler_, name_);
}

}  // namespace volt
