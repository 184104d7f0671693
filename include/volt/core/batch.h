#pragma once
/// Batch and Example: the unit of data that flows from a DataLoader into a Module.

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <map>
#include <string>

namespace volt {

/// One sample: an input and an optional target (undefined when the data set has no labels).
struct Example {
  at::Tensor input;
  at::Tensor target;
};

/// A collated batch: input and target stacked along dim 0, plus optional named extra tensors.
struct Batch {
  at::Tensor input;
  at::Tensor target;
  std::map<std::string, at::Tensor> extra;

  /// Number of samples (size of dim 0 of `input`), 0 for an empty batch.
  int64_t size() const;
  /// A copy with every tensor moved to `device` (non_blocking only matters for pinned memory).
  Batch to(const c10::Device& device, bool non_blocking = false) const;
  /// A copy with every tensor in page-locked host memory (requires CUDA).
  Batch pin_memory() const;
};

}  // namespace volt
