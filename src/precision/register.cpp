// Registers this folder's built-in names; called once from registry() (src/trainer/builtins.cpp).
#include "volt/core/registry.h"
#include "volt/precision/fp32.h"
#include "volt/precision/half.h"
#include "volt/precision/mixed.h"

namespace volt::detail {
namespace {

Params op_list_params() {
  return Params()
      .add("lower_ops", std::vector<std::string>{},
           "operators forced to the lower dtype (LOWER_LIST), e.g. [mm, add.Tensor]")
      .add("fp32_ops", std::vector<std::string>{}, "operators forced to fp32 (FP32_LIST)")
      .add("read_env_lists", true, "also read the files named by LOWER_LIST and FP32_LIST");
}

MixedPrecisionOptions op_list_options(const Args& a, const std::string& dtype) {
  return MixedPrecisionOptions()
      .dtype(dtype)
      .lower_ops(a.get<std::vector<std::string>>("lower_ops"))
      .fp32_ops(a.get<std::vector<std::string>>("fp32_ops"))
      .read_env_lists(a.get<bool>("read_env_lists"));
}

}  // namespace

void register_precisions(Registry& r) {
  r.precisions.add("32-true", "fp32 weights and compute",
                   [] { return std::make_shared<Fp32Precision>(); });
  r.precisions.add("32", "same as 32-true", [] { return std::make_shared<Fp32Precision>(); });
  r.precisions.add("bf16-mixed", "autocast to bf16 in forward; fp32 weights, grads, optimizer",
                   op_list_params(), [](const Args& a) -> std::shared_ptr<Precision> {
                     return std::make_shared<MixedPrecision>(op_list_options(a, "bf16"));
                   });
  const GradScalerOptions s;
  r.precisions.add(
      "16-mixed", "autocast to fp16 in forward with dynamic loss scaling (CUDA)",
      op_list_params()
          .add("init_scale", s.init_scale(), "first loss scale")
          .add("growth_factor", s.growth_factor(), "scale growth after growth_interval good steps")
          .add("backoff_factor", s.backoff_factor(), "scale shrink on inf/NaN gradients")
          .add("growth_interval", s.growth_interval(), "finite steps before the scale grows"),
      [](const Args& a) -> std::shared_ptr<Precision> {
        return std::make_shared<MixedPrecision>(
            op_list_options(a, "fp16")
                .scaler(GradScalerOptions()
                            .init_scale(a.get<double>("init_scale"))
                            .growth_factor(a.get<double>("growth_factor"))
                            .backoff_factor(a.get<double>("backoff_factor"))
                            .growth_interval(a.get<int64_t>("growth_interval"))));
      });
  r.precisions.add("bf16-true", "weights, gradients and compute in bf16",
                   [] { return std::make_shared<HalfPrecision>(); });
}

}  // namespace volt::detail
