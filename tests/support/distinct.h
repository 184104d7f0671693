#pragma once
// Each tensor once, in order: libtorch's parameters() lists a layer that two modules share (tied
// weights) once per name, and an optimizer given both would step it twice (the Trainer refuses
// that).

#include <ATen/Tensor.h>

#include <vector>

namespace volt_test {

inline std::vector<at::Tensor> distinct(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const auto& t : tensors) {
    bool seen = false;
    for (const auto& u : out) seen = seen || u.is_same(t);
    if (!seen) out.push_back(t);
  }
  return out;
}

}  // namespace volt_test
