#pragma once
// Private: libtorch's BatchNorm layers (Lightning's _BatchNorm: BatchNorm1d/2d/3d) seen through
// their options and buffers, for the callbacks that change how they update
// (StochasticWeightAveraging's statistics pass, BaseFinetuning's frozen layers).

#include <torch/nn/modules/batchnorm.h>

namespace volt {
namespace detail {

struct BatchNormView {
  torch::nn::BatchNormOptions* options = nullptr;
  at::Tensor* running_mean = nullptr;
  at::Tensor* running_var = nullptr;
  at::Tensor* num_batches_tracked = nullptr;
  explicit operator bool() const { return options != nullptr; }
};

template <typename Impl>
bool view_as_batch_norm(torch::nn::Module& m, BatchNormView& out) {
  auto* bn = dynamic_cast<Impl*>(&m);
  if (bn == nullptr) return false;
  out = {&bn->options, &bn->running_mean, &bn->running_var, &bn->num_batches_tracked};
  return true;
}

/// `m` as a BatchNorm layer; an empty view when it is none.
inline BatchNormView batch_norm_of(torch::nn::Module& m) {
  BatchNormView v;
  view_as_batch_norm<torch::nn::BatchNorm1dImpl>(m, v) ||
      view_as_batch_norm<torch::nn::BatchNorm2dImpl>(m, v) ||
      view_as_batch_norm<torch::nn::BatchNorm3dImpl>(m, v);
  return v;
}

}  // namespace detail
}  // namespace volt
