// Registers this folder's built-in names; called once from registry() (src/trainer/builtins.cpp).
#include "volt/core/registry.h"
#include "volt/precision/double.h"
#include "volt/precision/fp32.h"
#include "volt/precision/fp8_precision.h"
#include "volt/precision/half.h"
#include "volt/precision/mixed.h"

namespace volt::detail {
namespace {

Params op_list_params() {
  return Params()
      .add("lower_ops", std::vector<std::string>{},
           "operators forced to the lower dtype (LOWER_LIST), e.g. [mm, add.Tensor]")
      .add("fp32_ops", std::vector<std::string>{}, "operators forced to fp32 (FP32_LIST)")
      .add("read_env_lists", true, "also read the files named by LOWER_LIST and FP32_LIST")
      .add("cpu_policy", true,
           "on CPU keep op families and linear sizes that run slower in bf16 in fp32 (measured)")
      .optional<int64_t>("linear_min_macs",
                         "linears under this many multiply-adds stay fp32 on CPU; unset = "
                         "measured, 0 = off");
}

MixedPrecisionOptions op_list_options(const Args& a, const std::string& dtype) {
  const auto min_macs = a.get_optional<int64_t>("linear_min_macs");
  return MixedPrecisionOptions()
      .dtype(dtype)
      .lower_ops(a.get<std::vector<std::string>>("lower_ops"))
      .fp32_ops(a.get<std::vector<std::string>>("fp32_ops"))
      .read_env_lists(a.get<bool>("read_env_lists"))
      .cpu_policy(a.get<bool>("cpu_policy"))
      .linear_min_macs(min_macs ? c10::optional<int64_t>(*min_macs) : c10::nullopt);
}

}  // namespace

void register_precisions(Registry& r) {
  r.precisions.add("32-true", "fp32 weights and compute",
                   [] { return std::make_shared<Fp32Precision>(); });
  r.precisions.add("32", "same as 32-true", [] { return std::make_shared<Fp32Precision>(); });
  // Lightning's short names ("64", "32", "16", "bf16") are the same entries under a second name.
  const auto bf16_mixed = [](const Args& a) -> std::shared_ptr<Precision> {
    return std::make_shared<MixedPrecision>(op_list_options(a, "bf16"));
  };
  r.precisions.add("bf16-mixed", "autocast to bf16 in forward; fp32 weights, grads, optimizer",
                   op_list_params(), bf16_mixed);
  r.precisions.add("bf16", "same as bf16-mixed", op_list_params(), bf16_mixed);
  const GradScalerOptions s;
  const auto fp16_params =
      op_list_params()
          .add("init_scale", s.init_scale(), "first loss scale")
          .add("growth_factor", s.growth_factor(), "scale growth after growth_interval good steps")
          .add("backoff_factor", s.backoff_factor(), "scale shrink on inf/NaN gradients")
          .add("growth_interval", s.growth_interval(), "finite steps before the scale grows");
  const auto fp16_mixed = [](const Args& a) -> std::shared_ptr<Precision> {
    return std::make_shared<MixedPrecision>(
        op_list_options(a, "fp16").scaler(GradScalerOptions()
                                              .init_scale(a.get<double>("init_scale"))
                                              .growth_factor(a.get<double>("growth_factor"))
                                              .backoff_factor(a.get<double>("backoff_factor"))
                                              .growth_interval(a.get<int64_t>("growth_interval"))));
  };
  r.precisions.add("16-mixed", "autocast to fp16 in forward with dynamic loss scaling (CUDA)",
                   fp16_params, fp16_mixed);
  r.precisions.add("16", "same as 16-mixed", fp16_params, fp16_mixed);
  r.precisions.add("bf16-true", "weights, gradients and compute in bf16",
                   [] { return std::make_shared<HalfPrecision>(); });
  r.precisions.add("64-true", "weights, gradients and compute in float64",
                   [] { return std::make_shared<DoublePrecision>(); });
  r.precisions.add("64", "same as 64-true", [] { return std::make_shared<DoublePrecision>(); });
  const DelayedScalingOptions d;
  r.precisions.add(
      "fp8",
      "Linear layers in fp8 (E4M3 forward, E5M2 gradients, delayed scaling), the rest bf16-mixed; "
      "or fp8 inference (measure, then quantize in another process). CPU: bit-exact emulation",
      op_list_params()
          .add("replace_layers", true, "convert the model's Linear layers at setup")
          .add("skip", std::vector<std::string>{},
               "Linear layers kept out of fp8 (qualified names)")
          .add("margin", d.margin(), "scale headroom: scale = max / amax / 2^margin")
          .add("amax_history_len", d.amax_history_len(), "past amax values kept per tensor")
          .choice("amax_compute_algo", d.amax_compute_algo(), {"max", "most_recent"},
                  "amax from the history's max or its newest value")
          .add("interval", d.interval(), "recompute scales every this many steps")
          .choice("fp8_format", d.fp8_format(), {"hybrid", "e4m3"},
                  "hybrid: E4M3 forward, E5M2 gradients; e4m3: both")
          .add("inference", false, "fp8 inference: measure (quant=false) or quantize (quant=true)")
          .add("quant", false, "quantize from measurements (a process that did not measure)")
          .add("quant_config", "", "quantization config JSON; empty = $QUANT_CONFIG or defaults"),
      [](const Args& a) -> std::shared_ptr<Precision> {
        return std::make_shared<Fp8Precision>(
            Fp8PrecisionOptions()
                .replace_layers(a.get<bool>("replace_layers"))
                .skip(a.get<std::vector<std::string>>("skip"))
                .recipe(DelayedScalingOptions()
                            .margin(a.get<int64_t>("margin"))
                            .amax_history_len(a.get<int64_t>("amax_history_len"))
                            .amax_compute_algo(a.get<std::string>("amax_compute_algo"))
                            .interval(a.get<int64_t>("interval"))
                            .fp8_format(a.get<std::string>("fp8_format")))
                .inference(a.get<bool>("inference"))
                .quant(a.get<bool>("quant"))
                .quant_config(a.get<std::string>("quant_config"))
                .mixed(op_list_options(a, "bf16")));
      });
}

}  // namespace volt::detail
