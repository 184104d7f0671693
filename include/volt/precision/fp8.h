#pragma once
/// fp8 numerics: the E4M3 and E5M2 formats, saturating and non-saturating casts emulated in
/// fp32 (bit-exact to the OCP fp8 spec), per-tensor scaling and the delayed-scaling recipe.

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <iosfwd>
#include <string>

namespace volt {

/// OCP 8-bit floating point formats: E4M3 ("e4m3fn": bias 7, max 448, NaN but no inf) for
/// activations and weights, E5M2 (bias 15, max 57344, inf and NaN) for gradients.
enum class Fp8Format { kE4M3, kE5M2 };

/// Largest finite value of `format` (448 or 57344).
double fp8_max(Fp8Format format);
/// Smallest positive subnormal of `format` (2^-9 or 2^-16).
double fp8_min_subnormal(Fp8Format format);

/// Rounds every element of a floating tensor to the nearest value of `format` (round to
/// nearest, ties to even; subnormals kept; zero keeps its sign) and returns it as fp32: the
/// emulation of a cast to fp8 and back. NaN stays NaN. With `saturate`, values beyond the
/// largest finite value (and ±inf) become ±fp8_max; without, they become what a plain cast gives
/// (E4M3: NaN, E5M2: ±inf), as torch's `.to(float8_*)`.
at::Tensor fp8_round(const at::Tensor& x, Fp8Format format, bool saturate = true);

/// The delayed-scaling recipe (Transformer Engine's DelayedScaling): the scale used at a step
/// comes from the amax history of earlier steps, so no step waits for its own statistics.
struct DelayedScalingOptions {
  /// Power-of-two headroom: scale = fp8_max / amax / 2^margin. Default: 0.
  TORCH_ARG(int64_t, margin) = 0;
  /// Number of past amax values kept per tensor. Default: 16.
  TORCH_ARG(int64_t, amax_history_len) = 16;
  /// "max" (largest amax in the history) or "most_recent". Default: "max".
  TORCH_ARG(std::string, amax_compute_algo) = "max";
  /// Recompute scales every this many steps (amax is recorded every step). Default: 1.
  TORCH_ARG(int64_t, interval) = 1;
  /// "hybrid" (E4M3 forward, E5M2 gradients, the reference's default) or "e4m3" (both).
  /// Default: "hybrid".
  TORCH_ARG(std::string, fp8_format) = "hybrid";
};
std::ostream& operator<<(std::ostream& os, const DelayedScalingOptions& o);
/// Throws ConfigError naming the bad field.
void validate(const DelayedScalingOptions& o);

/// The scale for a tensor whose amax history is `history` (1-D, newest last, zeros = no data):
/// fp8_max / amax / 2^margin, or `previous` where the amax is 0 or not finite. Tensor ops only
/// (no host read).
at::Tensor delayed_scale(const at::Tensor& history, const at::Tensor& previous, Fp8Format format,
                         const DelayedScalingOptions& options);

}  // namespace volt
