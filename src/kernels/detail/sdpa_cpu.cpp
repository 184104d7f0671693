// FusedSDPA CPU kernel: FlashAttention-2 style tiled online softmax (Dao 2023,
// arXiv:2307.08691), float32 accumulation, one (batch, head) per task across torch's intra-op
// pool. Tile GEMMs go to oneDNN's dnnl_sgemm when libtorch loaded it (else the BLAS sgemm_, else
// at::mm); the element-wise row work (masking, exp, dropout, dS) is written to auto-vectorise
// and compiled twice, for AVX2+FMA and for baseline x86-64, picked once at run time.
//
// Streaming (recompute) mode keeps O(L) state per row block: the running max m, the running sum
// l and the unnormalised output; the backward recomputes P = exp(S - lse) tile by tile.
// Materialised (non-recompute) mode writes the normalised probabilities to a [B,H,Lq,Lk]
// buffer so that the backward skips the QK^T GEMM and the exponentials.
//
// This TU is compiled with OpenMP (CMakeLists.txt): at::parallel_for is a header template that
// only opens a parallel region when _OPENMP is defined, and runs serially otherwise.

#include "sdpa_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#ifdef _OPENMP
#include <omp.h>
#if !defined(INTRA_OP_PARALLEL)
// A precompiled header built without OpenMP would make at::parallel_for serial here.
#error "ATen/Parallel.h was included without OpenMP; build this file without the PCH"
#endif
#endif

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "volt/core/check.h"
#include "volt/core/log.h"

namespace volt {
namespace detail {
namespace {

constexpr int64_t kBlockRows = 64;   // query rows per tile
constexpr int64_t kBlockCols = 128;  // keys per tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

#define VOLT_AI inline __attribute__((always_inline))

#ifdef VOLT_HAVE_BLAS
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c, const int* ldc);
#endif

// Tile GEMMs (64x128x64 and alike, ~1 MFLOP) must run on the calling thread: the kernel already
// spreads (batch, head) over torch's pool, and splitting such a GEMM over threads costs more than
// it saves (seq 1024 fwd+bwd: 241 ms with OpenBLAS threading each tile, 169 ms without). OpenBLAS
// 0.3.21 (pthreads) has no per-call or per-thread count, only a process-wide one, which raced
// other threads' GEMMs (issue #16). oneDNN's OpenMP build has the right rule built in: a GEMM
// called inside an active parallel region runs on the calling thread, elsewhere it uses
// omp_get_max_threads(), a per-thread setting. libtorch links oneDNN (Debian: libdnnl.so.2) but
// ships no headers for it, hence dlsym; dnnl_sgemm's C signature is stable since oneDNN 1.0.
using DnnlSgemm = int (*)(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha,
                          const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                          float* c, int64_t ldc);
struct DnnlVersion {  // dnnl_version_t
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};
constexpr unsigned kDnnlRuntimeSeq = 1, kDnnlRuntimeOmp = 2;  // DNNL_RUNTIME_SEQ, _OMP

struct OneDnn {
  DnnlSgemm sgemm = nullptr;
  std::string why_not;  // empty when usable
};

OneDnn find_onednn() {
  OneDnn o;
  auto sgemm = reinterpret_cast<DnnlSgemm>(dlsym(RTLD_DEFAULT, "dnnl_sgemm"));
  auto version = reinterpret_cast<const DnnlVersion* (*)()>(dlsym(RTLD_DEFAULT, "dnnl_version"));
  if (!sgemm || !version) {
    o.why_not = "oneDNN's dnnl_sgemm is not loaded in this process";
    return o;
  }
  const DnnlVersion* v = version();
  const std::string name = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) +
                           "." + std::to_string(v->patch);
  if (v->major < 1) {
    o.why_not = name + " predates the dnnl_sgemm signature volt calls (1.0)";
  } else if (v->cpu_runtime != kDnnlRuntimeSeq && v->cpu_runtime != kDnnlRuntimeOmp) {
    o.why_not = name + " uses CPU threading runtime " + std::to_string(v->cpu_runtime) +
                ", not OpenMP or sequential, so it would thread each tile GEMM";
  } else {
#ifdef _OPENMP
    o.sgemm = sgemm;
#else
    if (v->cpu_runtime == kDnnlRuntimeSeq) {
      o.sgemm = sgemm;
    } else {
      o.why_not = "volt was built without OpenMP, so " + name + " would thread each tile GEMM";
    }
#endif
  }
  return o;
}

const OneDnn& onednn() {
  static const OneDnn o = find_onednn();
  return o;
}

// oneDNN threads a GEMM called outside an active parallel region over this thread's
// omp_get_max_threads(). at::parallel_for runs its body inline (no region) when there is one
// task or it is nested; with torch threads > 1 this thread's count is then > 1. For the kernel
// call it is set to one and restored after: an OpenMP ICV of this thread only, which no other
// thread reads (unlike openblas_set_num_threads).
class SerialTileGemms {
 public:
  SerialTileGemms() {
#ifdef _OPENMP
    if (!omp_in_parallel() && omp_get_max_threads() > 1) {
      previous_ = omp_get_max_threads();
      omp_set_num_threads(1);
    }
#endif
  }
  ~SerialTileGemms() {
#ifdef _OPENMP
    if (previous_ > 0) omp_set_num_threads(previous_);
#endif
  }
  SerialTileGemms(const SerialTileGemms&) = delete;
  SerialTileGemms& operator=(const SerialTileGemms&) = delete;

