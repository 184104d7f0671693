// Kernel injection for inference (DeepSpeedStrategy replace_with_kernel_inject, KernelInjection):
// the fused bias + activation epilogue against libtorch's composition, a Linear + activation
// layer against at::linear then the activation, and whole models with and without injection
// (a Sequential MLP; libtorch TransformerEncoderLayers, whose attention then runs fused_sdpa).
// Each row alternates the two sides call by call and reports medians, so both see the same
// machine state; the ratio is reference / fused (> 1: the fused side is faster).
//
//   volt_bench_kernel_injection [--reps N (default 30)] [--reuse-heap 0|1 (default 1)]
//
// --reuse-heap 1 raises glibc's mmap and trim thresholds so freed blocks are reused: on this VM a
// first-touch page fault costs ~12 us, and a fresh 16 MB tensor per call would otherwise time
// the kernel's page faults, not the kernel (docs/PERFORMANCE.md shows both).

#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "timing.h"
#include "volt/kernels/fused_bias_activation.h"
#include "volt/nn/kernel_injection.h"

namespace {

using volt_bench::median;
using volt_bench::time_ms;

void row(const std::string& what, int reps, const std::function<void()>& reference,
         const std::function<void()>& fused) {
  for (int i = 0; i < 3; ++i) {  // warm caches and the allocator (first-touch page faults)
    reference();
    fused();
  }
  std::vector<double> a, b;
  for (int i = 0; i < reps; ++i) {
    a.push_back(time_ms(reference));
    b.push_back(time_ms(fused));
  }
  const double ra = median(a), rb = median(b);
  std::printf("| %-58s | %9.3f | %9.3f | %5.2fx |\n", what.c_str(), ra, rb, ra / rb);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 30;
  bool reuse_heap = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--reps") reps = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--reuse-heap") reuse_heap = std::stoi(argv[i + 1]) != 0;
  }
  if (reuse_heap) {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  torch::manual_seed(0);
  torch::NoGradGuard no_grad;
  std::printf("threads: %d, reps: %d (medians), heap reuse: %s\n\n", at::get_num_threads(), reps,
              reuse_heap ? "on" : "off");
  std::printf("| %-58s | %9s | %9s | %6s |\n", "case", "ref ms", "fused ms", "ratio");
  std::printf("|%s|%s|%s|%s|\n", std::string(60, '-').c_str(), std::string(11, '-').c_str(),
              std::string(11, '-').c_str(), std::string(8, '-').c_str());
  using volt::Activation;
  const std::pair<Activation, const char*> acts[] = {
      {Activation::kRelu, "relu"}, {Activation::kGelu, "gelu"}, {Activation::kSilu, "silu"}};

  // The epilogue alone on a [4096, 1024] product.
  {
    const at::Tensor y = torch::randn({4096, 1024}), b = torch::randn({1024});
    at::Tensor work = y.clone();
    for (const auto& [act, name] : acts) {
      row(
          std::string("epilogue ") + name + " [4096,1024] + bias", reps,
          [&] { volt::bias_activation_reference(y, b, act); },
          [&] {
            work.copy_(y);  // the same fresh input each call (the copy is timed on this side)
            volt::fused_bias_activation_(work, b, act);
          });
    }
  }
  // Linear + activation layers (the MLP up-projection shapes).
  for (auto [t, in, out] : {std::tuple<int64_t, int64_t, int64_t>{4096, 256, 1024},
                            std::tuple<int64_t, int64_t, int64_t>{512, 1024, 4096},
                            std::tuple<int64_t, int64_t, int64_t>{64, 1024, 4096}}) {
    const at::Tensor x = torch::randn({t, in}), w = torch::randn({out, in}) * 0.03,
                     b = torch::randn({out});
    for (const auto& [act, name] : acts) {
      if (act == Activation::kSilu) continue;
      row(
          "linear+" + std::string(name) + " " + std::to_string(t) + "x" + std::to_string(in) +
              " -> " + std::to_string(out),
          reps, [&] { volt::linear_activation_reference(x, w, b, act); },
          [&] { volt::fused_linear_activation(x, w, b, act, true); });
    }
  }
  // Whole models, the same object before and during injection.
  {
    auto mlp = torch::nn::Sequential(torch::nn::Linear(1024, 4096), torch::nn::GELU(),
                                     torch::nn::Linear(4096, 1024), torch::nn::Linear(1024, 4096),
                                     torch::nn::GELU(), torch::nn::Linear(4096, 1024));
    mlp->eval();
    const at::Tensor x = torch::randn({512, 1024});
    volt::KernelInjection injected(*mlp.ptr());
    injected.restore();
    row(
        "Sequential MLP 2x(1024->4096 GELU ->1024), 512 tokens", reps, [&] { mlp->forward(x); },
        [&] {
          volt::KernelInjection on(*mlp.ptr());
          mlp->forward(x);
        });
  }
  {
    auto layer = [] {
      return torch::nn::TransformerEncoderLayer(
          torch::nn::TransformerEncoderLayerOptions(256, 8).dim_feedforward(1024).activation(
              torch::kGELU));
    };
    auto enc = torch::nn::Sequential(layer(), layer(), layer(), layer());
    enc->eval();
    for (int64_t seq : {128, 512}) {
      const at::Tensor x = torch::randn({seq, 8, 256});
      row(
          "4 TransformerEncoderLayers d256 h8 ff1024, seq " + std::to_string(seq) + " batch 8",
          reps, [&] { enc->forward(x); },
          [&] {
            volt::KernelInjection on(*enc.ptr());
            enc->forward(x);
          });
    }
  }
  return 0;
}
