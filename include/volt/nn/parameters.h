#pragma once
/// Each parameter once. libtorch's Module::parameters() lists a tensor that two submodules share
/// (tied weights: an embedding and the output projection, a layer registered twice) once per
/// name, unlike PyTorch's, and torch::optim steps a tensor as often as it is listed (the Trainer
/// refuses an optimizer that lists one twice). Give an optimizer distinct_parameters(module).

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include <vector>

namespace volt {

/// `module.parameters(recurse)` with each tensor once, in the order of its first name.
std::vector<at::Tensor> distinct_parameters(const torch::nn::Module& module, bool recurse = true);

/// `tensors` with each tensor once (the same TensorImpl), in the order of its first listing.
std::vector<at::Tensor> distinct_tensors(const std::vector<at::Tensor>& tensors);

}  // namespace volt