 private:
  int previous_ = 0;
};

SdpaGemm pick_gemm() {
  if (sdpa_gemm_available(SdpaGemm::kOneDnn)) return SdpaGemm::kOneDnn;
  const SdpaGemm g = sdpa_gemm_available(SdpaGemm::kBlas) ? SdpaGemm::kBlas : SdpaGemm::kAten;
  warn_once("sdpa-tile-gemm", "FusedSDPA",
            std::string("tile GEMMs use ") + sdpa_gemm_name(g) +
                ", which may split each small GEMM over threads (slower): " + onednn().why_not +
                "; a libtorch built with oneDNN (OpenMP) avoids this.");
  return g;
}

// Row-major C = alpha * op(A) * op(B) + beta * C through the process's routine.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  static const SdpaGemm routine = sdpa_gemm_routine();
  sdpa_gemm(routine, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

VOLT_AI uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Keep decision of element `index` (SplitMix64 stream position): kept iff the top 24 bits of
// the hash are >= p * 2^24, so P(keep) = 1 - p up to 2^-24.
VOLT_AI bool keep_bit(uint64_t seed, uint64_t index, uint32_t threshold) {
  return static_cast<uint32_t>(mix64(seed + (index + 1) * 0x9e3779b97f4a7c15ULL) >> 40) >=
         threshold;
}

uint32_t keep_threshold(float p) {
  return static_cast<uint32_t>(std::min<double>(p, 1.0) * 16777216.0);
}

// exp(x) after Cephes expf: range reduction by ln2 (split in two constants), then a degree-6
// polynomial (~2 ulp) or, in fast mode, a degree-3 polynomial fitted for minimax relative error
// on [-ln2/2, ln2/2] (measured max 1.1e-4, far below bf16's 3.9e-3 resolution). Inputs below -87
// (incl. -inf) give exactly 0; NaN stays NaN. The clamp sends NaN to -87 so that the float -> int
// conversion of n below only ever sees a finite value in [-126, 127] (converting NaN is undefined
// behaviour; UBSan's float-cast-overflow caught it, docs/HARDENING.md); the NaN is put back at the
// end.
template <bool kFast>
VOLT_AI float exp_impl(float x_in) {
  const bool underflow = x_in < -87.0f;
  const bool nan = x_in != x_in;
  const float x = std::min(std::max(-87.0f, x_in), 88.0f);  // max(-87, NaN) is -87
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float y;
  if (kFast) {
    y = ((0.16517977f * r + 0.50413038f) * r + 1.00019584f) * r + 1.0f;
  } else {
    y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + r + 1.0f;
  }
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const float out = y * scale;
  return nan ? x_in : (underflow ? 0.0f : out);
}

// True when the row holds a NaN. Only called on rows whose maximum is -inf: row_max skips NaN,
// so such a row is either fully masked or has NaN scores, and the reference gives NaN for the
// latter (softmax over a NaN) but zeros for the former.
bool has_nan(const float* x, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    if (x[c] != x[c]) return true;
  }
  return false;
}

VOLT_AI float row_max(const float* x, int64_t n) {
  float acc[8] = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    for (int t = 0; t < 8; ++t) acc[t] = x[c + t] > acc[t] ? x[c + t] : acc[t];
  }
  float m = kNegInf;
  for (int t = 0; t < 8; ++t) m = acc[t] > m ? acc[t] : m;
  for (; c < n; ++c) m = x[c] > m ? x[c] : m;
  return m;
}

