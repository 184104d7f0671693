#include "volt/core/seed.h"

#include <torch/utils.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "volt/core/check.h"
#include "volt/core/env.h"

namespace volt {
namespace {

constexpr const char* kVar = "VOLT_GLOBAL_SEED";

// The last seed_everything's seed. The environment variable is written too, for the processes
// this one starts, and read back only when this process never seeded.
std::atomic<bool> seeded{false};
std::atomic<uint64_t> last_seed{0};

}  // namespace

uint64_t seed_everything(uint64_t seed) {
  torch::manual_seed(seed);
  last_seed.store(seed);
  seeded.store(true);
  ::setenv(kVar, std::to_string(seed).c_str(), /*overwrite=*/1);
  return seed;
}

uint64_t global_seed() {
  if (seeded.load()) return last_seed.load();
  const auto value = env_value(kVar);
  if (!value) return 0;
  const std::string& v = *value;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  VOLT_CHECK(!v.empty() && v.front() >= '0' && v.front() <= '9' && *end == '\0' && errno == 0,
             ConfigError, "[seed] ", kVar, "=\"", v,
             "\" is not a seed; it must be a whole number in [0, 2^64) (seed_everything sets it "
             "for the processes it starts): unset it or set such a number.");
  return static_cast<uint64_t>(n);
}

}  // namespace volt
