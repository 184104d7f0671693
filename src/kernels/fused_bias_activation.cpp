#include "volt/kernels/fused_bias_activation.h"

#include <ATen/autocast_mode.h>

#include <c10/util/accumulate.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <initializer_list>
#include <ostream>

#include "core/detail/numbers.h"
#include "core/detail/tracing.h"
#include "detail/bias_act_cpu.h"
#include "volt/core/check.h"
#include "volt/core/log.h"

namespace volt {
namespace {

constexpr const char* kTag = "[FusedBiasActivation]";

struct Name {
  Activation act;
  const char* name;
};
constexpr Name kNames[] = {{Activation::kIdentity, "identity"},
                           {Activation::kRelu, "relu"},
                           {Activation::kGelu, "gelu"},
                           {Activation::kGeluTanh, "gelu_tanh"},
                           {Activation::kSilu, "silu"}};

void check_shapes(const at::Tensor& y, const at::Tensor& bias) {
  VOLT_CHECK(y.defined() && y.dim() >= 1, ValueError, kTag,
             " the input must be a tensor with at least one dimension.");
  VOLT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == y.size(-1)), ValueError, kTag,
             " bias of shape ", bias.sizes(), " does not match the input's last dimension (input ",
             y.sizes(), "); pass a 1-D bias of ", y.size(-1), " elements or none.");
}

void run_kernel(at::Tensor& y, const at::Tensor& bias, Activation act) {
  const int64_t cols = y.size(-1), rows = cols == 0 ? 0 : y.numel() / cols;
  float* data = y.data_ptr<float>();
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  const int code = static_cast<int>(act);
#if defined(VOLT_BIAS_ACT_AVX2)
  // __builtin_cpu_supports also checks that the OS saves the wider registers.
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx512) {
    detail::bias_act_avx512(data, b, rows, cols, code);
    return;
  }
  if (avx2) {
    detail::bias_act_avx2(data, b, rows, cols, code);
    return;
  }
#endif
  detail::bias_act_default(data, b, rows, cols, code);
}

// Why the kernel cannot take these tensors ("" when it can): CPU, dense float32, no autograd
// recording, and with `contiguous` contiguous memory (the in-place pass walks rows; the linear's
// product reads any strides, so its input may be a view).
std::string kernel_reason(std::initializer_list<const at::Tensor*> tensors, bool contiguous) {
  if (detail::tracing()) return detail::kTracingReason;
  bool requires_grad = false;
  for (const at::Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (!t->device().is_cpu()) {
      return "the tensors are on " + t->device().str() + " (the kernel is CPU-only)";
    }
    if (t->scalar_type() != at::kFloat || t->layout() != at::kStrided ||
        (contiguous && !t->is_contiguous())) {
      auto os = detail::c_stream<std::ostringstream>();
      os << "the kernel needs " << (contiguous ? "contiguous" : "dense") << " float32 tensors (got "
         << t->scalar_type() << (t->is_contiguous() ? "" : ", non-contiguous") << ")";
      return os.str();
    }
    requires_grad = requires_grad || t->requires_grad();
  }
  if (requires_grad && at::GradMode::is_enabled()) {
    return "autograd is recording (the kernel has no backward; run inference under "
           "torch::NoGradGuard)";
  }
  return "";
}

// libtorch's activation ops (the reference of the fused epilogue).
at::Tensor activate(const at::Tensor& z, Activation act) {
  switch (act) {
    case Activation::kIdentity: return z;
    case Activation::kRelu: return at::relu(z);
    case Activation::kGelu: return at::gelu(z);
    case Activation::kGeluTanh: return at::gelu(z, "tanh");
    case Activation::kSilu: return at::silu(z);
  }
  VOLT_ASSERT(false, "unknown Activation ", static_cast<int>(act));
  return z;
}

}  // namespace

Activation parse_activation(const std::string& name) {
  for (const Name& n : kNames) {
    if (name == n.name) return n.act;
  }
  VOLT_CHECK(false, ConfigError, kTag, " activation \"", name,
             "\" is not known; use identity, relu, gelu, gelu_tanh or silu.");
  return Activation::kIdentity;
}

