#pragma once
// Multi-tensor apply: the fused optimizers and FusedClipNorm describe one step as a list of
// chunks (pointers + element count + scalars) over many tensors, and run the whole list in one
// at::parallel_for. The element-wise kernels live in multi_tensor.cpp, the only TU compiled with
// the flags they need (-fno-math-errno so sqrt vectorises, -ffp-contract=off so rounding follows
// the explicit std::fma calls that mirror libtorch's kernels) and without the torch PCH.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace volt {
namespace detail {

/// Largest number of elements one chunk covers: big tensors are split so threads share them.
constexpr int64_t kChunkNumel = 1 << 16;

/// One contiguous piece of work. Pointers and scalars mean what the chunk's kernel says.
struct TensorChunk {
  using Kernel = void (*)(const TensorChunk&);
  Kernel kernel = nullptr;
  /// Up to five data pointers, already offset to this chunk's first element.
  void* ptr[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  int64_t numel = 0;
  /// Per-tensor scalars in double; kernels round them to the tensor dtype, as libtorch does.
  double scalar[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
};

/// Appends chunks of at most kChunkNumel elements covering `numel` elements from the pointers
/// of `proto` (the first `num_ptrs` pointers advance by `elem_size` bytes per element).
void append_chunks(std::vector<TensorChunk>& out, const TensorChunk& proto, int64_t numel,
                   int num_ptrs, int64_t elem_size);

/// Runs every chunk's kernel exactly once: one at::parallel_for over contiguous runs of chunks
/// balanced by element count. Chunks must not overlap in what they write.
void run_chunks(const std::vector<TensorChunk>& chunks);

// ---- kernel selection (dtype kFloat, kDouble or kBFloat16; anything else is an
// InternalError). bf16 kernels compute in float and round each op's result, as libtorch does.

/// How an Adam step treats weight decay.
enum class AdamDecay { kNone, kDecoupled, kL2 };

/// AdamW/Adam step. ptr: p, g, exp_avg, exp_avg_sq, max_exp_avg_sq (amsgrad only).
/// scalar: 1-lr*wd, beta1, 1-beta1, beta2, 1-beta2, sqrt(bc2), eps, -lr/bc1, wd.
TensorChunk::Kernel adam_kernel(c10::ScalarType dtype, bool amsgrad, AdamDecay decay);

/// How an SGD step treats its momentum buffer.
enum class SgdMomentum { kNone, kFirst, kSteady };

/// SGD step. ptr: p, g, momentum_buffer. scalar: wd, momentum, 1-dampening, -lr.
TensorChunk::Kernel sgd_kernel(c10::ScalarType dtype, bool weight_decay, SgdMomentum momentum,
                               bool nesterov);

/// Partial norm of one chunk of gradients. ptr: g, double* out. scalar: norm_type.
/// Writes sum(|g|^p) for finite p, max(|g|) (NaN-propagating) for p = inf.
TensorChunk::Kernel norm_kernel(c10::ScalarType dtype, double norm_type);

/// g *= coef. ptr: g. scalar: coef (rounded to the dtype, as a 0-dim tensor operand is).
TensorChunk::Kernel scale_kernel(c10::ScalarType dtype);

/// Whether this CPU runs the AVX2+FMA builds of the kernels (otherwise the portable ones).
bool kernels_use_avx2();

}  // namespace detail
}  // namespace volt
