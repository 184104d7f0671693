#pragma once
/// The order in which a DataLoader visits a dataset: deterministic per (seed, epoch), rank-aware.

#include <c10/util/Optional.h>

#include <cstdint>
#include <vector>

namespace volt {

/// Produces the sample indices of one epoch. Shuffling is a Fisher-Yates pass driven by
/// std::mt19937_64 seeded from (seed, epoch), so the order is identical on every platform and
/// any epoch can be regenerated on resume; without a seed, the global seed (global_seed(), read
/// when an epoch's indices are drawn). With world_size > 1 each rank takes every world_size-th
/// index, after padding to an even split by repeating indices from the start (torch's
/// DistributedSampler) or, with `even` off, without padding, so that the ranks' counts differ by
/// at most one (Lightning's UnrepeatedDistributedSampler).
class Sampler {
 public:
  Sampler(int64_t dataset_size, bool shuffle, c10::optional<uint64_t> seed, int64_t rank = 0,
          int64_t world_size = 1, bool even = true);
  /// The indices this rank visits in `epoch`.
  std::vector<int64_t> indices(int64_t epoch) const;
  /// Number of indices per epoch on this rank.
  int64_t size() const;

 private:
  int64_t dataset_size_;
  bool shuffle_;
  c10::optional<uint64_t> seed_;
  int64_t rank_;
  int64_t world_size_;
  bool even_;
};

}  // namespace volt
