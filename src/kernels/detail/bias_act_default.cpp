// The fused bias + activation loop for any x86-64 (SSE2) or other CPU.
#define VOLT_BIAS_ACT_NAME bias_act_default
#include "bias_act_cpu.inc"
