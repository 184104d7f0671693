#include "detail/sdpa_cuda.h"

#include "volt/core/check.h"
#include "volt/core/version.h"

#include <string>

// VOLT_NO_CUDA_SDPA (CMake -DVOLT_CUDA_SDPA=OFF) builds the stub even with CUDA.
#if defined(VOLT_CUDA) && VOLT_TORCH_AT_LEAST(2, 1) && !defined(VOLT_NO_CUDA_SDPA)
#define VOLT_SDPA_CUDA 1
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/csrc/autograd/custom_function.h>

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

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x seen as 8-byte words when its layout allows (a head's row of D fp16/bf16 values is D/4 words;
// D is a multiple of 8 here): the indexing kernels below move one element per thread, so packing
// words moves the same bytes with a quarter of the threads (an H200 trace, PERFORMANCE.md, had
// the element-wise gathers and scatters at 0.1 ms per [16,32,1024,64] tensor, ~640 GB/s). A
// tensor autograd is recording stays as it is: a dtype view is not differentiable.
at::Tensor as_words(const at::Tensor& x) {
  const int64_t ratio = 8 / static_cast<int64_t>(x.element_size());
  if ((at::GradMode::is_enabled() && x.requires_grad()) || x.element_size() >= 8 ||
      x.stride(-1) != 1 || x.size(-1) % ratio != 0 || x.storage_offset() % ratio != 0) {
    return x;
  }
  for (int64_t d = 0; d + 1 < x.dim(); ++d) {
    if (x.stride(d) % ratio != 0) return x;
  }
  return x.view(at::kLong);
}

// x[b, :, l, :] for every valid token (b, l), as one [tokens, H, D] tensor: one gather kernel
// straight from x's own layout ([B,H,L,D] or a transposed [B,L,H,D] projection alike).
at::Tensor gather_tokens(const at::Tensor& x, const at::Tensor& b, const at::Tensor& l) {
  const at::Tensor w = as_words(x);
  at::Tensor out = at::empty({b.size(0), w.size(1), w.size(3)}, w.options());
  at::index_out(out, w.transpose(1, 2), c10::List<c10::optional<at::Tensor>>({b, l}));
  return w.scalar_type() == x.scalar_type() ? out : out.view(x.scalar_type());
}

// dst (a [B,L,H,D] view) at every valid token (b, l) = rows [tokens, H, D], as words when both
// layouts allow.
void scatter_tokens(const at::Tensor& dst, const at::Tensor& b, const at::Tensor& l,
                    const at::Tensor& rows) {
  const at::Tensor d = as_words(dst);
  const at::Tensor r = as_words(rows.contiguous());
  if (d.scalar_type() == r.scalar_type()) {
    at::Tensor(d).index_put_({b, l}, r);  // a copy: the braced-index overload is non-const
  } else {
    at::Tensor(dst).index_put_({b, l}, rows);
  }
}

// The valid tokens of x [B,H,L,D] packed into [tokens, H, D] (FlashAttention's variable-length
// layout). Its backward writes each packed row's gradient back to its one position with plain
// stores into zeros: the positions are distinct, so no atomic adds (index_select's backward,
// index_add, adds atomically, slow in bf16) and no sort (index's own backward accumulates).
class PackTokens : public torch::autograd::Function<PackTokens> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& b,
                            const at::Tensor& l) {
    ctx->save_for_backward({b, l});
    // The gradient takes x's layout when x is dense (no copy when it reaches a leaf or a
    // contiguous producer), else that of a [B,L,H,D] projection viewed as [B,H,L,D].
    const at::Tensor like =
        x.is_non_overlapping_and_dense()
            ? x
            : at::empty({x.size(0), x.size(2), x.size(1), x.size(3)}, x.options()).transpose(1, 2);
    ctx->saved_data["sizes"] = like.sizes().vec();
    ctx->saved_data["strides"] = like.strides().vec();
    return gather_tokens(x, b, l);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor g = at::empty_strided(ctx->saved_data["sizes"].toIntVector(),
                                     ctx->saved_data["strides"].toIntVector(), grad[0].options())
                       .zero_();
    scatter_tokens(g.transpose(1, 2), saved[0], saved[1], grad[0]);
    return {g, at::Tensor(), at::Tensor()};
  }
};

// The inverse: packed rows [tokens, H, D] back to [B,H,L,D] (a view of a [B,L,H,D] tensor)
// with zeros at the padded positions; backward gathers the packed rows' gradient.
class UnpackTokens : public torch::autograd::Function<UnpackTokens> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& packed, const at::Tensor& b,
                            const at::Tensor& l, int64_t batch, int64_t len) {
    ctx->save_for_backward({b, l});
    at::Tensor out = at::zeros({batch, len, packed.size(1), packed.size(2)}, packed.options());
    scatter_tokens(out, b, l, packed);
    return out.transpose(1, 2);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    return {gather_tokens(grad[0], saved[0], saved[1]), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor sdpa_cuda_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& lens, bool left_padding, double dropout_p,
                            double scale) {
  const int64_t batch = q.size(0), len = q.size(2);
  VOLT_ASSERT(lens.device().is_cpu() && lens.scalar_type() == at::kLong && lens.numel() == batch);
  const int64_t* n = lens.data_ptr<int64_t>();
  int64_t total = 0, longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    total += n[b];
    longest = std::max(longest, n[b]);
  }
  VOLT_ASSERT(total > 0, "sdpa_cuda_varlen needs at least one valid token");
  // Each valid token's (batch item, position), and where each item's tokens start in the
  // packed sequence; built on the host (the lengths are there), copied without a sync.
  const auto pinned = [](at::ScalarType t) {
    return at::TensorOptions().dtype(t).pinned_memory(true);
  };
  at::Tensor where_h = at::empty({2, total}, pinned(at::kLong));
  at::Tensor offsets_h = at::empty({batch + 1}, pinned(at::kInt));
  int64_t* items = where_h.data_ptr<int64_t>();
  int64_t* positions = items + total;
  int32_t* offsets = offsets_h.data_ptr<int32_t>();
  int64_t t = 0;
  offsets[0] = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t first = left_padding ? len - n[b] : 0;
    for (int64_t i = 0; i < n[b]; ++i, ++t) {
      items[t] = b;
      positions[t] = first + i;
    }
    offsets[b + 1] = static_cast<int32_t>(t);
  }
  const at::Tensor where = where_h.to(q.device(), /*non_blocking=*/true);
  const at::Tensor offsets_d = offsets_h.to(q.device(), /*non_blocking=*/true);
  const at::Tensor item = where[0], position = where[1];
  // Self-attention with equal query and key lengths: causal is the same top-left or
  // bottom-right, and valid tokens see exactly the valid tokens before them.
  const auto r = at::_flash_attention_forward(
      PackTokens::apply(q, item, position), PackTokens::apply(k, item, position),
      PackTokens::apply(v, item, position), offsets_d, offsets_d, longest, longest, dropout_p,
      /*is_causal=*/true, /*return_debug_mask=*/false, c10::optional<double>(scale));
  return UnpackTokens::apply(std::get<0>(r), item, position, batch, len);  // [B,H,L,Dv]
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