// x[c] = exp(x[c] - m); returns the sum.
template <bool kFast>
VOLT_AI float exp_sub_sum(float* x, int64_t n, float m) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    for (int t = 0; t < 8; ++t) {
      const float e = exp_impl<kFast>(x[c + t] - m);
      x[c + t] = e;
      acc[t] += e;
    }
  }
  float s = 0;
  for (; c < n; ++c) {
    x[c] = exp_impl<kFast>(x[c] - m);
    s += x[c];
  }
  for (int t = 0; t < 8; ++t) s += acc[t];
  return s;
}

template <bool kFast>
VOLT_AI void exp_sub(float* x, int64_t n, float m) {
  for (int64_t c = 0; c < n; ++c) x[c] = exp_impl<kFast>(x[c] - m);
}

VOLT_AI void scale_row(float* x, int64_t n, float a) {
  for (int64_t c = 0; c < n; ++c) x[c] *= a;
}

VOLT_AI float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    for (int t = 0; t < 8; ++t) acc[t] += a[c + t] * b[c + t];
  }
  float s = 0;
  for (; c < n; ++c) s += a[c] * b[c];
  for (int t = 0; t < 8; ++t) s += acc[t];
  return s;
}

struct RowRange {
  int64_t lo = 0, hi = 0;  // keys [lo, hi) may be attended; hi <= lo: a dead row
};

VOLT_AI RowRange row_range(const SdpaProblem& p, int64_t b, int64_t i) {
  RowRange r{0, p.lk};
  if (p.valid_len) {
    const int64_t n = p.valid_len[b];
    if (p.left_padding) {
      if (i < p.lk - n) return RowRange{0, 0};
      r.lo = p.lk - n;
    } else {
      if (i >= n) return RowRange{0, 0};
      r.hi = n;
    }
  }
  if (p.causal) r.hi = std::min(r.hi, i + 1);
  return r;
}

// Applies the key range and the elementwise mask to scores x[0, cols) of row i, keys j0...
VOLT_AI void mask_row(const SdpaProblem& p, int64_t b, int64_t h, int64_t i, int64_t j0,
                      int64_t cols, RowRange range, float* x) {
  const int64_t c_lo = std::min(std::max<int64_t>(range.lo - j0, 0), cols);
  const int64_t c_hi = std::min(std::max<int64_t>(range.hi - j0, c_lo), cols);
  for (int64_t c = 0; c < c_lo; ++c) x[c] = kNegInf;
  for (int64_t c = c_hi; c < cols; ++c) x[c] = kNegInf;
  if (p.mask_f || p.mask_b) {
    const int64_t* s = p.mask_stride;
    const int64_t base = b * s[0] + h * s[1] + i * s[2] + j0 * s[3];
    if (p.mask_f) {
      const float* m = p.mask_f + base;
      for (int64_t c = c_lo; c < c_hi; ++c) x[c] += m[c * s[3]];
    } else {
      const bool* m = p.mask_b + base;
      for (int64_t c = c_lo; c < c_hi; ++c) x[c] = m[c * s[3]] ? x[c] : kNegInf;
    }
  }
}

