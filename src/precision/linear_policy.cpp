#include "detail/linear_policy.h"

#include <ATen/autocast_mode.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "detail/quiet_dispatcher.h"

namespace volt::detail {
namespace {

// The threshold cpu_gemm_dtype() applies: the latest live rule's, as the dispatcher runs the
// latest live registration's kernels. A rule dropped out of order (a tuner trial's precision
// torn down while the fit's is still installed) leaves the fit's threshold, not 0.
std::atomic<int64_t> g_min_macs{0};
std::mutex g_rules_mutex;
std::vector<std::pair<const void*, int64_t>> g_rules;  // live rules, oldest first

void push_rule(const void* rule, int64_t min_macs) {
  std::lock_guard<std::mutex> lock(g_rules_mutex);
  g_rules.emplace_back(rule, min_macs);
  g_min_macs = min_macs;
}
void pop_rule(const void* rule) {
  std::lock_guard<std::mutex> lock(g_rules_mutex);
  g_rules.erase(std::remove_if(g_rules.begin(), g_rules.end(),
                               [&](const auto& r) { return r.first == rule; }),
                g_rules.end());
  g_min_macs = g_rules.empty() ? 0 : g_rules.back().second;
}

at::Tensor cast(c10::ScalarType dtype, const at::Tensor& t) {
  return at::autocast::cached_cast(dtype, t, c10::kCPU);
}

// Unboxed kernels, so the per-call cost stays well under a microsecond: the rule exists for
// small GEMMs, where a slow wrapper would eat the gain.
at::Tensor rule_linear(const at::Tensor& input, const at::Tensor& weight,
                       const c10::optional<at::Tensor>& bias) {
  const auto dtype =
      cpu_gemm_dtype(linear_macs(input, weight), at::autocast::get_autocast_cpu_dtype());
  c10::optional<at::Tensor> b;
  if (bias && bias->defined()) b = cast(dtype, *bias);
  const auto x = cast(dtype, input), w = cast(dtype, weight);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  return at::linear(x, w, b);
}

at::Tensor rule_addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                      const at::Scalar& beta, const at::Scalar& alpha) {
  const auto dtype = cpu_gemm_dtype(gemm_macs(mat1, mat2), at::autocast::get_autocast_cpu_dtype());
  const auto s = cast(dtype, self), a = cast(dtype, mat1), b = cast(dtype, mat2);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  return at::addmm(s, a, b, beta, alpha);
}

at::Tensor rule_matmul(const at::Tensor& self, const at::Tensor& other) {
  const auto dtype = cpu_gemm_dtype(gemm_macs(self, other), at::autocast::get_autocast_cpu_dtype());
  const auto a = cast(dtype, self), b = cast(dtype, other);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  return at::matmul(a, b);
}

struct SizeRule {
  SizeRule(int64_t min_macs, const std::vector<std::string>& skip) {
    QuietWarningsGuard quiet;
    library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                               c10::DispatchKey::AutocastCPU, __FILE__, __LINE__);
    auto skipped = [&](const char* op) {
      return std::find(skip.begin(), skip.end(), op) != skip.end();
    };
    if (!skipped("linear")) library->impl("linear", TORCH_FN(rule_linear));
    if (!skipped("addmm")) library->impl("addmm", TORCH_FN(rule_addmm));
    if (!skipped("matmul")) library->impl("matmul", TORCH_FN(rule_matmul));
    push_rule(this, min_macs);
  }
  ~SizeRule() {
    pop_rule(this);
    QuietWarningsGuard quiet;
    library.reset();
  }
  std::unique_ptr<torch::Library> library;
};

}  // namespace

int64_t gemm_macs(const at::Tensor& x, const at::Tensor& kn) {
  if (kn.dim() != 2 || x.dim() < 1 || x.size(-1) != kn.size(0)) return -1;
  return x.numel() * kn.size(1);  // rows x K x N
}

int64_t linear_macs(const at::Tensor& x, const at::Tensor& weight) {
  if (weight.dim() != 2 || x.dim() < 1 || x.size(-1) != weight.size(1)) return -1;
  return x.numel() * weight.size(0);  // rows x K x N
}

std::shared_ptr<void> install_cpu_linear_size_rule(int64_t min_macs,
                                                   const std::vector<std::string>& skip) {
  return std::make_shared<SizeRule>(min_macs, skip);
}

c10::ScalarType cpu_gemm_dtype(int64_t macs, c10::ScalarType lower) {
  const int64_t min = g_min_macs.load(std::memory_order_relaxed);
  return min > 0 && macs >= 0 && macs < min ? c10::kFloat : lower;
}

}  // namespace volt::detail
