#pragma once
// The fused bias + activation loop, compiled once per instruction set (ATen's Vectorized<float>
// picks its width from CPU_CAPABILITY at compile time, as ATen's own kernels do); the caller
// picks the variant the CPU runs.

#include <cstdint>

namespace volt::detail {

// Activation codes (volt::Activation's order).
enum BiasAct : int { kActIdentity = 0, kActRelu, kActGelu, kActGeluTanh, kActSilu };

// y[r, c] = act(y[r, c] + bias[c]) for a [rows, cols] row-major block; bias may be null.
// Splits rows across torch's intra-op threads.
void bias_act_default(float* y, const float* bias, int64_t rows, int64_t cols, int act);
// The x86-64 builds (the library has both when VOLT_BIAS_ACT_AVX2 is defined).
#if defined(VOLT_BIAS_ACT_AVX2)
void bias_act_avx2(float* y, const float* bias, int64_t rows, int64_t cols, int act);
void bias_act_avx512(float* y, const float* bias, int64_t rows, int64_t cols, int act);
#endif

}  // namespace volt::detail
