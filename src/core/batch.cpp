#include "volt/core/batch.h"

#include <torch/torch.h>

namespace volt {

int64_t Batch::size() const {
  return input.defined() && input.dim() > 0 ? input.size(0) : 0;
}

Batch Batch::to(const c10::Device& device, bool non_blocking) const {
  Batch out;
  auto move = [&](const at::Tensor& t) { return t.defined() ? t.to(device, non_blocking) : t; };
  out.input = move(input);
  out.target = move(target);
  for (const auto& kv : extra) out.extra.emplace(kv.first, move(kv.second));
  return out;
}

Batch Batch::pin_memory() const {
  Batch out;
  auto pin = [](const at::Tensor& t) { return t.defined() ? t.pin_memory() : t; };
  out.input = pin(input);
  out.target = pin(target);
  for (const auto& kv : extra) out.extra.emplace(kv.first, pin(kv.second));
  return out;
}

}  // namespace volt
