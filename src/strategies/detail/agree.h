#pragma once
// Private: collective helpers over a Strategy. run_agreeing: a part of a collective operation
// that some ranks do (rank 0 writes a file, the shard holders write theirs), after which every
// rank must know whether it succeeded, so that no rank goes on into collectives a failed rank
// never reaches (the checkpoint saves of DdpStrategy and of the shard folders).
// broadcast_string: one rank's text on every rank. min_max_over_ranks: the range of a count.

#include <ATen/ATen.h>

#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "volt/strategies/strategy.h"

namespace volt::detail {

/// Runs `work` where `mine`, then every rank of `strategy` learns whether every rank's work
/// succeeded (one boolean reduction, in place of a barrier). A rank whose work threw rethrows
/// its own error; the others get false. Collective: every rank calls it.
inline bool run_agreeing(Strategy& strategy, bool mine, const std::function<void()>& work) {
  std::exception_ptr error;
  if (mine) {
    try {
      work();
    } catch (...) {
      error = std::current_exception();
    }
  }
  const bool everyone = strategy.reduce_boolean_decision(error == nullptr);
  if (error) std::rethrow_exception(error);
  return everyone;
}

/// `text` as rank `src` has it, on every rank of `strategy` (two broadcasts: its length, then
/// its bytes). Collective: every rank calls it.
inline std::string broadcast_string(const Strategy& strategy, const std::string& text,
                                    int64_t src = 0) {
  if (strategy.world_size() == 1) return text;
  const at::Tensor size =
      strategy.broadcast(at::tensor({static_cast<int64_t>(text.size())}, at::kLong), src);
  at::Tensor bytes = at::zeros({size.item<int64_t>()}, at::kByte);
  if (strategy.rank() == src && !text.empty()) {
    std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  }
  bytes = strategy.broadcast(bytes, src);
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                     static_cast<size_t>(bytes.numel()));
}

/// The least and the most of `n` over the ranks of `strategy` (one reduction of {n, -n}; `n`
/// twice for one process). Collective: every rank calls it.
inline std::pair<int64_t, int64_t> min_max_over_ranks(Strategy& strategy, int64_t n) {
  if (strategy.world_size() == 1) return {n, n};
  const at::Tensor most = strategy.reduce(at::tensor({n, -n}, at::kLong), Reduce::kMax);
  return {-most[1].item<int64_t>(), most[0].item<int64_t>()};
}

}  // namespace volt::detail