std::string to_string(Activation activation) {
  for (const Name& n : kNames) {
    if (activation == n.act) return n.name;
  }
  VOLT_ASSERT(false, "unknown Activation ", static_cast<int>(activation));
  return "";
}

std::ostream& operator<<(std::ostream& os, Activation activation) {
  return os << to_string(activation);
}

std::string fused_bias_activation_reason(const at::Tensor& y, const at::Tensor& bias) {
  return kernel_reason({&y, &bias}, /*contiguous=*/true);
}

at::Tensor& fused_bias_activation_(at::Tensor& y, const at::Tensor& bias, Activation act) {
  check_shapes(y, bias);
  const std::string reason = fused_bias_activation_reason(y, bias);
  VOLT_CHECK(reason.empty(), NotAvailable, kTag, " the fused kernel does not apply: ", reason,
             "; use volt::bias_activation_reference.");
  run_kernel(y, bias, act);
  // Written through the data pointer: tell autograd, as an in-place op would (a tensor saved
  // for backward and changed here under NoGradGuard then fails backward, not its gradient).
  y.unsafeGetTensorImpl()->bump_version();
  return y;
}

at::Tensor bias_activation_reference(const at::Tensor& y, const at::Tensor& bias, Activation act) {
  check_shapes(y, bias);
  return activate(bias.defined() ? y + bias : y.clone(), act);
}

at::Tensor linear_activation_reference(const at::Tensor& x, const at::Tensor& weight,
                                       const at::Tensor& bias, Activation act) {
  return activate(at::linear(x, weight, bias), act);
}

at::Tensor fused_linear_activation(const at::Tensor& x, const at::Tensor& weight,
                                   const at::Tensor& bias, Activation act, bool require_fused) {
  VOLT_CHECK(x.defined() && weight.defined() && weight.dim() == 2 && x.dim() >= 1 &&
                 x.size(-1) == weight.size(1),
             ValueError, kTag, " input ", x.defined() ? detail::str_cat(x.sizes()) : "undefined",
             " does not fit weight ",
             weight.defined() ? detail::str_cat(weight.sizes()) : "undefined",
             " ([out, in]); the input's last dimension must equal in.");
  VOLT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), ValueError,
             kTag, " bias of shape ", bias.sizes(), " does not match weight ", weight.sizes(),
             "; pass a 1-D bias of ", weight.size(0), " elements or none.");
  std::string reason = kernel_reason({&x, &weight, &bias}, /*contiguous=*/false);
  if (reason.empty() && at::autocast::is_cpu_enabled()) {
    // Autocast may run linear in bfloat16 (the GEMM would come back in a dtype the float kernel
    // cannot take): the composition lets it decide, as it does for libtorch's own linear.
    reason = "CPU autocast is on (it decides the linear's dtype)";
  }
  if (!reason.empty()) {
    VOLT_CHECK(!require_fused, NotAvailable, kTag, " the fused kernel does not apply: ", reason,
               "; drop require_fused to use the reference composition.");
    if (!detail::tracing()) {
      warn_once("bias-act-fallback:" + reason, "FusedBiasActivation",
                "using the reference composition: " + reason + ".");
    }
    return linear_activation_reference(x, weight, bias, act);
  }
  // mm on the 2-D view: libtorch's own linear adds the bias inside the GEMM (addmm), which the
  // epilogue does instead, while the activation's separate pass is gone.
  // Rows counted, not -1: reshape({-1, 0}) of an input with no features is ambiguous.
  const at::Tensor x2 =
      x.reshape({c10::multiply_integers(x.sizes().slice(0, x.dim() - 1)), x.size(-1)});
  at::Tensor y = at::mm(x2, weight.t());
  if (!y.is_contiguous()) y = y.contiguous();
  run_kernel(y, bias.defined() ? bias.contiguous() : bias, act);
  std::vector<int64_t> out = x.sizes().vec();
  out.back() = weight.size(0);
  return y.view(out);
}

}  // namespace volt
