// Activation checkpointing on this CPU: step time (forward + backward) and peak activation
// memory with and without volt::checkpoint, side by side, for a deep MLP (transformer-MLP
// blocks in a Sequential, wrapped by name) and the demo TransformerNet (a local forward that
// checkpoints each of its layers with volt::checkpoint, since its layers are typed members).
// Peak memory is exact: volt's counting CPU allocator, the live tensor bytes above what was
// live before the step (parameters and their gradients excluded). Every repetition runs each
// variant once, back to back; times are medians. Prints markdown.
//
//   build/benchmarks/volt_bench_activation_checkpointing [--reps N] [--threads N]

#include <torch/torch.h>
#include <volt/nn/checkpoint.h>
#include <volt/volt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "models.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace nn = torch::nn;

struct BlockImpl : nn::Module {
  explicit BlockImpl(int64_t w)
      : fc1(register_module("fc1", nn::Linear(w, 4 * w))),
        fc2(register_module("fc2", nn::Linear(4 * w, w))) {}
  at::Tensor forward(at::Tensor x) { return x + fc2(torch::gelu(fc1(x))); }
  nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

// The demo TransformerNet's forward with each layer (attention + MLP) under volt::checkpoint.
at::Tensor transformer_checkpointed(volt_examples::TransformerNet& m, at::Tensor x) {
  const int64_t b = x.size(0), hd = m.dim_ / m.heads_;
  x = m.embed->forward(x.reshape({b, 28, 28})) + m.pos;
  for (size_t i = 0; i < m.qkv.size(); ++i) {
    auto layer = [&m, i, b, hd](const at::Tensor& h0) {
      at::Tensor h = h0;
      auto parts = m.qkv[i]->forward(m.ln1[i]->forward(h)).chunk(3, -1);
      auto split = [&](const at::Tensor& t) {
        return t.reshape({b, 28, m.heads_, hd}).transpose(1, 2);
      };
      auto a =
          volt::fused_sdpa(split(parts[0]), split(parts[1]), split(parts[2]), volt::SdpaOptions());
      h = h + m.proj[i]->forward(a.output.transpose(1, 2).reshape({b, 28, m.dim_}));
      return h + m.fc2[i]->forward(torch::gelu(m.fc1[i]->forward(m.ln2[i]->forward(h))));
    };
    x = volt::checkpoint(layer, x);
  }
  return m.head->forward(m.norm->forward(x).mean(1));
}

struct Measure {
  double ms = 0;
  double peak_mib = 0;
};

// One step: forward, loss, backward. Returns the peak live bytes above the start.
int64_t step_peak(const std::function<at::Tensor()>& forward) {
  const int64_t base = volt::cpu_memory_stats().in_use;
  volt::reset_cpu_memory_peaks();
  forward().square().mean().backward();
  return volt::cpu_memory_stats().max_in_use - base;
}

std::vector<Measure> interleaved(const std::vector<std::function<at::Tensor()>>& variants,
                                 int reps) {
  std::vector<Measure> out(variants.size());
  for (size_t i = 0; i < variants.size(); ++i) {
    step_peak(variants[i]);  // warm-up; gradients exist from here on
    out[i].peak_mib = step_peak(variants[i]) / 1048576.0;
  }
  std::vector<std::vector<double>> t(variants.size());
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < variants.size(); ++i) {
      const auto t0 = Clock::now();
      variants[i]().square().mean().backward();
      t[i].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
  }
  for (size_t i = 0; i < variants.size(); ++i) {
    std::sort(t[i].begin(), t[i].end());
    out[i].ms = t[i][t[i].size() / 2];
  }
  return out;
}

void table(const std::string& model, const std::vector<std::string>& names,
           const std::vector<Measure>& m) {
  for (size_t i = 0; i < m.size(); ++i) {
    std::printf("| %s | %s | %.2f | %.2fx | %.2f | %.2fx |\n", model.c_str(), names[i].c_str(),
                m[i].ms, m[i].ms / m[0].ms, m[i].peak_mib, m[i].peak_mib / m[0].peak_mib);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, threads = 1;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[++i]);
  }
  torch::set_num_threads(threads);
  volt::install_counting_cpu_allocator();
  torch::manual_seed(0);
  std::printf("reps=%d threads=%d\n\n", reps, threads);
  std::printf("| model | variant | step ms | time ratio | peak activations MiB | memory ratio |\n");
  std::printf("|---|---|---|---|---|---|\n");

  {
    const int64_t depth = 16, width = 256, batch = 256;
    nn::Sequential plain, wrapped;
    for (int64_t i = 0; i < depth; ++i) plain->push_back(Block(width));
    torch::manual_seed(0);
    for (int64_t i = 0; i < depth; ++i) wrapped->push_back(Block(width));
    volt::wrap_activation_checkpointing(*wrapped, {"*"});
    const at::Tensor x = torch::randn({batch, width});
    const auto m =
        interleaved({[&] { return plain->forward(x); }, [&] { return wrapped->forward(x); },
                     [&] { return volt::checkpoint_sequential(plain, 4, x); }},
                    reps);
    table("MLP 16x(256->1024->256), batch 256",
          {"plain", "every block (wrapped by name)", "checkpoint_sequential, 4 segments"}, m);
  }
  {
    volt_examples::TransformerNet net(128, 4, 6);
    const at::Tensor x = torch::randn({64, 1, 28, 28});
    const auto m = interleaved(
        {[&] { return net.forward(x); }, [&] { return transformer_checkpointed(net, x); }}, reps);
    table("TransformerNet dim 128, 6 layers, batch 64", {"plain", "every layer checkpointed"}, m);
  }
  return 0;
}
