#include "multi_tensor.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "volt/core/check.h"
#include "volt/core/version.h"

// Numerics: every kernel repeats libtorch 1.13's op sequence for the same optimizer with the
// same roundings. Measured on its AVX2 CPU kernels (tools-free probe, see the tests): add_(x,
// alpha) computes fma(x, alpha, self); addcmul_(a, b, v) computes fma(v*a, b, self); addcdiv_
// computes (v*a)/b + self without FMA; mul_/div_ by a scalar round once; scalars are first
// rounded to the tensor dtype. This TU is built with -ffp-contract=off so the compiler adds no
// other FMAs; the results then match torch::optim bit for bit on AVX2 machines.
//
// bfloat16 tensors: libtorch's CPU kernels load bf16 as float, compute there and round the
// result to bf16 once per op. Measured with tools/bf16_op_rounding.py (every element of 1e6,
// five AdamW/Adam steps, amsgrad or not) on libtorch 1.13: mul_/div_ by a scalar and add_(x,
// alpha) round the scalar to bf16 first, add_ is one fma in the vector lanes (the scalar tail
// of each thread's chunk rounds alpha * x first, so libtorch's bf16 result moves with the thread
// count and the vector width; volt rounds every element as the lanes do, at any thread count:
// tests/kernels/fused_optim_test.cpp, tol_for); addcmul_/addcdiv_ keep their value in
// float; sqrt and max are exact up to the one rounding. libtorch 2.x computes a binary op in
// float ("opmath") when its *second* input is a wrapped scalar: div_(s) (self.div_(wrapped(s)))
// does, so it divides by the float scalar. The C++ Tensor::mul_(Scalar) does not: it is
// at::mul_out(self, wrapped(s), self), the scalar is the first input and is rounded to bf16 as in
// 1.13 (read in 2.x's BinaryOps.cpp / BinaryOpsKernel.cpp, session 24; Python's t.mul_(s), which
// the 2.11 probe of session 23 measured, takes the float path, hence the earlier model, whose
// later steps differed from 2.11's torch::optim). The *_bf16 bodies repeat torch::optim's C++
// sequence with these roundings; kDivScalarInFloat picks the version (1.13 measured; 2.x's
// mul_ rule read from its source and still to be measured against 2.11's torch::optim).

#if defined(__GNUC__) && defined(__x86_64__)
#define VOLT_AVX2_TARGET __attribute__((target("avx2,fma")))
#define VOLT_HAS_AVX2_BUILD 1
#else
#define VOLT_AVX2_TARGET
#define VOLT_HAS_AVX2_BUILD 0
#endif
#define VOLT_ALWAYS_INLINE inline __attribute__((always_inline))

