#pragma once
/// Fused bias + activation, the epilogue DeepSpeed's inference kernels put after a GEMM: one
/// pass over the product computes act(y + bias) in place, where libtorch's composition writes the
/// bias-added product and then reads it back for the activation. fused_linear_activation is the
/// whole layer: a BLAS product without bias, then that pass.
///
///   auto h = volt::fused_linear_activation(x, fc1->weight, fc1->bias, volt::Activation::kGelu);

#include <ATen/core/Tensor.h>

#include <iosfwd>
#include <string>

namespace volt {

/// The activations the fused epilogue knows (libtorch's definitions).
enum class Activation {
  kIdentity,  ///< y + bias
  kRelu,      ///< max(x, 0)
  kGelu,      ///< x * Phi(x) with erf (GELU(approximate="none"))
  kGeluTanh,  ///< the tanh approximation (GELU(approximate="tanh"))
  kSilu,      ///< x * sigmoid(x)
};

/// "identity", "relu", "gelu", "gelu_tanh", "silu" (ConfigError naming them otherwise).
Activation parse_activation(const std::string& name);
std::string to_string(Activation activation);
std::ostream& operator<<(std::ostream& os, Activation activation);

/// Why `y` (and `bias`) cannot take the fused kernel ("" when they can): it needs contiguous
/// float32 CPU tensors, bias 1-D of y's last size or undefined, and no autograd recording (the
/// kernel is for inference: it has no backward).
std::string fused_bias_activation_reason(const at::Tensor& y, const at::Tensor& bias);

/// y = act(y + bias) in one pass, in place; bias broadcasts over y's last dimension (undefined:
/// no bias). Throws ValueError for mismatched shapes, NotAvailable with the reason when the
/// tensors cannot take the kernel (see fused_bias_activation_reason).
at::Tensor& fused_bias_activation_(at::Tensor& y, const at::Tensor& bias, Activation act);

/// The libtorch composition act(y + bias) (out of place, with autograd): the reference the kernel
/// is tested against and the fallback.
at::Tensor bias_activation_reference(const at::Tensor& y, const at::Tensor& bias, Activation act);

/// act(x W^T + b) for x [..., in], weight [out, in], bias [out] or undefined: the product without
/// bias (at::mm, so tensor parallelism's row-parallel sum still sees it), then the fused
/// epilogue. Where the kernel does not apply (another dtype or device, autograd recording) it runs
/// linear_activation_reference, warned once, or throws NotAvailable when `require_fused`.
at::Tensor fused_linear_activation(const at::Tensor& x, const at::Tensor& weight,
                                   const at::Tensor& bias, Activation act,
                                   bool require_fused = false);

/// act(linear(x, weight, bias)) composed of libtorch ops.
at::Tensor linear_activation_reference(const at::Tensor& x, const at::Tensor& weight,
                                       const at::Tensor& bias, Activation act);

}  // namespace volt
