#include "volt/precision/half.h"

#include <torch/torch.h>

namespace volt {
namespace {

at::Tensor lower(const at::Tensor& t) {
  return t.defined() && t.is_floating_point() ? t.to(at::kBFloat16) : t;
}

// The process's default dtype set for a scope, the previous one restored at its end.
class DefaultDtype {
 public:
  explicit DefaultDtype(caffe2::TypeMeta dtype) : previous_(c10::get_default_dtype()) {
    c10::set_default_dtype(dtype);
  }
  ~DefaultDtype() { c10::set_default_dtype(previous_); }
  DefaultDtype(const DefaultDtype&) = delete;
  DefaultDtype& operator=(const DefaultDtype&) = delete;

 private:
  caffe2::TypeMeta previous_;
};

}  // namespace

std::shared_ptr<void> HalfPrecision::tensor_init_context() {
  return std::make_shared<DefaultDtype>(caffe2::TypeMeta::Make<c10::BFloat16>());
}

void HalfPrecision::convert_module(torch::nn::Module& module) {
  // Module::to(dtype) would also turn integer buffers (BatchNorm's num_batches_tracked) into
  // bf16; only floating tensors change here.
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    if (p.is_floating_point()) p.set_data(p.to(at::kBFloat16));
  }
  for (auto& b : module.buffers()) {
    if (b.is_floating_point()) b.set_data(b.to(at::kBFloat16));
  }
}

Batch HalfPrecision::convert_input(const Batch& batch) const {
  Batch out;
  out.input = lower(batch.input);
  out.target = lower(batch.target);
  for (const auto& kv : batch.extra) out.extra[kv.first] = lower(kv.second);
  return out;
}

}  // namespace volt
