// The fused bias + activation loop with AVX2 + FMA (this TU is compiled with -mavx2 -mfma; the
// caller runs it only where the CPU has both).
#define VOLT_BIAS_ACT_NAME bias_act_avx2
#include "bias_act_cpu.inc"
