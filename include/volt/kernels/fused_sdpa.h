#pragma once
/// Memory-efficient scaled dot-product attention: a tiled online-softmax (FlashAttention) CPU
/// kernel with autograd, its options (recompute mode, fast softmax, valid sequence lengths,
/// dropout-mask / attention-probability outputs), and the plain libtorch composition beside it.
/// CUDA tensors go to libtorch's own fused kernels (FlashAttention, cuDNN, memory-efficient,
/// through at::scaled_dot_product_attention, libtorch >= 2.1) when the call asks nothing they
/// lack (no attn_mask, valid_seq_len, returned probabilities or mask, or dropout_seed); they
/// always recompute in backward, and fast softmax maps to their exp.
///
///   auto out = volt::fused_sdpa(q, k, v, volt::SdpaOptions().is_causal(true)).output;
///
/// q: [batch, heads, Lq, head_dim], k: [batch, heads, Lk, head_dim], v: [batch, heads, Lk, Dv].

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/arg.h>

#include <cstdint>
#include <iosfwd>
#include <vector>

namespace volt {

/// How the softmax exponent is evaluated.
enum class SoftmaxMode {
  kExact,  ///< float32 exp accurate to ~2 ulp (the default)
  kFast,   ///< cheaper exp approximation (relative error < 2e-4), BF16 inputs only
};

/// Where the padding of a sequence shorter than the padded length sits.
enum class SeqPadding { kLeft, kRight };

/// Options of one fused_sdpa call; every field has the scaled_dot_product_attention default.
struct SdpaOptions {
  /// Boolean (true = may attend) or additive floating mask broadcastable to [B, H, Lq, Lk].
  /// Default: undefined (no mask).
  TORCH_ARG(at::Tensor, attn_mask);
  /// Dropout probability applied to the attention probabilities, in [0, 1). Default: 0.
  TORCH_ARG(double, dropout_p) = 0.0;
  /// Causal (top-left aligned) masking: query i attends keys j <= i. With an attn_mask as well,
  /// both apply (a key must pass each), where torch's scaled_dot_product_attention refuses the
  /// pair. Default: false.
  TORCH_ARG(bool, is_causal) = false;
  /// Softmax scale; unset means 1/sqrt(head_dim). Default: unset.
  TORCH_ARG(c10::optional<double>, scale) = c10::nullopt;
  /// Exact or fast exponent (fast: BF16 only). Default: SoftmaxMode::kExact.
  TORCH_ARG(SoftmaxMode, softmax_mode) = SoftmaxMode::kExact;
  /// true: backward recomputes the probabilities (linear memory); false: the forward keeps them
  /// (quadratic memory, faster backward); unset: the scoped/global setting
  /// (sdpa_recompute_enabled()). Default: unset.
  TORCH_ARG(c10::optional<bool>, recompute) = c10::nullopt;
  /// int32/int64 [B] CPU tensor of valid lengths; positions outside are padding, ignored as keys
  /// and given zero output. Only with is_causal and no attn_mask, and Lq == Lk.
  /// Default: undefined (all positions valid).
  TORCH_ARG(at::Tensor, valid_seq_len);
  /// Side of the padding that valid_seq_len describes. Default: SeqPadding::kRight.
  TORCH_ARG(SeqPadding, seq_padding) = SeqPadding::kRight;
  /// Also return the dropout keep-mask (bool [B, H, Lq, Lk]); non-recompute mode only.
  /// Default: false.
  TORCH_ARG(bool, return_dropout_mask) = false;
  /// Also return the softmax output (before dropout); inference only (no gradient).
  /// Default: false.
  TORCH_ARG(bool, return_attn_probs) = false;
  /// Seed of the counter-based dropout generator; unset draws one from libtorch's default CPU
  /// generator (so volt::seed_everything makes runs repeatable). Default: unset.
  TORCH_ARG(c10::optional<uint64_t>, dropout_seed) = c10::nullopt;
  /// Throw NotAvailable instead of falling back to the reference composition when the fused
  /// kernel does not apply (dtype, device, a mask that needs a gradient). Default: false.
  TORCH_ARG(bool, require_fused) = false;
};

std::ostream& operator<<(std::ostream& os, const SdpaOptions& options);

/// fused_sdpa's outputs. attn_probs / dropout_mask are defined only when requested.
struct SdpaResult {
  at::Tensor output;
  at::Tensor attn_probs;
  at::Tensor dropout_mask;
  /// The reference API's output order: output, [attn_probs], [dropout_mask].
  std::vector<at::Tensor> to_list() const;
};

/// Scaled dot-product attention through the fused kernel (float32 / bfloat16 on CPU; floating
/// dtypes on CUDA, see above), falling back to sdpa_reference (warned once) where the kernel
/// does not apply unless require_fused.
/// A query row with nothing to attend to (fully masked, or padding) yields zeros and zero grads.
SdpaResult fused_sdpa(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                      const SdpaOptions& options = {});

/// The plain libtorch composition (matmul, mask, softmax, dropout, matmul) with exactly the
/// semantics of fused_sdpa; differentiable by autograd; any dtype and device. The reference for
/// tests and the fallback path. Returns the same outputs as fused_sdpa.
SdpaResult sdpa_reference(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const SdpaOptions& options = {});

/// The dropout keep-mask (bool [B, H, Lq, Lk]) that seed `seed` yields: element (b,h,i,j) is
/// kept with probability 1 - p, decided by a counter-based hash of (seed, index).
at::Tensor sdpa_dropout_mask(int64_t batch, int64_t heads, int64_t lq, int64_t lk, double p,
                             uint64_t seed);

/// Sets the process-wide default recompute mode (initially true).
void set_sdpa_recompute(bool enabled);
/// The recompute mode a call without SdpaOptions::recompute gets on this thread: the innermost
/// SdpaRecomputeGuard's value, else the process-wide default.
bool sdpa_recompute_enabled();

/// Scoped recompute mode for this thread; restores the previous scope on destruction.
class SdpaRecomputeGuard {
 public:
  explicit SdpaRecomputeGuard(bool enabled);
  ~SdpaRecomputeGuard();
  SdpaRecomputeGuard(const SdpaRecomputeGuard&) = delete;
  SdpaRecomputeGuard& operator=(const SdpaRecomputeGuard&) = delete;

 private:
  int previous_;  // -1: no enclosing guard, else 0/1
};

}  // namespace volt
