#pragma once
// The batching of the benchmarks' hand-written libtorch loops: what a libtorch user writes
// without a DataLoader, and the work the Trainer's TensorDataset loader does per batch.

#include <torch/torch.h>

#include <cstdint>

namespace volt_bench {

/// Calls step(x_batch, y_batch) `steps` times: each epoch draws a fresh randperm of the rows,
/// gathers `batch` rows per step with index_select, drops the remainder, and, when `device` is
/// given, calls .to(device) on the batch (as a loop written for a GPU does, even on the CPU).
template <typename Step>
void for_each_batch(const torch::Tensor& x, const torch::Tensor& y, int64_t batch, int64_t steps,
                    const c10::optional<torch::Device>& device, Step&& step) {
  const int64_t n = x.size(0), per_epoch = n / batch;
  int64_t done = 0;
  while (done < steps) {
    auto perm = torch::randperm(n, torch::kLong);
    for (int64_t b = 0; b < per_epoch && done < steps; ++b, ++done) {
      auto idx = perm.slice(0, b * batch, (b + 1) * batch);
      auto xb = x.index_select(0, idx), yb = y.index_select(0, idx);
      if (device) {
        xb = xb.to(*device);
        yb = yb.to(*device);
      }
      step(xb, yb);
    }
  }
}

}  // namespace volt_bench
