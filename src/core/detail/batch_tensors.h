#pragma once
// Private: a batch's tensors as one list, in a fixed order (input, target, then the extras by
// name), for code that handles every tensor of a batch alike (the graphed step's static copies
// and graph keys, the device prefetch's identity check), and the batch's layout: which of those
// tensors it holds under which names (the traced and graphed steps keep a trace or graph per
// layout, since a combined loader in max_size mode drops a part that ran out).

#include <ATen/Tensor.h>

#include <string>
#include <vector>

#include "volt/core/batch.h"

namespace volt {
namespace detail {

inline std::vector<at::Tensor> batch_tensors(const Batch& b) {
  std::vector<at::Tensor> out{b.input, b.target};
  for (const auto& kv : b.extra) out.push_back(kv.second);
  return out;
}

/// "input target a/input a/target": which of the batch's tensors are defined ("-" for input or
/// target when not, "-name" for an undefined extra) and the extras' names, in batch_tensors'
/// order.
inline std::string batch_layout(const Batch& b) {
  std::string s =
      std::string(b.input.defined() ? "input" : "-") + (b.target.defined() ? " target" : " -");
  for (const auto& kv : b.extra) s += (kv.second.defined() ? " " : " -") + kv.first;
  return s;
}

}  // namespace detail
}  // namespace volt
