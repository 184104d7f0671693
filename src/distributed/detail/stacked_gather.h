#pragma once
// Private: the stacked, optionally differentiable all_gather over any collective pair (a
// ProcessGroup's, a Strategy's), shared by volt::all_gather and Module::all_gather.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace volt {
namespace detail {

struct GatherCollectives {
  /// Every rank's value, in rank order.
  std::function<std::vector<at::Tensor>(const at::Tensor&)> gather;
  /// A tensor summed over the ranks.
  std::function<at::Tensor(const at::Tensor&)> sum;
  int64_t rank = 0;
};

/// [world_size, *value.sizes()]; with sync_grads (and a value that needs a gradient, grad mode
/// on) the result's backward sums the incoming gradient over the ranks and hands this rank its
/// slice.
at::Tensor stacked_all_gather(const at::Tensor& value, bool sync_grads,
                              const GatherCollectives& collectives);

}  // namespace detail
}  // namespace volt
