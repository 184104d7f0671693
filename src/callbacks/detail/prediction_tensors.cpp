#include "callbacks/detail/prediction_tensors.h"

#include <torch/torch.h>

#include <cstdio>

namespace volt::detail {

std::string numbered(const char* prefix, int64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%06lld", prefix, static_cast<long long>(n));
  return buf;
}

std::map<std::string, at::Tensor> prediction_tensors(
    const std::vector<at::Tensor>& predictions, const std::vector<std::vector<int64_t>>* indices) {
  auto index_tensor = [](const std::vector<int64_t>& v) { return torch::tensor(v, torch::kInt64); };
  bool rows = !predictions.empty();
  for (size_t i = 0; i < predictions.size() && rows; ++i) {
    const at::Tensor& p = predictions[i];
    const at::Tensor& first = predictions.front();
    rows = p.defined() && p.dim() >= 1 && p.scalar_type() == first.scalar_type() &&
           p.sizes().slice(1) == first.sizes().slice(1) &&
           (indices == nullptr || p.size(0) == static_cast<int64_t>((*indices)[i].size()));
  }
  std::map<std::string, at::Tensor> out;
  if (rows || (predictions.empty() && indices != nullptr)) {
    if (rows) out["predictions"] = torch::cat(predictions, 0);
    if (indices != nullptr) {
      std::vector<int64_t> all;
      for (const auto& b : *indices) all.insert(all.end(), b.begin(), b.end());
      out["indices"] = index_tensor(all);
    }
    return out;
  }
  for (size_t i = 0; i < predictions.size(); ++i) {
    const auto n = static_cast<int64_t>(i);
    if (predictions[i].defined()) out[numbered("batch_", n)] = predictions[i];
    if (indices != nullptr) out[numbered("indices_", n)] = index_tensor((*indices)[i]);
  }
  return out;
}

}  // namespace volt::detail
