#include "detail/sdpa_cuda.h"

#include "volt/core/check.h"
#include "volt/core/version.h"

// VOLT_NO_CUDA_SDPA (CMake -DVOLT_CUDA_SDPA=OFF) builds the stub even with CUDA.
#if defined(VOLT_CUDA) && VOLT_TORCH_AT_LEAST(2, 1) && !defined(VOLT_NO_CUDA_SDPA)
#define VOLT_SDPA_CUDA 1
#include <ATen/ATen.h>
#else
#define VOLT_SDPA_CUDA 0
#endif

namespace volt {
namespace detail {

bool sdpa_cuda_available() {
  return VOLT_SDPA_CUDA != 0;
}

#if VOLT_SDPA_CUDA

at::Tensor sdpa_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                     double dropout_p, double scale) {
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/c10::nullopt, dropout_p, causal,
                                          scale);
}

#else

at::Tensor sdpa_cuda(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, double,
                     double) {
  VOLT_ASSERT(false, "the CUDA FusedSDPA path was reached in a build without it");
  return {};
}

#endif

}  // namespace detail
}  // namespace volt
