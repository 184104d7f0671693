#pragma once
// How a list of tensors is cut into flat collectives: ProcessGroup's list collectives and the
// gradient average after backward (detail::average_gradients) use the same buckets.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace volt {
namespace detail {

/// The non-empty `tensors` (all defined) in buckets for a collective each: one dtype per bucket,
/// at most `cap` elements (a larger tensor goes alone), in index order within a dtype. A model's
/// tensors are never copied whole at once, which would double a rank's memory. The same on every
/// rank given the same dtypes and sizes.
inline std::vector<std::vector<size_t> > dtype_buckets(const std::vector<at::Tensor>& tensors,
                                                       int64_t cap) {
  std::map<c10::ScalarType, std::vector<size_t> > by_dtype;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].numel() > 0) by_dtype[tensors[i].scalar_type()].push_back(i);
  }
  std::vector<std::vector<size_t> > buckets;
  for (const auto& [dtype, all] : by_dtype) {
    size_t first = 0;
    while (first < all.size()) {
      size_t last = first;
      int64_t total = 0;
      while (last < all.size() && (total == 0 || total + tensors[all[last]].numel() <= cap)) {
        total += tensors[all[last]].numel();
        ++last;
      }
      buckets.emplace_back(all.begin() + first, all.begin() + last);
      first = last;
    }
  }
  return buckets;
}

}  // namespace detail
}  // namespace volt
