#pragma once
/// FusedClipNorm: clip_grad_norm_ as one multi-threaded pass over all gradients.

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <iosfwd>
#include <string>
#include <vector>

namespace volt {

/// Settings of FusedClipNorm.
struct FusedClipNormOptions {
  /* implicit */ FusedClipNormOptions(double max_norm) : max_norm_(max_norm) {}  // NOLINT
  /// Largest allowed total norm, >= 0 (required).
  TORCH_ARG(double, max_norm);
  /// Order of the norm: > 0, or infinity for max|g|. Default: 2.0.
  TORCH_ARG(double, norm_type) = 2.0;
  /// Throw ValueError, before changing any gradient, when the total norm is NaN or inf.
  /// Default: false.
  TORCH_ARG(bool, error_if_nonfinite) = false;
};

std::ostream& operator<<(std::ostream& os, const FusedClipNormOptions& o);

/// Clips gradients like torch::nn::utils::clip_grad_norm_ (same coefficient, same NaN/inf
/// behaviour, norm returned in the gradients' dtype) but reads every gradient once, in one
/// at::parallel_for, accumulating in double. The result does not depend on the thread count.
class FusedClipNorm {
 public:
  /// Validates the options; throws ConfigError for norm_type <= 0 (see the .cpp on 0), NaN,
  /// -inf, or max_norm < 0 / NaN.
  explicit FusedClipNorm(FusedClipNormOptions options);
  /// Scales the defined gradients of `params` in place by min(1, max_norm / (norm + 1e-6));
  /// returns the total norm (0 when no parameter has a gradient). Throws ValueError or
  /// NotAvailable for gradients that unsupported_reason() rejects.
  double operator()(const std::vector<at::Tensor>& params) const;
  /// As operator(), but the total norm comes back as a 0-dim tensor that is not read: on CUDA
  /// it stays on the device (float32 or the gradients' dtype, as libtorch's), so nothing waits
  /// for the GPU and a CUDA graph can capture the clip, unless error_if_nonfinite is set (its
  /// check reads the norm); on the CPU it is a double tensor holding operator()'s value.
  at::Tensor clip(const std::vector<at::Tensor>& params) const;
  /// Empty when every defined gradient is a contiguous dense float/double/bfloat16 CPU tensor
  /// listed once and sharing no memory with another (a tied weight listed twice is not), or
  /// every one a dense floating CUDA tensor of one device in a build with libtorch's fused kernels
  /// (then the norm and the scaling run as multi-tensor kernels on the device, and only the
  /// returned norm is read back); else why not (callers fall back to clip_grad_norm_).
  static std::string unsupported_reason(const std::vector<at::Tensor>& params);
  const FusedClipNormOptions& options() const { return options_; }

 private:
  at::Tensor clip_cuda(const std::vector<at::Tensor>& params) const;
  double clip_cpu(const std::vector<at::Tensor>& params) const;
  // True (after checking) when the gradients take the CUDA path; throws when they cannot.
  static bool on_cuda(const std::vector<at::Tensor>& params);
  FusedClipNormOptions options_;
};

/// FusedClipNorm(FusedClipNormOptions(max_norm).norm_type(..).error_if_nonfinite(..))(params),
/// with the signature of torch::nn::utils::clip_grad_norm_.
double fused_clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                             double norm_type = 2.0, bool error_if_nonfinite = false);

}  // namespace volt