namespace volt {
namespace detail {
namespace {

// Below this many elements per extra thread, waking the pool costs more than it saves.
constexpr int64_t kMinNumelPerThread = 1 << 15;

template <typename T, bool kAmsgrad, AdamDecay kDecay>
VOLT_ALWAYS_INLINE void adam_body(const TensorChunk& c) {
  T* __restrict p = static_cast<T*>(c.ptr[0]);
  const T* __restrict g = static_cast<const T*>(c.ptr[1]);
  T* __restrict m = static_cast<T*>(c.ptr[2]);
  T* __restrict v = static_cast<T*>(c.ptr[3]);
  T* __restrict vmax = static_cast<T*>(c.ptr[4]);
  const T decay = static_cast<T>(c.scalar[0]);
  const T b1 = static_cast<T>(c.scalar[1]);
  const T omb1 = static_cast<T>(c.scalar[2]);
  const T b2 = static_cast<T>(c.scalar[3]);
  const T omb2 = static_cast<T>(c.scalar[4]);
  const T sqrt_bc2 = static_cast<T>(c.scalar[5]);
  const T eps = static_cast<T>(c.scalar[6]);
  const T neg_step = static_cast<T>(c.scalar[7]);
  const T wd = static_cast<T>(c.scalar[8]);
  const int64_t n = c.numel;
  for (int64_t i = 0; i < n; ++i) {
    T pi = p[i];
    T gi = g[i];
    if constexpr (kDecay == AdamDecay::kDecoupled) pi = pi * decay;     // p.mul_(1 - lr*wd)
    if constexpr (kDecay == AdamDecay::kL2) gi = std::fma(pi, wd, gi);  // grad.add(p, wd)
    const T mi = std::fma(gi, omb1, m[i] * b1);       // exp_avg.mul_(b1).add_(g, 1-b1)
    const T vi = std::fma(omb2 * gi, gi, v[i] * b2);  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2)
    m[i] = mi;
    v[i] = vi;
    T d = vi;
    if constexpr (kAmsgrad) {
      const T old = vmax[i];
      T mx = vi > old ? vi : old;
      mx = vi != vi ? vi : mx;  // max_out propagates NaN from either side
      vmax[i] = mx;
      d = mx;
    }
    const T denom = std::sqrt(d) / sqrt_bc2 + eps;
    p[i] = (neg_step * mi) / denom + pi;  // addcdiv_(exp_avg, denom, -lr/bc1)
  }
}

using BF16 = c10::BFloat16;
// bf16 <-> float on the bits, written so that the loops vectorise: round to nearest even, as
// c10::BFloat16 and libtorch's vector conversion do. No NaN special case: every float here
// comes from bf16 values, from a double scalar, or from arithmetic on those, so a NaN's low 16
// bits are zero (bf16 and double payloads shift in from the top; x86's default NaN is
// 0xFFC00000) and adding the rounding bias cannot carry into its exponent. (c10 writes NaN as
// 0x7FC0; here a NaN keeps its sign and payload: still NaN, as every comparison sees.)
VOLT_ALWAYS_INLINE uint32_t bf_rounded(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
}
VOLT_ALWAYS_INLINE uint16_t bf_bits(float x) {
  return static_cast<uint16_t>(bf_rounded(x) >> 16);
}
VOLT_ALWAYS_INLINE float bf_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
// One libtorch op's result (or a scalar operand) rounded to bf16, kept as float.
VOLT_ALWAYS_INLINE float bf(float x) {
  const uint32_t u = bf_rounded(x);
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}
VOLT_ALWAYS_INLINE float bf(double x) {
  return bf(static_cast<float>(x));
}
constexpr bool kDivScalarInFloat = VOLT_TORCH_VER >= 200;
// The scalar of div_(s) as libtorch uses it (mul_(s)'s is bf(s) in every version).
VOLT_ALWAYS_INLINE float div_scalar(double x) {
  return kDivScalarInFloat ? static_cast<float>(x) : bf(x);
}

template <bool kAmsgrad, AdamDecay kDecay>
VOLT_ALWAYS_INLINE void adam_body_bf16(const TensorChunk& c) {
  uint16_t* __restrict p = static_cast<uint16_t*>(c.ptr[0]);
  const uint16_t* __restrict g = static_cast<const uint16_t*>(c.ptr[1]);
  uint16_t* __restrict m = static_cast<uint16_t*>(c.ptr[2]);
  uint16_t* __restrict v = static_cast<uint16_t*>(c.ptr[3]);
  uint16_t* __restrict vmax = static_cast<uint16_t*>(c.ptr[4]);
  const float decay = bf(c.scalar[0]);  // mul_ scalars: bf16
  const float b1 = bf(c.scalar[1]);
  const float omb1 = bf(c.scalar[2]);
  const float b2 = bf(c.scalar[3]);
  const float omb2 = static_cast<float>(c.scalar[4]);  // addcmul_'s value: float
  const float sqrt_bc2 = div_scalar(c.scalar[5]);      // a divisor
  const float eps = bf(c.scalar[6]);
  const float neg_step = static_cast<float>(c.scalar[7]);  // addcdiv_'s value: float
  const float wd = bf(c.scalar[8]);
  const int64_t n = c.numel;
  for (int64_t i = 0; i < n; ++i) {
    float pi = bf_float(p[i]);
    float gi = bf_float(g[i]);
    if constexpr (kDecay == AdamDecay::kDecoupled) pi = bf(pi * decay);     // p.mul_(1 - lr*wd)
    if constexpr (kDecay == AdamDecay::kL2) gi = bf(std::fma(pi, wd, gi));  // grad.add(p, wd)
    const float mi = bf(std::fma(gi, omb1, bf(bf_float(m[i]) * b1)));
    const float vi = bf(std::fma(omb2 * gi, gi, bf(bf_float(v[i]) * b2)));
    m[i] = bf_bits(mi);
    v[i] = bf_bits(vi);
    float d = vi;
    if constexpr (kAmsgrad) {
      const float old = bf_float(vmax[i]);
      float mx = vi > old ? vi : old;
      mx = vi != vi ? vi : mx;  // max_out propagates NaN from either side
      vmax[i] = bf_bits(mx);
      d = mx;
    }
    const float denom = bf(bf(bf(std::sqrt(d)) / sqrt_bc2) + eps);
    p[i] = bf_bits((neg_step * mi) / denom + pi);  // addcdiv_(exp_avg, denom, -lr/bc1)
  }
}

template <bool kWeightDecay, SgdMomentum kMomentum, bool kNesterov>
VOLT_ALWAYS_INLINE void sgd_body_bf16(const TensorChunk& c) {
  uint16_t* __restrict p = static_cast<uint16_t*>(c.ptr[0]);
  const uint16_t* __restrict g = static_cast<const uint16_t*>(c.ptr[1]);
  uint16_t* __restrict buf = static_cast<uint16_t*>(c.ptr[2]);
  const float wd = bf(c.scalar[0]);
  const float momentum = bf(c.scalar[1]);  // buf.mul_(momentum), d_p.add(buf, momentum)
  const float one_minus_dampening = bf(c.scalar[2]);
  const float neg_lr = bf(c.scalar[3]);
  const int64_t n = c.numel;
  for (int64_t i = 0; i < n; ++i) {
    const float pi = bf_float(p[i]);
    float d = bf_float(g[i]);
    if constexpr (kWeightDecay) d = bf(std::fma(pi, wd, d));  // d_p.add(p, wd)
    if constexpr (kMomentum != SgdMomentum::kNone) {
      float b;
      if constexpr (kMomentum == SgdMomentum::kFirst) {
        b = d;  // buf = d_p.clone()
      } else {
        // buf.mul_(m).add_(d_p, 1-damp)
        b = bf(std::fma(d, one_minus_dampening, bf(bf_float(buf[i]) * momentum)));
      }
      buf[i] = bf_bits(b);
      d = kNesterov ? bf(std::fma(b, momentum, d)) : b;  // d_p.add(buf, momentum) or buf
    }
    p[i] = bf_bits(std::fma(d, neg_lr, pi));  // p.add_(d_p, -lr)
  }
}

template <typename T, bool kWeightDecay, SgdMomentum kMomentum, bool kNesterov>
VOLT_ALWAYS_INLINE void sgd_body(const TensorChunk& c) {
  T* __restrict p = static_cast<T*>(c.ptr[0]);
  const T* __restrict g = static_cast<const T*>(c.ptr[1]);
  T* __restrict buf = static_cast<T*>(c.ptr[2]);
  const T wd = static_cast<T>(c.scalar[0]);
  const T momentum = static_cast<T>(c.scalar[1]);
  const T one_minus_dampening = static_cast<T>(c.scalar[2]);
  const T neg_lr = static_cast<T>(c.scalar[3]);
  const int64_t n = c.numel;
  for (int64_t i = 0; i < n; ++i) {
    const T pi = p[i];
    T d = g[i];
    if constexpr (kWeightDecay) d = std::fma(pi, wd, d);  // d_p.add(p, wd)
    if constexpr (kMomentum != SgdMomentum::kNone) {
      T b;
      if constexpr (kMomentum == SgdMomentum::kFirst) {
        b = d;  // buf = d_p.clone()
      } else {
        b = std::fma(d, one_minus_dampening, buf[i] * momentum);  // buf.mul_(m).add_(d_p, 1-damp)
      }
      buf[i] = b;
      d = kNesterov ? std::fma(b, momentum, d) : b;  // d_p.add(buf, momentum) or buf
    }
    p[i] = std::fma(d, neg_lr, pi);  // p.add_(d_p, -lr)
  }
}

// Reductions keep kLanes independent accumulators so the compiler can vectorise them without
// reassociating; lanes are combined in a fixed order, so the result does not depend on threads.
constexpr int kLanes = 16;

enum class NormMode { kOne, kTwo, kP, kInf };

template <typename T, NormMode kMode>
VOLT_ALWAYS_INLINE void norm_body(const TensorChunk& c) {
  const T* __restrict g = static_cast<const T*>(c.ptr[0]);
  double* out = static_cast<double*>(c.ptr[1]);
  const int64_t n = c.numel;
  if constexpr (kMode == NormMode::kInf) {
    // max|g| on the bit patterns: with the sign cleared, IEEE magnitudes (bfloat16's too) order
    // like unsigned integers and every NaN pattern sorts above inf, so an integer max (which
    // vectorises and is associative) is exactly a NaN-propagating max.
    using U = std::conditional_t<sizeof(T) == 2, uint16_t,
                                 std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
    constexpr U kAbsMask = static_cast<U>(static_cast<U>(~U(0)) >> 1);  // no int promotion
    U m = 0;
    for (int64_t i = 0; i < n; ++i) {
      U bits;
      std::memcpy(&bits, g + i, sizeof(U));
      bits &= kAbsMask;
      m = bits > m ? bits : m;
    }
    T result;
    std::memcpy(&result, &m, sizeof(U));
    *out = static_cast<double>(result);
  } else {
    const double p = c.scalar[0];
    auto term = [p](double x) {
      if constexpr (kMode == NormMode::kOne) return std::abs(x);
      if constexpr (kMode == NormMode::kTwo) return x * x;
      if constexpr (kMode == NormMode::kP) return std::pow(std::abs(x), p);
    };
    double acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) acc[j] += term(static_cast<double>(g[i + j]));
    }
    for (; i < n; ++i) acc[0] += term(static_cast<double>(g[i]));
    double s = 0;
    for (int j = 0; j < kLanes; ++j) s += acc[j];
    *out = s;
  }
}