// z[c] = keep ? 1/(1-p) : 0 for keys j0.. of row `row_index` ((b*H+h)*Lq + i); optionally
// also writes the keep bits.
VOLT_AI void keep_factors(const SdpaProblem& p, int64_t row_index, int64_t j0, int64_t cols,
                          float* z, bool* keep_out) {
  const uint32_t threshold = keep_threshold(p.dropout_p);
  const float inv_keep = 1.0f / (1.0f - p.dropout_p);
  const uint64_t base = static_cast<uint64_t>(row_index) * p.lk + j0;
  for (int64_t c = 0; c < cols; ++c) {
    const bool k = keep_bit(p.seed, base + c, threshold);
    z[c] = k ? inv_keep : 0.0f;
    if (keep_out) keep_out[c] = k;
  }
}

struct ForwardScratch {
  std::vector<float> s, o, m, l, z, pd;
  std::vector<RowRange> ranges;
};

template <bool kFast>
VOLT_AI void forward_streaming(const SdpaProblem& p, int64_t bh, ForwardScratch& w, float* out,
                               float* lse) {
  const int64_t b = bh / p.heads, h = bh % p.heads;
  const float* Q = p.q + bh * p.lq * p.d;
  const float* K = p.k + bh * p.lk * p.d;
  const float* V = p.v + bh * p.lk * p.dv;
  float* O = out + bh * p.lq * p.dv;
  float* L = lse + bh * p.lq;
  const bool dropout = p.dropout_p > 0;
  for (int64_t i0 = 0; i0 < p.lq; i0 += kBlockRows) {
    const int64_t rows = std::min(kBlockRows, p.lq - i0);
    int64_t blo = p.lk, bhi = 0;
    for (int64_t r = 0; r < rows; ++r) {
      w.ranges[r] = row_range(p, b, i0 + r);
      if (w.ranges[r].hi > w.ranges[r].lo) {
        blo = std::min(blo, w.ranges[r].lo);
        bhi = std::max(bhi, w.ranges[r].hi);
      }
    }
    std::fill(w.m.begin(), w.m.begin() + rows, kNegInf);
    std::fill(w.l.begin(), w.l.begin() + rows, 0.0f);
    std::fill(w.o.begin(), w.o.begin() + rows * p.dv, 0.0f);
    for (int64_t j0 = blo; j0 < bhi; j0 += kBlockCols) {
      const int64_t cols = std::min(kBlockCols, bhi - j0);
      float* S = w.s.data();
      gemm(false, true, rows, cols, p.d, p.scale, Q + i0 * p.d, p.d, K + j0 * p.d, p.d, 0.0f, S,
           kBlockCols);
      for (int64_t r = 0; r < rows; ++r) {
        float* x = S + r * kBlockCols;
        mask_row(p, b, h, i0 + r, j0, cols, w.ranges[r], x);
        const float mx = row_max(x, cols);
        const float m_new = std::max(w.m[r], mx);
        if (m_new == kNegInf) {
          // NaN scores poison l (and through it the whole row), as in the reference.
          if (has_nan(x, cols)) w.l[r] = std::numeric_limits<float>::quiet_NaN();
          std::fill(x, x + cols, 0.0f);
          continue;
        }
        const float alpha = exp_impl<false>(w.m[r] - m_new);
        const float sum = exp_sub_sum<kFast>(x, cols, m_new);
        w.l[r] = w.l[r] * alpha + sum;
        if (alpha != 1.0f) scale_row(w.o.data() + r * p.dv, p.dv, alpha);
        w.m[r] = m_new;
        if (dropout) {
          keep_factors(p, bh * p.lq + i0 + r, j0, cols, w.z.data(), nullptr);
          for (int64_t c = 0; c < cols; ++c) x[c] *= w.z[c];
        }
      }
      gemm(false, false, rows, p.dv, cols, 1.0f, S, kBlockCols, V + j0 * p.dv, p.dv, 1.0f,
           w.o.data(), p.dv);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = O + (i0 + r) * p.dv;
      // l == 0 only when every key was masked: zeros, as the reference. A NaN l (NaN scores)
      // must give NaN, not zeros.
      if (w.l[r] != 0.0f) {
        const float inv = 1.0f / w.l[r];
        const float* src = w.o.data() + r * p.dv;
        for (int64_t c = 0; c < p.dv; ++c) dst[c] = src[c] * inv;
        L[i0 + r] = w.m[r] + std::log(w.l[r]);
      } else {
        std::fill(dst, dst + p.dv, 0.0f);
        L[i0 + r] = kNegInf;
      }
    }
  }
}

