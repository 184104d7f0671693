// FusedSDPA on a GPU: forward+backward TFLOP/s of volt::fused_sdpa (which routes CUDA tensors
// to libtorch's fused attention kernels) against at::scaled_dot_product_attention called
// directly, bf16, head_dim 64 and 128, sequence 1k-16k at 16k tokens per batch and a model
// width of 2048, causal and not; the median of R timed repetitions after a warm-up. FLOPs are
// FlashAttention's count: 4·B·H·L²·D forward, 2.5× that backward, halved when causal.
//
// --varlen: instead, causal attention over padded batches (lengths drawn uniformly from
// [1, L], so 50% padding on average) at 16k padded tokens per batch: volt::fused_sdpa with
// valid_seq_len (FlashAttention's variable-length kernel over the valid tokens) against
// at::scaled_dot_product_attention with the padding as a boolean key mask (what users write
// without a varlen kernel), against unmasked causal SDPA over every position, and against
// FlashAttention's variable-length kernel alone on inputs packed beforehand ("kernel ms": what
// is left of "varlen ms" above it is the packing into and out of that layout); TFLOP/s count
// the valid tokens' work only.
//
// --trace FILE (with --varlen): after the table, three fwd+bwd calls of the varlen path at
// L=1024, head_dim 64, under kineto with the host side recorded too (where the time between
// "kernel ms" and "varlen ms" goes); tools/kernel_table.py FILE sums its GPU time.
//
//   build/benchmarks/volt_bench_fused_sdpa_cuda [--reps R] [--max-seq L] [--varlen]
//                                               [--trace FILE]
#include <torch/cuda.h>
#include <torch/torch.h>
#include <volt/volt.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kineto_trace.h"
#include "timing.h"

namespace {

double time_ms(const std::function<void()>& step, int reps) {
  step();
  torch::cuda::synchronize();
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    ms.push_back(volt_bench::time_ms([&] {
      step();
      torch::cuda::synchronize();
    }));
  }
  return volt_bench::median(ms);
}

#if defined(VOLT_CUDA) && VOLT_TORCH_AT_LEAST(2, 1)
// Median ms of `attend` (returning the attention output) plus its backward with gradient g.
double fwd_bwd_ms(const std::function<at::Tensor()>& attend, const at::Tensor& g, int reps) {
  return time_ms([&] { attend().backward(g); }, reps);
}

