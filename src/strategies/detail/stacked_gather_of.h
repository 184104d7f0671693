#pragma once
// Private: Module::all_gather's body for any run that has a strategy (the Trainer's run and a
// Fabric's): the stacked, optionally differentiable all_gather over the strategy's collectives.

#include <ATen/core/Tensor.h>

#include "distributed/detail/stacked_gather.h"
#include "volt/strategies/strategy.h"

namespace volt {
namespace detail {

inline at::Tensor stacked_all_gather(const Strategy& strategy, const at::Tensor& value,
                                     bool sync_grads) {
  GatherCollectives c;
  c.gather = [&strategy](const at::Tensor& v) { return strategy.all_gather(v); };
  c.sum = [&strategy](const at::Tensor& g) { return strategy.reduce(g, Reduce::kSum); };
  c.rank = strategy.rank();
  return stacked_all_gather(value, sync_grads, c);
}

}  // namespace detail
}  // namespace volt
