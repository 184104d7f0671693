// Each tensor once: libtorch lists a shared layer's tensors once per name.
#include "volt/nn/parameters.h"

#include <unordered_set>

namespace volt {

std::vector<at::Tensor> distinct_tensors(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& t : tensors) {
    if (seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
  }
  return out;
}

std::vector<at::Tensor> distinct_parameters(const torch::nn::Module& module, bool recurse) {
  return distinct_tensors(module.parameters(recurse));
}

}  // namespace volt
