#pragma once
// Private: the training mode of a module tree, taken and put back (Module::training_modes and
// to_torchscript, which takes any torch::nn::Module).

#include <vector>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace volt {
namespace detail {

/// The mode of `module` and of each submodule, in modules() order.
std::vector<bool> training_modes(const torch::nn::Module& module);
/// Puts such a list back (train() on everything when submodules were added or removed since).
void set_training_modes(torch::nn::Module& module, const std::vector<bool>& modes);

}  // namespace detail
}  // namespace volt