template <bool kFast>
VOLT_AI void forward_materialised(const SdpaProblem& p, int64_t bh, ForwardScratch& w, float* out,
                                  float* lse, float* probs, bool* keep) {
  const int64_t b = bh / p.heads, h = bh % p.heads;
  const float* Q = p.q + bh * p.lq * p.d;
  const float* K = p.k + bh * p.lk * p.d;
  const float* V = p.v + bh * p.lk * p.dv;
  float* O = out + bh * p.lq * p.dv;
  float* L = lse + bh * p.lq;
  const bool dropout = p.dropout_p > 0;
  for (int64_t i0 = 0; i0 < p.lq; i0 += kBlockRows) {
    const int64_t rows = std::min(kBlockRows, p.lq - i0);
    float* P = probs + (bh * p.lq + i0) * p.lk;
    for (int64_t j0 = 0; j0 < p.lk; j0 += kBlockCols) {
      const int64_t cols = std::min(kBlockCols, p.lk - j0);
      gemm(false, true, rows, cols, p.d, p.scale, Q + i0 * p.d, p.d, K + j0 * p.d, p.d, 0.0f,
           P + j0, p.lk);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* x = P + r * p.lk;
      mask_row(p, b, h, i0 + r, 0, p.lk, row_range(p, b, i0 + r), x);
      const float mx = row_max(x, p.lk);
      float* pd = w.pd.data() + r * p.lk;
      // A fully masked row gives zeros. A row whose unmasked scores are all NaN (row_max skips
      // NaN) goes on: exp(x - -inf) is NaN everywhere, as the reference's softmax.
      if (mx == kNegInf && !has_nan(x, p.lk)) {
        std::fill(x, x + p.lk, 0.0f);
        if (dropout) std::fill(pd, pd + p.lk, 0.0f);
        if (keep)
          keep_factors(p, bh * p.lq + i0 + r, 0, p.lk, w.z.data(),
                       keep + (bh * p.lq + i0 + r) * p.lk);
        L[i0 + r] = kNegInf;
        continue;
      }
      const float sum = exp_sub_sum<kFast>(x, p.lk, mx);
      scale_row(x, p.lk, 1.0f / sum);
      L[i0 + r] = mx + std::log(sum);
      if (dropout || keep) {
        keep_factors(p, bh * p.lq + i0 + r, 0, p.lk, w.z.data(),
                     keep ? keep + (bh * p.lq + i0 + r) * p.lk : nullptr);
      }
      if (dropout) {
        for (int64_t c = 0; c < p.lk; ++c) pd[c] = x[c] * w.z[c];
      }
    }
    gemm(false, false, rows, p.dv, p.lk, 1.0f, dropout ? w.pd.data() : P, p.lk, V, p.dv, 0.0f,
         O + i0 * p.dv, p.dv);
  }
}

struct BackwardScratch {
  std::vector<float> s, pd, dp, z, dk, dv, dvec;
  std::vector<RowRange> ranges;
};

