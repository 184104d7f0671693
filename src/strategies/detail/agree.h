#pragma once
// Private: a part of a collective operation that some ranks do (rank 0 writes a file, the shard
// holders write theirs), after which every rank must know whether it succeeded, so that no rank
// goes on into collectives a failed rank never reaches (the checkpoint saves of DdpStrategy and
// of the shard folders).

#include <exception>
#include <functional>

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

}  // namespace volt::detail
