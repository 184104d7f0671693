// FusedAdamW, FusedSGD and FusedClipNorm on CUDA tensors (libtorch's fused multi-tensor
// kernels) against torch::optim's AdamW and SGD and clip_grad_norm_ in C++ (one set of kernels
// per parameter), on 150 tensors of 64x64 and on GPT-2 124M's parameter shapes. Rounds
// alternate between the contenders; each round times `steps` steps between two device
// synchronizations; the table shows the median milliseconds per step. Prints markdown.
// fused_optim_cuda.py times torch.optim in Python (for-loop, foreach, fused) on the same shapes.
//
//   build/benchmarks/volt_bench_fused_optim_cuda [rounds] [steps]

#include <torch/cuda.h>
#include <torch/torch.h>
#include <volt/volt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "timing.h"

namespace {

using volt_bench::median;

using Clock = std::chrono::steady_clock;

struct Workload {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
};

Workload small_set() {
  Workload w{"150 x 64x64", {}};
  for (int i = 0; i < 150; ++i) w.shapes.push_back({64, 64});
  return w;
}

// GPT-2 small (124M): token and position embeddings, 12 blocks, final layer norm.
Workload gpt2() {
  Workload w{"GPT-2 124M (148 tensors)", {{50257, 768}, {1024, 768}}};
  for (int l = 0; l < 12; ++l) {
    for (auto s : std::vector<std::vector<int64_t>>{{768},
                                                    {768},
                                                    {768, 2304},
                                                    {2304},
                                                    {768, 768},
                                                    {768},
                                                    {768},
                                                    {768},
                                                    {768, 3072},
                                                    {3072},
                                                    {3072, 768},
                                                    {768}}) {
      w.shapes.push_back(s);
    }
  }
  w.shapes.push_back({768});
  w.shapes.push_back({768});
  return w;
}

std::vector<torch::Tensor> make(const Workload& w) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> ps;
  for (const auto& s : w.shapes) {
    auto p = torch::randn(s, torch::kCUDA).requires_grad_();
    p.mutable_grad() = torch::randn(s, torch::kCUDA) * 1e-3;
    ps.push_back(p);
  }
  return ps;
}

double ms_per_step(const std::function<void()>& step, int steps) {
  torch::cuda::synchronize();
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps;
}

}  // namespace

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 50;
  std::printf("| workload | op | torch::optim (C++) ms | volt fused ms | speed-up |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const Workload& w : {small_set(), gpt2()}) {
    struct Pair {
      std::string op;
      std::function<void()> ref, fused;
    };
    auto a = make(w), b = make(w), c = make(w), d = make(w), e = make(w), f = make(w);
    torch::optim::AdamW adam_ref(a, torch::optim::AdamWOptions(1e-4).weight_decay(0.01));
    volt::FusedAdamW adam_fused(b, volt::FusedAdamWOptions(1e-4).weight_decay(0.01));
    torch::optim::SGD sgd_ref(c, torch::optim::SGDOptions(1e-4).momentum(0.9));
    volt::FusedSGD sgd_fused(d, volt::FusedSGDOptions(1e-4).momentum(0.9));
    const std::vector<Pair> pairs = {
        {"AdamW step", [&] { adam_ref.step(); }, [&] { adam_fused.step(); }},
        {"SGD(momentum) step", [&] { sgd_ref.step(); }, [&] { sgd_fused.step(); }},
        {"clip_grad_norm_ (L2)", [&] { torch::nn::utils::clip_grad_norm_(e, 1.0); },
         [&] { volt::fused_clip_grad_norm_(f, 1.0); }},
    };
    for (const auto& p : pairs) {
      for (int i = 0; i < 5; ++i) {  // warm-up: state allocation, caching allocator
        p.ref();
        p.fused();
      }
      std::vector<double> tr, tf;
      for (int r = 0; r < rounds; ++r) {
        tr.push_back(ms_per_step(p.ref, steps));
        tf.push_back(ms_per_step(p.fused, steps));
      }
      const double mr = median(tr), mf = median(tf);
      std::printf("| %s | %s | %.3f | %.3f | %.2fx |\n", w.name.c_str(), p.op.c_str(), mr, mf,
                  mr / mf);
    }
  }
  std::printf("\nMedian of %d rounds of %d steps each (device synchronized around each round).\n",
              rounds, steps);
  return 0;
}
