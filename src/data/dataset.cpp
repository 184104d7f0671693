#include "volt/data/dataset.h"

#include <torch/torch.h>

#include "volt/core/check.h"

namespace volt {

TensorDataset::TensorDataset(at::Tensor inputs, at::Tensor targets)
    : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  VOLT_CHECK(inputs_.defined() && inputs_.dim() >= 1, ValueError,
             "[TensorDataset] inputs must be a tensor with at least one dimension (the sample "
             "index); pass e.g. a [N, features] tensor.");
  VOLT_CHECK(!targets_.defined() || (targets_.dim() >= 1 && targets_.size(0) == inputs_.size(0)),
             ValueError, "[TensorDataset] inputs has ", inputs_.size(0),
             " samples but targets has ", targets_.dim() >= 1 ? targets_.size(0) : 0,
             "; dim 0 of both tensors must index the same samples.");
}

int64_t TensorDataset::size() const {
  return inputs_.size(0);
}

Example TensorDataset::get(int64_t index) const {
  VOLT_CHECK(index >= 0 && index < size(), ValueError, "[TensorDataset] index ", index,
             " out of range for a dataset of ", size(), " samples.");
  return {inputs_[index], targets_.defined() ? targets_[index] : at::Tensor()};
}

c10::optional<Batch> TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  // One gather per tensor instead of N slices + stack: the hot path of every in-memory run.
  auto idx = torch::from_blob(const_cast<int64_t*>(indices.data()),
                              {static_cast<int64_t>(indices.size())}, torch::kLong);
  Batch b;
  b.input = inputs_.index_select(0, idx);
  if (targets_.defined()) b.target = targets_.index_select(0, idx);
  return b;
}

Batch default_collate(const std::vector<Example>& examples) {
  VOLT_CHECK(!examples.empty(), ValueError, "[default_collate] cannot collate an empty list.");
  std::vector<at::Tensor> in, tg;
  in.reserve(examples.size());
  tg.reserve(examples.size());
  for (const auto& e : examples) {
    in.push_back(e.input);
    if (e.target.defined()) tg.push_back(e.target);
  }
  VOLT_CHECK(tg.empty() || tg.size() == in.size(), ValueError, "[default_collate] ", tg.size(),
             " of ", in.size(), " examples have a target; all or none must have one.");
  // torch::stack's own errors name neither the example nor the fix.
  for (size_t i = 0; i < in.size(); ++i) {
    VOLT_CHECK(in[i].defined(), ValueError, "[default_collate] example ", i,
               " of the batch has no input tensor; the data set's get() must set Example::input.");
  }
  const auto check_shapes = [](const std::vector<at::Tensor>& ts, const char* what) {
    for (size_t i = 1; i < ts.size(); ++i) {
      VOLT_CHECK(ts[i].sizes() == ts[0].sizes(), ValueError, "[default_collate] example ", i,
                 " of the batch has ", what, " of shape ", ts[i].sizes(), " but example 0 ",
                 ts[0].sizes(),
                 "; examples of different shapes need a collate that pads them "
                 "(DataLoaderOptions::collate).");
    }
  };
  check_shapes(in, "an input");
  check_shapes(tg, "a target");
  Batch b;
  b.input = torch::stack(in);
  if (!tg.empty()) b.target = torch::stack(tg);
  return b;
}

}  // namespace volt