template <typename T>
VOLT_ALWAYS_INLINE void scale_body(const TensorChunk& c) {
  T* __restrict g = static_cast<T*>(c.ptr[0]);
  const T coef = static_cast<T>(c.scalar[0]);
  const int64_t n = c.numel;
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] * coef;
}

VOLT_ALWAYS_INLINE void scale_body_bf16(const TensorChunk& c) {
  uint16_t* __restrict g = static_cast<uint16_t*>(c.ptr[0]);
  const float coef = bf(c.scalar[0]);  // grad.mul_(coef)
  const int64_t n = c.numel;
  for (int64_t i = 0; i < n; ++i) g[i] = bf_bits(bf_float(g[i]) * coef);
}

// Each kernel body is compiled twice, inlined into a wrapper: for AVX2+FMA (what the reference
// CPU has; also what libtorch's own kernels use there) and portable. std::fma is a libm call in
// the portable build: correct, just slower, on CPUs without FMA.
using Body = void (*)(const TensorChunk&);

template <Body kBody>
VOLT_AVX2_TARGET void run_avx2(const TensorChunk& c) {
  kBody(c);
}

template <Body kBody>
void run_portable(const TensorChunk& c) {
  kBody(c);
}

template <Body kBody>
TensorChunk::Kernel pick() {
  return kernels_use_avx2() ? &run_avx2<kBody> : &run_portable<kBody>;
}

