#pragma once
// Parameter names by tensor identity: the registered name of a tensor an optimizer holds.

#include <torch/nn/module.h>

#include <string>
#include <unordered_map>

namespace volt::detail {

/// Every defined parameter of `module` and its submodules by its TensorImpl, named as
/// named_parameters() names it; a tensor registered under two names keeps the first.
inline std::unordered_map<const c10::TensorImpl*, std::string> parameter_names_by_impl(
    const torch::nn::Module& module) {
  std::unordered_map<const c10::TensorImpl*, std::string> out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (p.value().defined()) out.emplace(p.value().unsafeGetTensorImpl(), p.key());
  }
  return out;
}

}  // namespace volt::detail
