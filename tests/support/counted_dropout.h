#pragma once
// A dropout layer (p = 0.5, always drawing) that counts in `recomputed` each time activation
// checkpointing recomputes it: the checkpointing tests check both the masks (replayed) and how
// often each layer ran again.

#include <torch/torch.h>

#include <cstdint>

#include "volt/core/recompute.h"

namespace volt_test {

inline torch::nn::Functional counted_dropout(int64_t& recomputed) {
  return torch::nn::Functional([&recomputed](const at::Tensor& x) {
    if (volt::in_checkpoint_recompute()) ++recomputed;
    return torch::dropout(x, 0.5, /*train=*/true);
  });
}

}  // namespace volt_test