template <typename T>
TensorChunk::Kernel adam_for(bool amsgrad, AdamDecay decay) {
  switch (decay) {
    case AdamDecay::kNone:
      return amsgrad ? pick<&adam_body<T, true, AdamDecay::kNone>>()
                     : pick<&adam_body<T, false, AdamDecay::kNone>>();
    case AdamDecay::kDecoupled:
      return amsgrad ? pick<&adam_body<T, true, AdamDecay::kDecoupled>>()
                     : pick<&adam_body<T, false, AdamDecay::kDecoupled>>();
    case AdamDecay::kL2:
      return amsgrad ? pick<&adam_body<T, true, AdamDecay::kL2>>()
                     : pick<&adam_body<T, false, AdamDecay::kL2>>();
  }
  return nullptr;
}

template <typename T, bool W>
TensorChunk::Kernel sgd_for(SgdMomentum momentum, bool nesterov) {
  switch (momentum) {
    case SgdMomentum::kNone: return pick<&sgd_body<T, W, SgdMomentum::kNone, false>>();
    case SgdMomentum::kFirst:
      return nesterov ? pick<&sgd_body<T, W, SgdMomentum::kFirst, true>>()
                      : pick<&sgd_body<T, W, SgdMomentum::kFirst, false>>();
    case SgdMomentum::kSteady:
      return nesterov ? pick<&sgd_body<T, W, SgdMomentum::kSteady, true>>()
                      : pick<&sgd_body<T, W, SgdMomentum::kSteady, false>>();
  }
  return nullptr;
}

