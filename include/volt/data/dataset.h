#pragma once
/// Map-style datasets: random access by index, with an optional whole-batch fast path.

#include <ATen/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <vector>

#include "volt/core/batch.h"

namespace volt {

/// A map-style dataset. Implementations must be safe to call from several threads at once.
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of samples.
  virtual int64_t size() const = 0;
  /// The sample at `index` (0 <= index < size()).
  virtual Example get(int64_t index) const = 0;
  /// Optional fast path: the collated batch for `indices`, or nullopt to collate get() results.
  virtual c10::optional<Batch> get_batch(const std::vector<int64_t>& indices) const {
    return c10::nullopt;
  }
};

/// A dataset over two in-memory tensors whose dim 0 indexes samples; batches via index_select.
class TensorDataset : public Dataset {
 public:
  /// `targets` may be undefined (unlabelled data); otherwise its dim 0 must match `inputs`.
  TensorDataset(at::Tensor inputs, at::Tensor targets);
  int64_t size() const override;
  Example get(int64_t index) const override;
  c10::optional<Batch> get_batch(const std::vector<int64_t>& indices) const override;
  const at::Tensor& inputs() const { return inputs_; }
  const at::Tensor& targets() const { return targets_; }

 private:
  at::Tensor inputs_;
  at::Tensor targets_;
};

/// Stacks inputs and targets of `examples` along a new dim 0 (the default collate function).
Batch default_collate(const std::vector<Example>& examples);

}  // namespace volt
