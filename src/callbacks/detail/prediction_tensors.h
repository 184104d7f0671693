#pragma once
// The tensors of a predictions file, shared by SafetensorsPredictionWriter and `volt predict`.

#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace volt::detail {

/// `prefix` and `n` in six digits ("batch_000012").
std::string numbered(const char* prefix, int64_t n);

/// One pass's predictions, one per batch, as named tensors: "predictions", their concatenation
/// along dim 0, when every one is defined with a dim 0 and all share dtype and trailing shape
/// (and, given `indices`, each has one row per index of its batch); otherwise
/// "batch_<NNNNNN>" for each defined one. Given `indices` (one list per batch), also the data set
/// indices: "indices" (all, in order; alone, empty, for a pass without batches) beside
/// "predictions", or "indices_<NNNNNN>" per batch.
std::map<std::string, at::Tensor> prediction_tensors(
    const std::vector<at::Tensor>& predictions,
    const std::vector<std::vector<int64_t>>* indices = nullptr);

}  // namespace volt::detail