TensorChunk::Kernel adam_for_bf16(bool amsgrad, AdamDecay decay) {
  switch (decay) {
    case AdamDecay::kNone:
      return amsgrad ? pick<&adam_body_bf16<true, AdamDecay::kNone>>()
                     : pick<&adam_body_bf16<false, AdamDecay::kNone>>();
    case AdamDecay::kDecoupled:
      return amsgrad ? pick<&adam_body_bf16<true, AdamDecay::kDecoupled>>()
                     : pick<&adam_body_bf16<false, AdamDecay::kDecoupled>>();
    case AdamDecay::kL2:
      return amsgrad ? pick<&adam_body_bf16<true, AdamDecay::kL2>>()
                     : pick<&adam_body_bf16<false, AdamDecay::kL2>>();
  }
  return nullptr;
}

template <bool W>
TensorChunk::Kernel sgd_for_bf16(SgdMomentum momentum, bool nesterov) {
  switch (momentum) {
    case SgdMomentum::kNone: return pick<&sgd_body_bf16<W, SgdMomentum::kNone, false>>();
    case SgdMomentum::kFirst:
      return nesterov ? pick<&sgd_body_bf16<W, SgdMomentum::kFirst, true>>()
                      : pick<&sgd_body_bf16<W, SgdMomentum::kFirst, false>>();
    case SgdMomentum::kSteady:
      return nesterov ? pick<&sgd_body_bf16<W, SgdMomentum::kSteady, true>>()
                      : pick<&sgd_body_bf16<W, SgdMomentum::kSteady, false>>();
  }
  return nullptr;
}

template <typename T>
TensorChunk::Kernel norm_for(double norm_type) {
  if (std::isinf(norm_type)) return pick<&norm_body<T, NormMode::kInf>>();
  if (norm_type == 1.0) return pick<&norm_body<T, NormMode::kOne>>();
  if (norm_type == 2.0) return pick<&norm_body<T, NormMode::kTwo>>();
  return pick<&norm_body<T, NormMode::kP>>();
}

}  // namespace

