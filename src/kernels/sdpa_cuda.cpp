#include "detail/sdpa_cuda.h"

#include "volt/core/check.h"
#include "volt/core/version.h"

#include <string>

// VOLT_NO_CUDA_SDPA (CMake -DVOLT_CUDA_SDPA=OFF) builds the stub even with CUDA.
#if defined(VOLT_CUDA) && VOLT_TORCH_AT_LEAST(2, 1) && !defined(VOLT_NO_CUDA_SDPA)
#define VOLT_SDPA_CUDA 1
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
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

std::string sdpa_cuda_varlen_unavailable(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v) {
  const std::string what = "valid_seq_len on CUDA (FlashAttention's variable-length kernel) ";
  if (q.scalar_type() != at::kHalf && q.scalar_type() != at::kBFloat16) {
    return what + "needs float16 or bfloat16, not " + c10::toString(q.scalar_type());
  }
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) {
    return what + "needs q, k and v of one dtype";
  }
  const int64_t d = q.size(3);
  if (k.size(3) != d || v.size(3) != d) {
    return what + "needs one head size for q, k and v; got " + std::to_string(d) + " and " +
           std::to_string(v.size(3));
  }
  if (d % 8 != 0 || d > 256) {
    return what + "needs a head size that is a multiple of 8 and at most 256; got " +
           std::to_string(d);
  }
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(q.device().index());
  if (prop->major < 8) {
    return what + "needs compute capability 8.0 or newer; " + prop->name + " has " +
           std::to_string(prop->major) + "." + std::to_string(prop->minor);
  }
  return {};
}

at::Tensor sdpa_cuda_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& lens, bool left_padding, double dropout_p,
                            double scale) {
  const int64_t batch = q.size(0), heads = q.size(1), len = q.size(2), dv = v.size(3);
  VOLT_ASSERT(lens.device().is_cpu() && lens.scalar_type() == at::kLong && lens.numel() == batch);
  const int64_t* n = lens.data_ptr<int64_t>();
  int64_t total = 0, longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    total += n[b];
    longest = std::max(longest, n[b]);
  }
  VOLT_ASSERT(total > 0, "sdpa_cuda_varlen needs at least one valid token");
  // Which rows of the [B*L] flattened sequence are valid, and where each item's tokens start in
  // the packed one; built on the host (the lengths are there) and copied without a sync.
  const auto pinned = [](at::ScalarType t) {
    return at::TensorOptions().dtype(t).pinned_memory(true);
  };
  at::Tensor rows_h = at::empty({total}, pinned(at::kLong));
  at::Tensor offsets_h = at::empty({batch + 1}, pinned(at::kInt));
  int64_t* rows = rows_h.data_ptr<int64_t>();
  int32_t* offsets = offsets_h.data_ptr<int32_t>();
  int64_t t = 0;
  offsets[0] = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t first = b * len + (left_padding ? len - n[b] : 0);
    for (int64_t i = 0; i < n[b]; ++i) rows[t++] = first + i;
    offsets[b + 1] = static_cast<int32_t>(t);
  }
  const at::Tensor rows_d = rows_h.to(q.device(), /*non_blocking=*/true);
  const at::Tensor offsets_d = offsets_h.to(q.device(), /*non_blocking=*/true);
  const auto pack = [&](const at::Tensor& x) {
    return x.transpose(1, 2).reshape({batch * len, heads, x.size(3)}).index_select(0, rows_d);
  };
  // Self-attention with equal query and key lengths: causal is the same top-left or
  // bottom-right, and valid tokens see exactly the valid tokens before them.
  const auto r = at::_flash_attention_forward(
      pack(q), pack(k), pack(v), offsets_d, offsets_d, longest, longest, dropout_p,
      /*is_causal=*/true, /*return_debug_mask=*/false, c10::optional<double>(scale));
  const at::Tensor& packed = std::get<0>(r);  // [total, H, Dv]
  return at::zeros({batch * len, heads, dv}, packed.options())
      .index_copy(0, rows_d, packed)
      .view({batch, len, heads, dv})
      .transpose(1, 2);
}

#else

at::Tensor sdpa_cuda(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, double,
                     double) {
  VOLT_ASSERT(false, "the CUDA FusedSDPA path was reached in a build without it");
  return {};
}

std::string sdpa_cuda_varlen_unavailable(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  return "this build has no CUDA attention path";
}

at::Tensor sdpa_cuda_varlen(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, bool, double, double) {
  VOLT_ASSERT(false, "the CUDA FusedSDPA varlen path was reached in a build without it");
  return {};
}

#endif

}  // namespace detail
}  // namespace volt
