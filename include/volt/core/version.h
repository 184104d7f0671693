#pragma once
/// libtorch version gates: volt targets libtorch 1.13 (Debian, CPU) and 2.x (CUDA wheels).

#include <torch/version.h>

/// 113 for libtorch 1.13, 211 for 2.11 (never test the patch level: Debian's 1.13.1 says 1.13.0).
#define VOLT_TORCH_VER (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR)
/// True when the libtorch being compiled against is at least M.m.
#define VOLT_TORCH_AT_LEAST(M, m) (VOLT_TORCH_VER >= (M)*100 + (m))
