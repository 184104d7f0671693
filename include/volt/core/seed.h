#pragma once
/// The global seed: seed_everything and the seed that loaders without their own follow.

#include <cstdint>

namespace volt {

/// Seeds torch's global generator and makes `seed` the global seed (global_seed()), which this
/// process and the processes it starts after this call read (the environment variable
/// VOLT_GLOBAL_SEED, as Lightning's seed_everything sets PL_GLOBAL_SEED). Returns the seed.
uint64_t seed_everything(uint64_t seed);

/// The seed of this process's last seed_everything; else VOLT_GLOBAL_SEED, which a process that
/// seeded before starting this one set; else 0. A DataLoader without a seed of its own shuffles
/// by it, as Lightning's DistributedSampler takes PL_GLOBAL_SEED. A VOLT_GLOBAL_SEED that is not
/// a whole number in [0, 2^64) is a ConfigError.
uint64_t global_seed();

}  // namespace volt
