#pragma once
// Activation checkpointing runs a forward twice; the second run (the recomputation in
// backward) is the same forward, so buffers a layer updates in its forward (BatchNorm's running
// statistics and batch count) must not move again. The module-aware callers of checkpoint_impl
// (Sequential entries, checkpoint_sequential, checkpointed module holders, the pipeline's
// stages) hold one of these around their layers: during a recomputation it copies the buffers
// and writes them back afterwards. (volt::checkpoint(fn, x) with a callable does not know which
// modules fn runs, as torch.utils.checkpoint does not.)

#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/nn/module.h>

#include <vector>

#include "volt/core/recompute.h"

namespace volt {
namespace detail {

class RecomputeKeepsBuffers {
 public:
  /// `modules`' buffers (recursively), when this thread is recomputing; else nothing.
  explicit RecomputeKeepsBuffers(const std::vector<const torch::nn::Module*>& modules) {
    if (!in_checkpoint_recompute()) return;
    for (const auto* m : modules) {
      for (const auto& b : m->buffers(/*recurse=*/true)) {
        if (!b.defined()) continue;
        buffers_.push_back(b);
        before_.push_back(b.detach().clone());
      }
    }
  }
  ~RecomputeKeepsBuffers() {
    at::NoGradGuard no_grad;
    // Below the version counter, as the layer's own update was (BatchNorm's kernel writes its
    // statistics without bumping their version): the recomputed graph saved them, and a bumped
    // version would fail its backward ("modified by an inplace operation").
    at::AutoDispatchBelowADInplaceOrView below_version_counter;
    for (size_t k = 0; k < buffers_.size(); ++k) {
      // A buffer the layer replaced with another shape is left as it is.
      if (buffers_[k].sizes() == before_[k].sizes()) buffers_[k].copy_(before_[k]);
    }
  }
  RecomputeKeepsBuffers(const RecomputeKeepsBuffers&) = delete;
  RecomputeKeepsBuffers& operator=(const RecomputeKeepsBuffers&) = delete;

 private:
  std::vector<at::Tensor> buffers_, before_;
};

}  // namespace detail
}  // namespace volt
