#pragma once
/// The factor clip_grad_norm_ scales gradients by, for the paths that compute the norm in double
/// (the fused clip's float64 case, ZeRO, tensor parallel, the pipeline).

namespace volt {
namespace detail {

/// max_norm / (total + 1e-6) clamped to at most 1 as torch::clamp does it: a NaN norm gives NaN
/// (every gradient becomes NaN, as torch's clip_grad_norm_ makes them), an infinite norm 0.
/// 1 means the gradients stay as they are.
inline double clip_coefficient(double max_norm, double total) {
  const double c = max_norm / (total + 1e-6);
  return c > 1.0 ? 1.0 : c;  // NaN > 1 is false: NaN stays
}

}  // namespace detail
}  // namespace volt
