#pragma once
/// Batch and Example: the unit of data that flows from a DataLoader into a Module.

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <map>
#include <string>
#include <vector>

namespace volt {

/// One sample: an input and an optional target (undefined when the data set has no labels).
struct Example {
  at::Tensor input;
  at::Tensor target;
};

/// A collated batch: input and target stacked along dim 0, plus optional named extra tensors.
///
/// A batch of a combined loader (volt::combined_loader, Lightning's CombinedLoader) holds one
/// batch of each of its loaders, a *part*: its input and target are undefined and each part's
/// tensors are extra entries `<part>/input`, `<part>/target` and `<part>/<extra name>`, so
/// everything that moves, casts or captures a batch's tensors handles combined batches alike.
/// part(name) gives a part back as a Batch.
struct Batch {
  at::Tensor input;
  at::Tensor target;
  std::map<std::string, at::Tensor> extra;

  /// Number of samples, counted as Lightning's extract_batch_size: the rows (dim 0) of `input`
  /// (a 0-dim input is 1 sample); for a combined batch the sum of its parts' sizes (the samples
  /// the step sees); without either, the rows of `target`, else of the first defined `extra`
  /// entry; 0 for an empty batch.
  int64_t size() const;
  /// The names of the parts of a combined batch, sorted (the extra entries named `<part>/...`);
  /// empty for a plain batch.
  std::vector<std::string> part_names() const;
  /// Whether this combined batch holds a batch of loader `name` (with CombineMode::kMaxSize a
  /// loader that has run out is absent from the rest of the epoch's batches).
  bool has_part(const std::string& name) const;
  /// Loader `name`'s batch in this combined batch (its tensors are shared, not copied).
  /// ValueError naming the parts there are when it has none.
  Batch part(const std::string& name) const;
  /// A copy with every tensor moved to `device` (non_blocking only matters for pinned memory).
  Batch to(const c10::Device& device, bool non_blocking = false) const;
  /// A copy with every tensor in page-locked host memory (requires CUDA).
  Batch pin_memory() const;
};

}  // namespace volt