template <bool kFast>
VOLT_AI void backward_bh(const SdpaProblem& p, int64_t bh, BackwardScratch& w, const float* out,
                         const float* dout, const float* lse, const float* probs, const bool* keep,
                         float* dq, float* dk, float* dv) {
  const int64_t b = bh / p.heads, h = bh % p.heads;
  const float* Q = p.q + bh * p.lq * p.d;
  const float* K = p.k + bh * p.lk * p.d;
  const float* V = p.v + bh * p.lk * p.dv;
  const float* O = out + bh * p.lq * p.dv;
  const float* dO = dout + bh * p.lq * p.dv;
  const float* L = lse + bh * p.lq;
  float* dQ = dq + bh * p.lq * p.d;
  float* dK = dk + bh * p.lk * p.d;
  float* dV = dv + bh * p.lk * p.dv;
  const bool dropout = p.dropout_p > 0;
  const float inv_keep = dropout ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
  // D_i = rowsum(dO_i * O_i) = rowsum(P_i * dP_i): the softmax backward's correction term.
  for (int64_t i = 0; i < p.lq; ++i) w.dvec[i] = dot(dO + i * p.dv, O + i * p.dv, p.dv);
  std::fill(dQ, dQ + p.lq * p.d, 0.0f);
  for (int64_t i = 0; i < p.lq; ++i) w.ranges[i] = row_range(p, b, i);
  for (int64_t j0 = 0; j0 < p.lk; j0 += kBlockCols) {
    const int64_t cols = std::min(kBlockCols, p.lk - j0);
    std::fill(w.dk.begin(), w.dk.begin() + cols * p.d, 0.0f);
    std::fill(w.dv.begin(), w.dv.begin() + cols * p.dv, 0.0f);
    for (int64_t i0 = 0; i0 < p.lq; i0 += kBlockRows) {
      const int64_t rows = std::min(kBlockRows, p.lq - i0);
      bool touches = false;
      for (int64_t r = 0; r < rows && !touches; ++r) {
        const RowRange rr = w.ranges[i0 + r];
        touches = rr.hi > rr.lo && rr.hi > j0 && rr.lo < j0 + cols && L[i0 + r] != kNegInf;
      }
      if (!touches) continue;
      const float* P;
      int64_t ldp;
      if (probs) {
        P = probs + (bh * p.lq + i0) * p.lk + j0;
        ldp = p.lk;
      } else {
        float* S = w.s.data();
        gemm(false, true, rows, cols, p.d, p.scale, Q + i0 * p.d, p.d, K + j0 * p.d, p.d, 0.0f, S,
             kBlockCols);
        for (int64_t r = 0; r < rows; ++r) {
          float* x = S + r * kBlockCols;
          if (L[i0 + r] == kNegInf) {
            std::fill(x, x + cols, 0.0f);
            continue;
          }
          mask_row(p, b, h, i0 + r, j0, cols, w.ranges[i0 + r], x);
          exp_sub<kFast>(x, cols, L[i0 + r]);
        }
        P = S;
        ldp = kBlockCols;
      }
      const float* A = P;
      int64_t lda = ldp;
      if (dropout) {
        for (int64_t r = 0; r < rows; ++r) {
          float* z = w.z.data() + r * kBlockCols;
          if (keep) {
            const bool* kb = keep + (bh * p.lq + i0 + r) * p.lk + j0;
            for (int64_t c = 0; c < cols; ++c) z[c] = kb[c] ? inv_keep : 0.0f;
          } else {
            keep_factors(p, bh * p.lq + i0 + r, j0, cols, z, nullptr);
          }
          float* pd = w.pd.data() + r * kBlockCols;
          const float* pr = P + r * ldp;
          for (int64_t c = 0; c < cols; ++c) pd[c] = pr[c] * z[c];
        }
        A = w.pd.data();
        lda = kBlockCols;
      }
      // dV_j += Pd^T dO_i
      gemm(true, false, cols, p.dv, rows, 1.0f, A, lda, dO + i0 * p.dv, p.dv, 1.0f, w.dv.data(),
           p.dv);
      // dPd = dO_i V_j^T
      float* dP = w.dp.data();
      gemm(false, true, rows, cols, p.dv, 1.0f, dO + i0 * p.dv, p.dv, V + j0 * p.dv, p.dv, 0.0f, dP,
           kBlockCols);
      // dS = P * (dPd * z - D_i)
      for (int64_t r = 0; r < rows; ++r) {
        float* g = dP + r * kBlockCols;
        const float* pr = P + r * ldp;
        const float di = w.dvec[i0 + r];
        if (dropout) {
          const float* z = w.z.data() + r * kBlockCols;
          for (int64_t c = 0; c < cols; ++c) g[c] = pr[c] * (g[c] * z[c] - di);
        } else {
          for (int64_t c = 0; c < cols; ++c) g[c] = pr[c] * (g[c] - di);
        }
      }
      // dQ_i += scale * dS K_j ; dK_j += scale * dS^T Q_i
      gemm(false, false, rows, p.d, cols, p.scale, dP, kBlockCols, K + j0 * p.d, p.d, 1.0f,
           dQ + i0 * p.d, p.d);
      gemm(true, false, cols, p.d, rows, p.scale, dP, kBlockCols, Q + i0 * p.d, p.d, 1.0f,
           w.dk.data(), p.d);
    }
    std::copy(w.dk.begin(), w.dk.begin() + cols * p.d, dK + j0 * p.d);
    std::copy(w.dv.begin(), w.dv.begin() + cols * p.dv, dV + j0 * p.dv);
  }
}