void run_varlen(const torch::TensorOptions& opts, int reps, int64_t max_seq,
                const std::string& trace) {
  std::printf("varlen: causal, lengths uniform in [1, L] (50%% padding on average), bf16\n");
  std::printf("%-5s %-6s %-4s %6s %11s %11s %11s %11s %9s %9s\n", "D", "L", "B", "valid",
              "varlen ms", "kernel ms", "masked ms", "dense ms", "masked/v", "TF/s v");
  for (const int64_t d : {64, 128}) {
    for (int64_t l = 1024; l <= std::min<int64_t>(max_seq, 8192); l *= 2) {
      const int64_t heads = 2048 / d, batch = std::max<int64_t>(2, 16384 / l);
      torch::manual_seed(l + d);
      const at::Tensor lens = torch::randint(1, l + 1, {batch}, torch::kLong);
      auto q = torch::randn({batch, heads, l, d}, opts).requires_grad_();
      auto k = torch::randn({batch, heads, l, d}, opts).requires_grad_();
      auto v = torch::randn({batch, heads, l, d}, opts).requires_grad_();
      const auto g = torch::randn({batch, heads, l, d}, opts);
      double flops = 0;
      for (int64_t b = 0; b < batch; ++b) {
        const double n = static_cast<double>(lens[b].item<int64_t>());
        flops += 4.0 * static_cast<double>(heads * d) * n * n * 3.5 * 0.5;
      }
      const auto opt = volt::SdpaOptions().is_causal(true).valid_seq_len(lens).require_fused(true);
      const double tv = fwd_bwd_ms([&] { return volt::fused_sdpa(q, k, v, opt).output; }, g, reps);
      // The kernel alone: the valid rows packed once, outside the timing, with their offsets.
      const at::Tensor valid_row =
          (torch::arange(l, torch::kLong).unsqueeze(0) < lens.unsqueeze(1)).reshape({-1});
      const at::Tensor rows = valid_row.nonzero().squeeze(1).to(opts.device());
      const auto packed = [&](const at::Tensor& x) {
        return x.detach()
            .transpose(1, 2)
            .reshape({batch * l, heads, d})
            .index_select(0, rows)
            .requires_grad_();
      };
      const at::Tensor qp = packed(q), kp = packed(k), vp = packed(v);
      const at::Tensor gp = packed(g).detach();
      const at::Tensor offsets = torch::cat({torch::zeros({1}, torch::kLong), lens.cumsum(0)})
                                     .to(torch::kInt)
                                     .to(opts.device());
      const int64_t longest = lens.max().item<int64_t>();
      const double tk = fwd_bwd_ms(
          [&] {
            return std::get<0>(at::_flash_attention_forward(
                qp, kp, vp, offsets, offsets, longest, longest, 0.0, /*is_causal=*/true,
                /*return_debug_mask=*/false, c10::optional<double>(1.0 / std::sqrt(double(d)))));
          },
          gp, reps);
      // Causal and key padding in one boolean mask [B, 1, L, L] (true = attend).
      const at::Tensor pos = torch::arange(l, torch::kLong);
      const at::Tensor key_ok = (pos.unsqueeze(0) < lens.unsqueeze(1)).to(opts.device());
      const at::Tensor mask =
          torch::ones({l, l}, opts.dtype(torch::kBool)).tril().unsqueeze(0).unsqueeze(0) &
          key_ok.unsqueeze(1).unsqueeze(2);
      const double tm = fwd_bwd_ms(
          [&] { return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false); }, g, reps);
      const double td = fwd_bwd_ms(
          [&] { return at::scaled_dot_product_attention(q, k, v, c10::nullopt, 0.0, true); }, g,
          reps);
      if (!trace.empty() && d == 64 && l == 1024) {
        volt_bench::KinetoTrace t(/*host_ops=*/true);
        torch::cuda::synchronize();
        t.begin();
        for (int r = 0; r < 3; ++r) volt::fused_sdpa(q, k, v, opt).output.backward(g);
        torch::cuda::synchronize();
        t.end(trace);
      }
      std::printf("%-5lld %-6lld %-4lld %5.0f%% %11.3f %11.3f %11.3f %11.3f %9.2f %9.1f\n",
                  static_cast<long long>(d), static_cast<long long>(l),
                  static_cast<long long>(batch),
                  100.0 * lens.sum().item<double>() / static_cast<double>(batch * l), tv, tk, tm,
                  td, tm / tv, flops / tv / 1e9);
    }
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  int64_t max_seq = 16384;
  bool varlen = false;
  std::string trace;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--varlen")) varlen = true;
    if (i + 1 >= argc) continue;
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--max-seq")) max_seq = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--trace")) trace = argv[i + 1];
  }
#if defined(VOLT_CUDA) && VOLT_TORCH_AT_LEAST(2, 1)
  if (!torch::cuda::is_available()) {
    std::printf("skipped: no GPU visible\n");
    return 0;
  }
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  if (varlen) {
    run_varlen(opts, reps, max_seq, trace);
    return 0;
  }
  std::printf("%-5s %-6s %-7s %12s %12s %8s\n", "D", "L", "causal", "volt TF/s", "torch TF/s",
              "ratio");
  for (const int64_t d : {64, 128}) {
    for (int64_t l = 1024; l <= max_seq; l *= 2) {
      for (const bool causal : {false, true}) {
        const int64_t heads = 2048 / d, batch = std::max<int64_t>(1, 16384 / l);
        auto q = torch::randn({batch, heads, l, d}, opts).requires_grad_();
        auto k = torch::randn({batch, heads, l, d}, opts).requires_grad_();
        auto v = torch::randn({batch, heads, l, d}, opts).requires_grad_();
        const auto g = torch::randn({batch, heads, l, d}, opts);
        const double flops = 4.0 * batch * heads * l * l * d * 3.5 * (causal ? 0.5 : 1.0);
        const auto opt = volt::SdpaOptions().is_causal(causal).require_fused(true);
        const double tv =
            fwd_bwd_ms([&] { return volt::fused_sdpa(q, k, v, opt).output; }, g, reps);
        const double tt = fwd_bwd_ms(
            [&] { return at::scaled_dot_product_attention(q, k, v, c10::nullopt, 0.0, causal); }, g,
            reps);
        std::printf("%-5lld %-6lld %-7s %12.1f %12.1f %8.3f\n", static_cast<long long>(d),
                    static_cast<long long>(l), causal ? "yes" : "no", flops / tv / 1e9,
                    flops / tt / 1e9, tt / tv);
      }
    }
  }
#else
  (void)reps;
  (void)max_seq;
  (void)varlen;
  (void)trace;
  std::printf("skipped: this build has no CUDA attention path (libtorch >= 2.1 with CUDA)\n");
#endif
  return 0;
}