bool kernels_use_avx2() {
#if VOLT_HAS_AVX2_BUILD
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

TensorChunk::Kernel adam_kernel(c10::ScalarType dtype, bool amsgrad, AdamDecay decay) {
  if (dtype == c10::ScalarType::Float) return adam_for<float>(amsgrad, decay);
  if (dtype == c10::ScalarType::BFloat16) return adam_for_bf16(amsgrad, decay);
  VOLT_ASSERT(dtype == c10::ScalarType::Double, "adam_kernel: dtype ", dtype);
  return adam_for<double>(amsgrad, decay);
}

TensorChunk::Kernel sgd_kernel(c10::ScalarType dtype, bool weight_decay, SgdMomentum momentum,
                               bool nesterov) {
  if (dtype == c10::ScalarType::Float) {
    return weight_decay ? sgd_for<float, true>(momentum, nesterov)
                        : sgd_for<float, false>(momentum, nesterov);
  }
  if (dtype == c10::ScalarType::BFloat16) {
    return weight_decay ? sgd_for_bf16<true>(momentum, nesterov)
                        : sgd_for_bf16<false>(momentum, nesterov);
  }
  VOLT_ASSERT(dtype == c10::ScalarType::Double, "sgd_kernel: dtype ", dtype);
  return weight_decay ? sgd_for<double, true>(momentum, nesterov)
                      : sgd_for<double, false>(momentum, nesterov);
}

TensorChunk::Kernel norm_kernel(c10::ScalarType dtype, double norm_type) {
  if (dtype == c10::ScalarType::Float) return norm_for<float>(norm_type);
  if (dtype == c10::ScalarType::BFloat16) return norm_for<BF16>(norm_type);
  VOLT_ASSERT(dtype == c10::ScalarType::Double, "norm_kernel: dtype ", dtype);
  return norm_for<double>(norm_type);
}

TensorChunk::Kernel scale_kernel(c10::ScalarType dtype) {
  if (dtype == c10::ScalarType::Float) return pick<&scale_body<float>>();
  if (dtype == c10::ScalarType::BFloat16) return pick<&scale_body_bf16>();
  VOLT_ASSERT(dtype == c10::ScalarType::Double, "scale_kernel: dtype ", dtype);
  return pick<&scale_body<double>>();
}

void append_chunks(std::vector<TensorChunk>& out, const TensorChunk& proto, int64_t numel,
                   int num_ptrs, int64_t elem_size) {
  for (int64_t begin = 0; begin < numel; begin += kChunkNumel) {
    TensorChunk c = proto;
    c.numel = std::min(kChunkNumel, numel - begin);
    for (int k = 0; k < num_ptrs; ++k) {
      if (c.ptr[k]) c.ptr[k] = static_cast<char*>(c.ptr[k]) + begin * elem_size;
    }
    out.push_back(c);
  }
}

void run_chunks(const std::vector<TensorChunk>& chunks) {
  const int64_t count = static_cast<int64_t>(chunks.size());
  if (count == 0) return;
  int64_t total = 0;
  for (const auto& c : chunks) total += c.numel;
  const int64_t parts = std::min<int64_t>(
      {static_cast<int64_t>(at::get_num_threads()), count, total / kMinNumelPerThread + 1});
  if (parts <= 1 || at::in_parallel_region()) {
    for (const auto& c : chunks) c.kernel(c);
    return;
  }
  // Contiguous runs of chunks with about total/parts elements each, one run per thread.
  std::vector<int64_t> first(parts + 1, count);
  first[0] = 0;
  int64_t seen = 0, part = 1;
  for (int64_t i = 0; i < count && part < parts; ++i) {
    seen += chunks[i].numel;
    while (part < parts && seen * parts >= total * part) first[part++] = i + 1;
  }
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t i = first[r]; i < first[r + 1]; ++i) chunks[i].kernel(chunks[i]);
    }
  });
}

}  // namespace detail
}  // namespace volt
