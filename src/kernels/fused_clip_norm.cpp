#include "volt/kernels/fused_clip_norm.h"

#include <c10/util/BFloat16.h>

#include <cmath>
#include <ostream>

#include "detail/clip_coefficient.h"
#include "detail/fused_common.h"
#include "detail/fused_cuda.h"
#include "detail/multi_tensor.h"
#include "volt/core/check.h"

namespace volt {
namespace {

constexpr const char* kName = "FusedClipNorm";
constexpr const char* kReference = "torch::nn::utils::clip_grad_norm_";

// NaN-propagating max, as torch::max over the per-tensor norms.
double nan_max(double a, double b) {
  return (b > a || std::isnan(b)) ? b : a;
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const FusedClipNormOptions& o) {
  return os << "FusedClipNormOptions(max_norm=" << o.max_norm() << ", norm_type=" << o.norm_type()
            << ", error_if_nonfinite=" << std::boolalpha << o.error_if_nonfinite()
            << std::noboolalpha << ")";
}

FusedClipNorm::FusedClipNorm(FusedClipNormOptions options) : options_(options) {
  const double p = options_.norm_type();
  // libtorch 1.13's C++ clip_grad_norm_ turns norm_type=0 into the number of gradients, its
  // Python version into the number of non-zero elements; neither is a norm, so refuse it.
  VOLT_CHECK(p != 0, ConfigError,
             "[FusedClipNorm] norm_type=0 is not supported: libtorch 1.13's C++ clip_grad_norm_ "
             "counts the gradients for it while Python's counts non-zero elements; use a "
             "norm_type > 0, or infinity for the max norm.");
  VOLT_CHECK(p > 0, ConfigError, "[FusedClipNorm] norm_type=", p,
             " must be > 0 or infinity; use 2.0 for the L2 norm.");
  VOLT_CHECK(options_.max_norm() >= 0, ConfigError,
             "[FusedClipNorm] max_norm=", options_.max_norm(),
             " must be >= 0; pass the largest allowed gradient norm.");
}

namespace {

// Why the gradients cannot take the CUDA path, when any of them is a CUDA tensor: all must be
// dense floating CUDA tensors of one device, in a build with libtorch's fused kernels. *cuda
// says whether the CUDA path is the one meant; *device whether the reason is the device.
std::string cuda_reason(const std::vector<at::Tensor>& params, bool* cuda, bool* device) {
  *cuda = false;
  *device = false;
  c10::optional<c10::Device> first;
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (!first) first = g.device();
    if (g.is_cuda()) *cuda = true;
  }
  if (!*cuda) return "";
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (g.device() != *first) {
      *device = true;
      return std::string("[FusedClipNorm] gradients are on ") + first->str() + " and " +
             g.device().str() + "; clip each device's parameters separately, or use " + kReference +
             ".";
    }
    std::string why = detail::cuda_fusable_reason(kName, kReference, g, g);
    if (!why.empty()) {
      *device = !detail::fused_cuda_available();
      return why;
    }
  }
  return "";
}

// A gradient listed twice (a tied weight registered under two names, in an optimizer built
// from Module::parameters(), which lists it per name) or gradients sharing memory: torch counts
// it twice in the norm and scales it twice, in turn; the CPU pass would scale it from two
// threads at once.
std::string shared_gradient_reason(const std::vector<at::Tensor>& grads) {
  if (detail::find_overlap(grads) == detail::Overlap::kNone) return "";
  return std::string(
             "[FusedClipNorm] a gradient is listed twice or shares memory with another "
             "(a tied weight in the parameter list twice); use ") +
         kReference + ", which counts and scales it once per listing as torch does.";
}

void check_finite_norm(double total, double norm_type) {
  VOLT_CHECK(std::isfinite(total), ValueError, "[FusedClipNorm] the total norm of order ",
             norm_type, " of the gradients is non-finite (", total,
             "), so it cannot be clipped; find the inf/NaN gradients (e.g. a too high learning "
             "rate or loss scale), or set error_if_nonfinite(false) to scale them anyway.");
}

}  // namespace

std::string FusedClipNorm::unsupported_reason(const std::vector<at::Tensor>& params) {
  bool cuda = false, device = false;
  std::string why = cuda_reason(params, &cuda, &device);
  if (cuda) return why;
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    why = detail::fusable_reason(kName, kReference, "gradient", g);
    if (!why.empty()) return why;
    grads.push_back(g);
  }
  return shared_gradient_reason(grads);
}

at::Tensor FusedClipNorm::clip_cuda(const std::vector<at::Tensor>& params) const {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  // The norm and the coefficient stay on the device: no read unless the check needs one, made
  // before any scaling.
  const at::Tensor total = detail::norm_cuda(grads, options_.norm_type());
  if (options_.error_if_nonfinite()) check_finite_norm(total.item<double>(), options_.norm_type());
  detail::scale_to_max_norm_cuda(grads, total, options_.max_norm());
  return total;
}

