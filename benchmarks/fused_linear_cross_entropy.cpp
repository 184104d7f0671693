// A language model's output layer and loss, forward + backward, on the CPU: volt's
// fused_linear_cross_entropy (chunks of rows, no [rows, vocabulary] logits) against the
// composition it replaces, at::cross_entropy_loss(at::linear(x, W).to(float)), on GPT-2's head
// (768 features, 50,257 classes, no bias). Median ms of R repetitions after a warm-up, and the
// peak of CPU tensor memory above what existed before the call (volt's counting allocator,
// exact bytes), in float32 and under bf16 autocast; and the fused op with its classes padded to
// a multiple of 64 (pad_classes_to(64), automatic on CUDA only), to show what padding does on
// this CPU.
//
//   build/benchmarks/volt_bench_fused_linear_ce [--rows N] [--dim D] [--vocab V] [--reps R]
//                                               [--chunk C]

#include <torch/torch.h>
#include <volt/volt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "host_memory.h"
#include "timing.h"

namespace {

struct Measured {
  double ms;
  double peak_mib;
  float loss;
};

// fwd+bwd of `loss_of`, fresh leaves each time (their gradients count in the peak).
Measured measure(const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& loss_of,
                 const at::Tensor& x0, const at::Tensor& w0, int reps, bool bf16) {
  std::vector<double> ms;
  double peak = 0;
  float loss = 0;
  for (int r = -1; r < reps; ++r) {
    auto x = x0.clone().requires_grad_();
    auto w = w0.clone().requires_grad_();
    volt::reset_cpu_memory_peaks();
    const int64_t before = volt::cpu_memory_stats().in_use;
    const double t = volt_bench::time_ms([&] {
      at::Tensor l;
      {
        volt::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
        l = loss_of(x, w);
      }
      l.backward();
      loss = l.item<float>();
    });
    if (r < 0) continue;  // warm-up
    ms.push_back(t);
    peak = static_cast<double>(volt::cpu_memory_stats().max_in_use - before) / (1 << 20);
  }
  return {volt_bench::median(ms), peak, loss};
}

}  // namespace

int main(int argc, char** argv) {
  volt_bench::same_host_malloc_for_every_contender();
  volt::install_counting_cpu_allocator();
  int64_t rows = 512, dim = 768, vocab = 50257, chunk = 0;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rows") rows = std::atoll(argv[i + 1]);
    if (a == "--dim") dim = std::atoll(argv[i + 1]);
    if (a == "--vocab") vocab = std::atoll(argv[i + 1]);
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
    if (a == "--chunk") chunk = std::atoll(argv[i + 1]);
  }
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({rows, dim});
  const at::Tensor w = torch::randn({vocab, dim}) * 0.02;
  const at::Tensor t = torch::randint(vocab, {rows}, torch::kLong);
  const auto o = volt::LinearCrossEntropyOptions().chunk_rows(chunk);
  std::printf(
      "output layer + cross-entropy, fwd+bwd, CPU (%d threads): %lld rows x %lld features, "
      "%lld classes; float32 logits would be %.1f MiB; %s chunks\n",
      at::get_num_threads(), static_cast<long long>(rows), static_cast<long long>(dim),
      static_cast<long long>(vocab), 4.0 * rows * vocab / (1 << 20),
      chunk > 0 ? std::to_string(chunk).c_str() : "auto");
  std::printf("%-10s %-34s %10s %14s %10s\n", "precision", "contender", "ms", "peak MiB", "loss");
  for (const bool bf16 : {false, true}) {
    const Measured ref = measure(
        [&](const at::Tensor& a, const at::Tensor& b) {
          return volt::linear_cross_entropy_reference(a, b, {}, t, o);
        },
        x, w, reps, bf16);
    const Measured fused = measure(
        [&](const at::Tensor& a, const at::Tensor& b) {
          return volt::fused_linear_cross_entropy(a, b, {}, t, o);
        },
        x, w, reps, bf16);
    const auto padded_options = volt::LinearCrossEntropyOptions(o).pad_classes_to(64);
    const Measured padded = measure(
        [&](const at::Tensor& a, const at::Tensor& b) {
          return volt::fused_linear_cross_entropy(a, b, {}, t, padded_options);
        },
        x, w, reps, bf16);
    const char* p = bf16 ? "bf16-mixed" : "float32";
    std::printf("%-10s %-34s %10.1f %14.1f %10.4f\n", p, "composition (linear + CE)", ref.ms,
                ref.peak_mib, ref.loss);
    std::printf("%-10s %-34s %10.1f %14.1f %10.4f   time %.2fx, memory %.2fx less\n", p,
                "volt::fused_linear_cross_entropy", fused.ms, fused.peak_mib, fused.loss,
                ref.ms / fused.ms, ref.peak_mib / fused.peak_mib);
    std::printf("%-10s %-34s %10.1f %14.1f %10.4f   time %.2fx, memory %.2fx less\n", p,
                "  the same, classes padded to 64", padded.ms, padded.peak_mib, padded.loss,
                ref.ms / padded.ms, ref.peak_mib / padded.peak_mib);
  }
  return 0;
}
