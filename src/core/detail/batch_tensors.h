#pragma once
// Private: a batch's tensors as one list, in a fixed order (input, target, then the extras by
// name), for code that handles every tensor of a batch alike (the graphed step's static copies
// and graph keys, the device prefetch's identity check).

#include <ATen/Tensor.h>

#include <vector>

#include "volt/core/batch.h"

namespace volt {
namespace detail {

inline std::vector<at::Tensor> batch_tensors(const Batch& b) {
  std::vector<at::Tensor> out{b.input, b.target};
  for (const auto& kv : b.extra) out.push_back(kv.second);
  return out;
}

}  // namespace detail
}  // namespace volt
