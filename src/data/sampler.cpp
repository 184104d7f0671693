#include "volt/data/sampler.h"

#include <numeric>
#include <random>

#include "core/detail/mix64.h"
#include "volt/core/check.h"
#include "volt/core/seed.h"

namespace volt {

Sampler::Sampler(int64_t dataset_size, bool shuffle, c10::optional<uint64_t> seed, int64_t rank,
                 int64_t world_size, bool even)
    : dataset_size_(dataset_size),
      shuffle_(shuffle),
      seed_(seed),
      rank_(rank),
      world_size_(world_size),
      even_(even) {
  VOLT_CHECK(dataset_size >= 0, ValueError, "[Sampler] dataset_size=", dataset_size,
             " is negative.");
  VOLT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, ConfigError,
             "[Sampler] rank=", rank, " world_size=", world_size,
             " is invalid; need 0 <= rank < world_size.");
}

int64_t Sampler::size() const {
  if (world_size_ == 1) return dataset_size_;
  if (even_) return (dataset_size_ + world_size_ - 1) / world_size_;
  return rank_ < dataset_size_ ? (dataset_size_ - rank_ + world_size_ - 1) / world_size_ : 0;
}

std::vector<int64_t> Sampler::indices(int64_t epoch) const {
  std::vector<int64_t> all(dataset_size_);
  std::iota(all.begin(), all.end(), 0);
  if (shuffle_ && dataset_size_ > 1) {
    // splitmix64's output for the state seed + epoch increments (the first add is mix64's),
    // so that nearby (seed, epoch) pairs give unrelated streams.
    const uint64_t seed = seed_ ? *seed_ : global_seed();
    std::mt19937_64 gen(detail::mix64(seed + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(epoch)));
    // Fisher-Yates with our own bounded draw: std::uniform_int_distribution and std::shuffle
    // are implementation-defined, and the order must be reproducible everywhere.
    for (int64_t i = dataset_size_ - 1; i > 0; --i) {
      const uint64_t bound = static_cast<uint64_t>(i) + 1;
      const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
      uint64_t r;
      do {
        r = gen();
      } while (r >= limit);
      std::swap(all[i], all[static_cast<int64_t>(r % bound)]);
    }
  }
  if (world_size_ == 1 || dataset_size_ == 0) return all;
  const int64_t per_rank = size();
  const int64_t total = even_ ? per_rank * world_size_ : dataset_size_;
  for (int64_t i = dataset_size_; i < total; ++i)
    all.push_back(all[(i - dataset_size_) % dataset_size_]);
  std::vector<int64_t> mine;
  mine.reserve(per_rank);
  for (int64_t i = rank_; i < total; i += world_size_) mine.push_back(all[i]);
  return mine;
}

}  // namespace volt