bool FusedClipNorm::on_cuda(const std::vector<at::Tensor>& params) {
  bool cuda = false, device = false;
  const std::string why = cuda_reason(params, &cuda, &device);
  if (cuda && !why.empty()) {
    if (device) throw NotAvailable(why);
    throw ValueError(why);
  }
  return cuda;
}

double FusedClipNorm::operator()(const std::vector<at::Tensor>& params) const {
  // On CUDA, the one read of the norm to the host.
  return on_cuda(params) ? clip_cuda(params).item<double>() : clip_cpu(params);
}

at::Tensor FusedClipNorm::clip(const std::vector<at::Tensor>& params) const {
  if (on_cuda(params)) return clip_cuda(params);
  return at::scalar_tensor(clip_cpu(params), at::TensorOptions().dtype(at::kDouble));
}

double FusedClipNorm::clip_cpu(const std::vector<at::Tensor>& params) const {
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  bool all_float = true, all_bf16 = true;
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    bool device = false;
    const std::string why = detail::fusable_reason(kName, kReference, "gradient", g, &device);
    if (!why.empty()) {
      if (device) throw NotAvailable(why);
      throw ValueError(why);
    }
    all_float = all_float && g.scalar_type() == c10::kFloat;
    all_bf16 = all_bf16 && g.scalar_type() == c10::kBFloat16;
    grads.push_back(g);
  }
  if (grads.empty()) return 0.0;
  const std::string shared = shared_gradient_reason(grads);
  VOLT_CHECK(shared.empty(), ValueError, shared);

  const double norm_type = options_.norm_type();
  std::vector<detail::TensorChunk> chunks;
  for (const auto& g : grads) {
    detail::TensorChunk c;
    c.kernel = detail::norm_kernel(g.scalar_type(), norm_type);
    c.ptr[0] = g.data_ptr();
    c.scalar[0] = norm_type;
    detail::append_chunks(chunks, c, g.numel(), 1, static_cast<int64_t>(g.element_size()));
  }
  // One partial per chunk, combined in chunk order: the same total for any thread count.
  std::vector<double> partial(chunks.size(), 0.0);
  for (size_t k = 0; k < chunks.size(); ++k) chunks[k].ptr[1] = &partial[k];
  detail::run_chunks(chunks);

  double total = 0;
  if (std::isinf(norm_type)) {
    for (double v : partial) total = nan_max(total, v);
  } else {
    double sum = 0;
    for (double v : partial) sum += v;
    total = norm_type == 1.0   ? sum
            : norm_type == 2.0 ? std::sqrt(sum)
                               : std::pow(sum, 1.0 / norm_type);
  }
  // libtorch's total norm is a tensor of the gradients' (promoted) dtype, and so is everything
  // computed from it: round to float (bf16) when all gradients are float (bf16). Unlike
  // libtorch, the sum itself is in double, so finite float gradients whose squares overflow
  // float still give a finite norm where libtorch's is inf, and bf16 gradients get the norm of
  // their values rounded once (libtorch rounds each tensor's norm to bf16 before combining
  // them: a few bf16 ulps apart).
  if (all_float) total = static_cast<float>(total);
  if (all_bf16) total = static_cast<float>(c10::BFloat16(static_cast<float>(total)));

  if (options_.error_if_nonfinite()) check_finite_norm(total, norm_type);

  // clip_coef = max_norm / (total + 1e-6), clamped to at most 1 (NaN stays NaN), in the dtype.
  double coef;
  if (all_bf16) {
    // Each of libtorch's ops rounds to bf16, its scalars too: max_norm / (total + 1e-6).
    const auto bf = [](double x) {
      return static_cast<float>(c10::BFloat16(static_cast<float>(x)));
    };
    const float c = bf(bf(options_.max_norm()) / bf(total + bf(1e-6)));
    coef = c > 1.0f ? 1.0f : c;
  } else if (all_float) {
    float c = static_cast<float>(options_.max_norm()) /
              (static_cast<float>(total) + static_cast<float>(1e-6));
    coef = c > 1.0f ? 1.0f : c;
  } else {
    coef = detail::clip_coefficient(options_.max_norm(), total);
  }
  if (coef == 1.0) return total;  // g * 1 == g bit for bit: skip the second pass

  chunks.clear();
  for (const auto& g : grads) {
    detail::TensorChunk c;
    c.kernel = detail::scale_kernel(g.scalar_type());
    c.ptr[0] = g.data_ptr();
    c.scalar[0] = coef;
    detail::append_chunks(chunks, c, g.numel(), 1, static_cast<int64_t>(g.element_size()));
  }
  detail::run_chunks(chunks);
  for (const auto& g : grads) g.unsafeGetTensorImpl()->bump_version();
  return total;
}

double fused_clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                             double norm_type, bool error_if_nonfinite) {
  return FusedClipNorm(FusedClipNormOptions(max_norm).norm_type(norm_type).error_if_nonfinite(
      error_if_nonfinite))(params);
}

}  // namespace volt