// The same bodies compiled for AVX2+FMA and for baseline x86-64 (lambdas would not inherit the
// target attribute, hence plain functions).
#define VOLT_SDPA_VARIANT(NAME, ATTR)                                                            \
  ATTR void NAME##_forward(const SdpaProblem& p, int64_t bh, ForwardScratch& w, float* out,      \
                           float* lse, float* probs, bool* keep) {                               \
    if (probs) {                                                                                 \
      p.fast_exp ? forward_materialised<true>(p, bh, w, out, lse, probs, keep)                   \
                 : forward_materialised<false>(p, bh, w, out, lse, probs, keep);                 \
    } else {                                                                                     \
      p.fast_exp ? forward_streaming<true>(p, bh, w, out, lse)                                   \
                 : forward_streaming<false>(p, bh, w, out, lse);                                 \
    }                                                                                            \
  }                                                                                              \
  ATTR void NAME##_backward(                                                                     \
      const SdpaProblem& p, int64_t bh, BackwardScratch& w, const float* out, const float* dout, \
      const float* lse, const float* probs, const bool* keep, float* dq, float* dk, float* dv) { \
    p.fast_exp ? backward_bh<true>(p, bh, w, out, dout, lse, probs, keep, dq, dk, dv)            \
               : backward_bh<false>(p, bh, w, out, dout, lse, probs, keep, dq, dk, dv);          \
  }                                                                                              \
  ATTR float NAME##_exp(float x, bool fast) {                                                    \
    return fast ? exp_impl<true>(x) : exp_impl<false>(x);                                        \
  }

#if defined(__x86_64__) && defined(__GNUC__)
VOLT_SDPA_VARIANT(avx2, __attribute__((target("avx2,fma"))))
bool use_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}
#else
bool use_avx2() {
  return false;
}
#endif
VOLT_SDPA_VARIANT(generic, )

#if defined(__x86_64__) && defined(__GNUC__)
#define VOLT_SDPA_CALL(fn, ...) (use_avx2() ? avx2_##fn(__VA_ARGS__) : generic_##fn(__VA_ARGS__))
#else
#define VOLT_SDPA_CALL(fn, ...) generic_##fn(__VA_ARGS__)
#endif

}  // namespace

void sdpa_forward(const SdpaProblem& p, float* out, float* lse, float* probs, bool* keep) {
  at::parallel_for(0, p.batch * p.heads, 1, [&](int64_t begin, int64_t end) {
    SerialTileGemms serial;
    ForwardScratch w;
    w.s.resize(kBlockRows * kBlockCols);
    w.o.resize(kBlockRows * p.dv);
    w.m.resize(kBlockRows);
    w.l.resize(kBlockRows);
    w.z.resize(std::max(kBlockCols, probs ? p.lk : 0));
    w.ranges.resize(kBlockRows);
    if (probs && p.dropout_p > 0) w.pd.resize(kBlockRows * p.lk);
    for (int64_t bh = begin; bh < end; ++bh) {
      VOLT_SDPA_CALL(forward, p, bh, w, out, lse, probs, keep);
    }
  });
}

void sdpa_backward(const SdpaProblem& p, const float* out, const float* dout, const float* lse,
                   const float* probs, const bool* keep, float* dq, float* dk, float* dv) {
  at::parallel_for(0, p.batch * p.heads, 1, [&](int64_t begin, int64_t end) {
    SerialTileGemms serial;
    BackwardScratch w;
    w.s.resize(kBlockRows * kBlockCols);
    w.pd.resize(kBlockRows * kBlockCols);
    w.dp.resize(kBlockRows * kBlockCols);
    w.z.resize(kBlockRows * kBlockCols);
    w.dk.resize(kBlockCols * p.d);
    w.dv.resize(kBlockCols * p.dv);
    w.dvec.resize(p.lq);
    w.ranges.resize(p.lq);
    for (int64_t bh = begin; bh < end; ++bh) {
      VOLT_SDPA_CALL(backward, p, bh, w, out, dout, lse, probs, keep, dq, dk, dv);
    }
  });
}

