#pragma once
// What the tuners put back after their trial runs: a module's parameters and buffers (copied
// into the same tensors, so tied weights stay tied and holders see the old values; gradients
// dropped) and torch's CPU random state.

#include <ATen/Tensor.h>

#include <string>
#include <vector>

namespace volt {

class Module;

namespace detail {

class ModuleSnapshot {
 public:
  /// `tag` names the tuner in the error raised when the module's tensors changed in between.
  ModuleSnapshot(Module& module, std::string tag);
  void restore();

 private:
  Module& module_;
  std::string tag_;
  at::Tensor rng_;
  std::vector<at::Tensor> params_, buffers_;
};

}  // namespace detail
}  // namespace volt
