#pragma once
/// The order in which a DataLoader visits a dataset: deterministic per (seed, epoch), rank-aware.

#include <cstdint>
#include <vector>

namespace volt {

/// Produces the sample indices of one epoch. Shuffling is a Fisher-Yates pass driven by
/// std::mt19937_64 seeded from (seed, epoch), so the order is identical on every platform and
/// any epoch can be regenerated on resume. With world_size > 1 each rank takes every
/// world_size-th index after padding to an even split (as torch's DistributedSampler does).
class Sampler {
 public:
  Sampler(int64_t dataset_size, bool shuffle, uint64_t seed, int64_t rank = 0,
          int64_t world_size = 1);
  /// The indices this rank visits in `epoch`.
  std::vector<int64_t> indices(int64_t epoch) const;
  /// Number of indices per epoch on this rank.
  int64_t size() const;

 private:
  int64_t dataset_size_;
  bool shuffle_;
  uint64_t seed_;
  int64_t rank_;
  int64_t world_size_;
};

}  // namespace volt
