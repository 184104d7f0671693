#include "volt/precision/true_precision.h"

#include <torch/torch.h>

#include <utility>

namespace volt {
namespace {

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

TruePrecision::TruePrecision(c10::ScalarType dtype, std::string name)
    : dtype_(dtype), name_(std::move(name)) {}

std::shared_ptr<void> TruePrecision::tensor_init_context() {
  return std::make_shared<DefaultDtype>(c10::scalarTypeToTypeMeta(dtype_));
}

void TruePrecision::convert_module(torch::nn::Module& module) {
  // Module::to(dtype) would also turn integer buffers (BatchNorm's num_batches_tracked) into
  // floats; only floating tensors change here.
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    if (p.is_floating_point()) p.set_data(p.to(dtype_));
  }
  for (auto& b : module.buffers()) {
    if (b.is_floating_point()) b.set_data(b.to(dtype_));
  }
}

Batch TruePrecision::convert_input(const Batch& batch) const {
  const auto convert = [&](const at::Tensor& t) {
    return t.defined() && t.is_floating_point() ? t.to(dtype_) : t;
  };
  Batch out;
  out.input = convert(batch.input);
  out.target = convert(batch.target);
  for (const auto& kv : batch.extra) out.extra[kv.first] = convert(kv.second);
  return out;
}

}  // namespace volt
