#include "volt/precision/fp8_linear.h"

#include <torch/torch.h>

#include <cmath>

#include "detail/fp8_core.h"
#include "volt/core/check.h"
#include "volt/core/recompute.h"

namespace volt {
namespace {

at::Tensor fake_quant(const at::Tensor& x, const at::Tensor& scale, Fp8Format f) {
  return fp8_round(x.to(at::kFloat) * scale, f) / scale;
}

// `t` as rows of its last dimension (reshape({-1, n}) cannot size a tensor of no elements).
at::Tensor as_rows(const at::Tensor& t) {
  return t.dim() == 1 ? t.reshape({1, t.size(0)}) : t.flatten(0, -2);
}

// Autograd node of the emulated fp8 matmul: operands on the fp8 grid in forward, the incoming
// gradient on the fp8 grid in backward; gradients reach the fp32 master weight unchanged
// otherwise (straight-through, as real fp8 training does).
struct Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& scale, const at::Tensor& grad_amax,
                            int64_t grad_format) {
    const auto xq = fake_quant(x, scale[0], Fp8Format::kE4M3);
    const auto wq = fake_quant(weight, scale[1], Fp8Format::kE4M3);
    ctx->save_for_backward({xq, wq, scale});
    // Not saved for backward: every backward through the layer writes it (a layer called twice
    // before one backward: the second node's saved copy would fail the version check).
    ctx->saved_data["grad_amax"] = grad_amax;
    ctx->saved_data["grad_format"] = grad_format;
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    return at::linear(xq, wq, bias.defined() ? bias.to(at::kFloat) : bias).to(at::kBFloat16);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& xq = saved[0];
    const auto& wq = saved[1];
    const auto& scale = saved[2];
    at::Tensor grad_amax = ctx->saved_data["grad_amax"].toTensor();
    const auto f = static_cast<Fp8Format>(ctx->saved_data["grad_format"].toInt());
    const at::Tensor g = grads[0].to(at::kFloat);
    {
      // The largest of this step's backwards (the forward rolls it into the history and clears
      // it), as the amax of one call covering all of them.
      torch::NoGradGuard no_grad;
      grad_amax.copy_(at::maximum(grad_amax, detail::amax_of(g).reshape({1})));
    }
    const at::Tensor gq = fake_quant(g, scale[2], f);
    const auto g2 = as_rows(gq);
    const auto x2 = as_rows(xq);
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    at::Tensor gx = gq.matmul(wq).to(x_dtype);
    at::Tensor gw = g2.t().mm(x2);
    // The bias gradient from the incoming gradient itself, not its fp8 image (Transformer
    // Engine's fused cast-transpose-bgrad reduces the high-precision gradient).
    at::Tensor gb = ctx->saved_data["has_bias"].toBool() ? as_rows(g).sum(0) : at::Tensor();
    return {gx, gw, gb, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

namespace detail {

at::Tensor amax_of(const at::Tensor& t) {
  if (t.numel() == 0) return at::zeros({}, t.options().dtype(at::kFloat));
  return t.detach().abs().max().to(at::kFloat);
}

at::Tensor fp8_linear_delayed(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              const Fp8DelayedState& s, bool training) {
  // The emulated GEMM is fp32 by definition: an enclosing bf16 autocast region must not round
  // the dequantized operands again.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto& recipe = s.recipe;
  const auto grad_format = recipe.fp8_format() == "hybrid" ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
  // volt::checkpoint's recomputation in backward is the same forward again: it uses the scales
  // the first pass derived and records nothing (Transformer Engine does the same), so a
  // checkpointed fp8 model trains exactly as an unchecked one.
  if (training && !in_checkpoint_recompute()) {
    torch::NoGradGuard no_grad;
    // Delayed scaling: fold in the previous backward's gradient amax, then derive this step's
    // scales from the history of earlier steps only, then record this step's input and weight
    // amax for the next ones. Tensor ops except one read of the step counter (free on CPU;
    // TODO(#14): keep it on the host for CUDA).
    auto roll_in = [&](int64_t row, const at::Tensor& value) {
      auto h = s.amax_history[row];
      h.copy_(at::cat({h.slice(0, 1), value.reshape({1}).to(h.scalar_type())}));
    };
    const int64_t step = s.steps.item<int64_t>();
    if (step > 0) {
      roll_in(2, s.grad_amax);
      s.grad_amax.zero_();
    }
    if (step % recipe.interval() == 0) {
      s.scale[0].copy_(delayed_scale(s.amax_history[0], s.scale[0], Fp8Format::kE4M3, recipe));
      s.scale[1].copy_(delayed_scale(s.amax_history[1], s.scale[1], Fp8Format::kE4M3, recipe));
      s.scale[2].copy_(delayed_scale(s.amax_history[2], s.scale[2], grad_format, recipe));
    }
    roll_in(0, amax_of(x));
    roll_in(1, amax_of(weight));
    s.steps.add_(1);
  }
  return Fp8LinearFunction::apply(x, weight, bias, s.scale.clone(), s.grad_amax,
                                  static_cast<int64_t>(grad_format));
}

at::Tensor fp8_linear_static(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             const at::Tensor& scales) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  // The gradient row of the scale is unused without a backward; 1 keeps it harmless.
  const auto scale3 =
      at::cat({scales.to(at::kFloat), at::ones({1}, scales.options().dtype(at::kFloat))});
  const auto unused_amax = at::zeros({1}, scale3.options());
  return Fp8LinearFunction::apply(x, weight, bias, scale3, unused_amax,
                                  static_cast<int64_t>(Fp8Format::kE5M2));
}

}  // namespace detail

Fp8LinearImpl::Fp8LinearImpl(int64_t in_features, int64_t out_features, bool bias,
                             DelayedScalingOptions recipe)
    : in_(in_features), out_(out_features), has_bias_(bias), recipe_(std::move(recipe)) {
  VOLT_CHECK(in_ > 0 && out_ > 0, ConfigError, "[Fp8Linear] in_features=", in_,
             " and out_features=", out_, " must be > 0.");
  validate(recipe_);
  reset();
}

Fp8LinearImpl::Fp8LinearImpl(const torch::nn::Linear& from, DelayedScalingOptions recipe)
    : Fp8LinearImpl(from->options.in_features(), from->options.out_features(), from->options.bias(),
                    std::move(recipe)) {
  torch::NoGradGuard no_grad;
  weight.copy_(from->weight);
  if (has_bias_) bias.copy_(from->bias);
}

void Fp8LinearImpl::reset() {
  // Same initialisation as torch::nn::Linear (kaiming-uniform weight, uniform bias).
  weight = register_parameter("weight", torch::empty({out_, in_}));
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (has_bias_) {
    bias = register_parameter("bias", torch::empty({out_}));
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
    torch::nn::init::uniform_(bias, -bound, bound);
  } else {
    bias = register_parameter("bias", at::Tensor(), /*requires_grad=*/false);
  }
  amax_history = register_buffer("amax_history", torch::zeros({3, recipe_.amax_history_len()}));
  scale = register_buffer("scale", torch::ones({3}));
  grad_amax = register_buffer("grad_amax", torch::zeros({1}));
  steps = register_buffer("steps", torch::zeros({1}, torch::kInt64));
}

at::Tensor Fp8LinearImpl::forward(const at::Tensor& x) {
  VOLT_CHECK(x.size(-1) == in_, ValueError, "[Fp8Linear] input has ", x.size(-1),
             " features in its last dimension; this layer takes ", in_, ".");
  return detail::fp8_linear_delayed(
      x, weight, bias, {amax_history, scale, grad_amax, steps, recipe_}, is_training());
}

}  // namespace volt
