#include "volt/core/limit.h"

#include <algorithm>
#include <cmath>

#include "volt/core/check.h"

namespace volt {

int64_t Limit::resolve(int64_t available) const {
  if (!is_fraction_) return std::min(count_, available);
  if (fraction_ <= 0.0 || available == 0) return 0;
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(fraction_ * available)));
}

void Limit::validate(const std::string& option) const {
  if (is_fraction_) {
    VOLT_CHECK(std::isfinite(fraction_) && fraction_ >= 0.0 && fraction_ <= 1.0, ConfigError,
               "[Trainer] ", option, "=", fraction_,
               " is not a valid fraction; pass a float in [0.0, 1.0] or an int batch count.");
  } else {
    VOLT_CHECK(count_ >= 0, ConfigError, "[Trainer] ", option, "=", count_,
               " is negative; pass a batch count >= 0 or a float fraction in [0.0, 1.0].");
  }
}

std::ostream& operator<<(std::ostream& os, const Limit& l) {
  if (l.is_fraction()) return os << l.fraction();
  return os << l.count();
}

}  // namespace volt
