// The fused bias + activation loop with AVX-512F (this TU is compiled with -mavx512f and 512-bit
// vectors; the caller runs it only where the CPU and OS support it).
#define VOLT_BIAS_ACT_NAME bias_act_avx512
#include "bias_act_cpu.inc"
