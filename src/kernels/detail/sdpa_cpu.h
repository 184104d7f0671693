#pragma once
// The FusedSDPA CPU kernel on raw float32 buffers (no libtorch types), so its TU stays light.

#include <cstdint>

namespace volt {
namespace detail {

/// One attention problem: contiguous float32 q [B,H,Lq,D], k [B,H,Lk,D], v [B,H,Lk,Dv].
struct SdpaProblem {
  int64_t batch = 0, heads = 0, lq = 0, lk = 0, d = 0, dv = 0;
  float scale = 1.f;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  // Optional elementwise mask over [B,H,Lq,Lk] with element strides (0 = broadcast):
  // additive float (mask_f) or boolean keep (mask_b); at most one is set.
  const float* mask_f = nullptr;
  const bool* mask_b = nullptr;
  int64_t mask_stride[4] = {0, 0, 0, 0};
  bool causal = false;
  // Optional [B] valid lengths (requires lq == lk); padding on the left or the right.
  const int64_t* valid_len = nullptr;
  bool left_padding = false;
  float dropout_p = 0.f;
  uint64_t seed = 0;
  bool fast_exp = false;
};

/// Forward. Writes out [B,H,Lq,Dv] and lse [B,H,Lq] (log-sum-exp per row, -inf for rows with
/// nothing to attend to). With `probs` ([B,H,Lq,Lk]) it also stores the normalised softmax
/// output (materialised mode); with `keep` ([B,H,Lq,Lk]) the dropout keep-mask.
void sdpa_forward(const SdpaProblem& p, float* out, float* lse, float* probs, bool* keep);

/// Backward. dq/dk/dv are written (not accumulated). `probs`/`keep` are the forward's
/// materialised buffers or nullptr (then recomputed from q, k and lse / the seed).
void sdpa_backward(const SdpaProblem& p, const float* out, const float* dout, const float* lse,
                   const float* probs, const bool* keep, float* dq, float* dk, float* dv);

/// Fills keep[B*H*Lq*Lk] with the dropout decisions of (seed, p): the same ones the kernel uses.
void sdpa_dropout_keep(int64_t batch, int64_t heads, int64_t lq, int64_t lk, float p, uint64_t seed,
                       bool* keep);

/// exp(x) as the kernel evaluates it (exact or fast); exposed to measure its error.
float sdpa_exp(float x, bool fast);

/// The routines that can run the kernel's tile GEMMs, in order of preference: oneDNN's
/// dnnl_sgemm (found at run time), the BLAS sgemm_ volt links, at::mm.
enum class SdpaGemm { kOneDnn, kBlas, kAten };

/// "oneDNN", "BLAS sgemm_" or "at::mm".
const char* sdpa_gemm_name(SdpaGemm g);

/// Whether `g` can run in this process; if not and `why_not` is given, the reason.
bool sdpa_gemm_available(SdpaGemm g, const char** why_not = nullptr);

/// The routine the kernel uses: the first available one (chosen once per process).
SdpaGemm sdpa_gemm_routine();

/// Row-major C[m,n] = alpha * op(A) * op(B) + beta * C through `g`, which must be available.
/// The kernel's tile GEMMs; exposed to test each routine.
void sdpa_gemm(SdpaGemm g, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

}  // namespace detail
}  // namespace volt