void sdpa_dropout_keep(int64_t batch, int64_t heads, int64_t lq, int64_t lk, float p, uint64_t seed,
                       bool* keep) {
  const uint32_t threshold = keep_threshold(p);
  at::parallel_for(0, batch * heads * lq, 64, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const uint64_t base = static_cast<uint64_t>(row) * lk;
      for (int64_t c = 0; c < lk; ++c) keep[row * lk + c] = keep_bit(seed, base + c, threshold);
    }
  });
}

float sdpa_exp(float x, bool fast) {
  return VOLT_SDPA_CALL(exp, x, fast);
}

const char* sdpa_gemm_name(SdpaGemm g) {
  switch (g) {
    case SdpaGemm::kOneDnn: return "oneDNN dnnl_sgemm";
    case SdpaGemm::kBlas: return "BLAS sgemm_";
    case SdpaGemm::kAten: return "at::mm";
  }
  return "?";
}

bool sdpa_gemm_available(SdpaGemm g, const char** why_not) {
  const char* reason = nullptr;
  switch (g) {
    case SdpaGemm::kOneDnn:
      if (!onednn().sgemm) reason = onednn().why_not.c_str();
      break;
    case SdpaGemm::kBlas:
#ifndef VOLT_HAVE_BLAS
      reason = "volt was built without a BLAS library";
#endif
      break;
    case SdpaGemm::kAten: break;
  }
  if (reason && why_not) *why_not = reason;
  return reason == nullptr;
}

SdpaGemm sdpa_gemm_routine() {
  static const SdpaGemm g = pick_gemm();
  return g;
}

void sdpa_gemm(SdpaGemm g, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  switch (g) {
    case SdpaGemm::kOneDnn: {
      const int status = onednn().sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b,
                                        ldb, beta, c, ldc);
      VOLT_ASSERT(status == 0, "dnnl_sgemm returned status ", status, " for m=", m, " n=", n,
                  " k=", k);
      return;
    }
    case SdpaGemm::kBlas: {
#ifdef VOLT_HAVE_BLAS
      // Column-major BLAS computes the row-major product as C^T = op(B)^T op(A)^T.
      const char tra = ta ? 'T' : 'N', trb = tb ? 'T' : 'N';
      const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
      const int la = static_cast<int>(lda), lb = static_cast<int>(ldb);
      const int lc = static_cast<int>(ldc);
      sgemm_(&trb, &tra, &ni, &mi, &ki, &alpha, b, &lb, a, &la, &beta, c, &lc);
      return;
#else
      break;
#endif
    }
    case SdpaGemm::kAten: {
      // On borrowed buffers; slower (dispatcher overhead per tile).
      auto f32 = at::TensorOptions().dtype(at::kFloat);
      at::Tensor A = at::from_blob(
          const_cast<float*>(a), ta ? at::IntArrayRef{k, m} : at::IntArrayRef{m, k}, {lda, 1}, f32);
      at::Tensor B = at::from_blob(
          const_cast<float*>(b), tb ? at::IntArrayRef{n, k} : at::IntArrayRef{k, n}, {ldb, 1}, f32);
      at::Tensor C = at::from_blob(c, {m, n}, {ldc, 1}, f32);
      if (ta) A = A.t();
      if (tb) B = B.t();
      if (beta == 0.0f) {
        at::mm_out(C, A, B);
        if (alpha != 1.0f) C.mul_(alpha);
      } else {
        C.mul_(beta).addmm_(A, B, 1.0, alpha);
      }
      return;
    }
  }
  VOLT_ASSERT(false, "tile GEMM routine ", sdpa_gemm_name(g), " is not available");
}

}  // namespace detail
}  // namespace volt
