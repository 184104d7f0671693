// What one training step dispatches: libtorch ops per optimizer step in Trainer.fit and in a
// hand-written loop doing the same work (gather a batch, move it, forward, backward, Adam,
// gradients reset to undefined as torch 2.x's zero_grad does). On a GPU each op that is not a
// view is at least one kernel launch, and a launch-bound model pays per launch, so this is the
// count to keep down; it is the same on every device, so the CPU measures it for the GPU.
// Ops are counted with a global RecordFunction callback, per step as the difference between a
// long and a short run (set-up and teardown cancel out). Before counting, the same two runs are
// timed without the callback, which splits wall time into per-step time and the fixed cost of
// a run (fit's set-up and teardown; the hand loop's optimizer construction and model move).
//
//   build/benchmarks/volt_bench_step_ops [--accelerator cpu|cuda] [--steps N]

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "adam_module.h"
#include "bench_trainer.h"
#include "hand_loop.h"
#include "models.h"

namespace {

struct Counts {
  std::map<std::string, int64_t> top;  // ops called from user or volt code
  int64_t all = 0;                     // every op, nested ones included
};

Counts* g_counts = nullptr;
thread_local int t_depth = 0;

struct Ctx : at::ObserverContext {};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (g_counts == nullptr || fn.scope() != at::RecordScope::FUNCTION) return nullptr;
  if (t_depth == 0) ++g_counts->top[fn.name()];
  ++g_counts->all;
  ++t_depth;
  return std::make_unique<Ctx>();
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx != nullptr) --t_depth;
}

Counts count_fit(const torch::Tensor& x, const torch::Tensor& y, const std::string& acc,
                 int64_t steps) {
  volt_bench::AdamModule<volt_examples::MlpNet> m(
      std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{256, 128}));
  volt::Trainer t(volt_bench::bench_trainer(acc, steps));
  volt::DataLoader dl(std::make_shared<volt::TensorDataset>(x, y),
                      volt::DataLoaderOptions(128).shuffle(true).seed(1));
  Counts c;
  g_counts = &c;
  t.fit(m, dl);
  g_counts = nullptr;
  return c;
}

Counts count_hand(const torch::Tensor& x, const torch::Tensor& y, const torch::Device& dev,
                  int64_t steps) {
  auto net = std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{256, 128});
  net->to(dev);
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-3));
  Counts c;
  g_counts = &c;
  volt_bench::for_each_batch(x, y, 128, steps, dev,
                             [&](const torch::Tensor& xb, const torch::Tensor& yb) {
                               for (auto& p : net->parameters())
                                 p.mutable_grad().reset();  // zero_grad(set_to_none)
                               auto loss = torch::cross_entropy_loss(net->forward(xb), yb);
                               loss.backward();
                               opt.step();
                             });
  g_counts = nullptr;
  return c;
}

struct Timing {
  double per_step_ms = 0, fixed_ms = 0;
};

// Wall time of each contender's run(n) for n = base and base + steps, the runs interleaved so
// that this VM's drift hits both alike; the median of 5 of each, split into per-step and fixed
// cost.
template <typename A, typename B>
std::pair<Timing, Timing> time_split(A a, B b, int64_t base, int64_t steps, bool cuda) {
  auto ms = [&](auto& run, int64_t n) {
    if (cuda) torch::cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    run(n);
    if (cuda) torch::cuda::synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  a(base);  // warm-up
  b(base);
  std::vector<double> alo, ahi, blo, bhi;
  for (int r = 0; r < 5; ++r) {
    alo.push_back(ms(a, base));
    blo.push_back(ms(b, base));
    ahi.push_back(ms(a, base + steps));
    bhi.push_back(ms(b, base + steps));
  }
  auto split = [&](std::vector<double> lo, std::vector<double> hi) {
    std::sort(lo.begin(), lo.end());
    std::sort(hi.begin(), hi.end());
    Timing t;
    t.per_step_ms = (hi[2] - lo[2]) / static_cast<double>(steps);
    t.fixed_ms = lo[2] - t.per_step_ms * static_cast<double>(base);
    return t;
  };
  return {split(alo, ahi), split(blo, bhi)};
}

// Per step: (long run - short run) / (long - short steps).
std::map<std::string, double> per_step(const Counts& lo, const Counts& hi, int64_t steps,
                                       double* all) {
  std::map<std::string, double> out;
  for (const auto& kv : hi.top) {
    const auto it = lo.top.find(kv.first);
    const int64_t d = kv.second - (it == lo.top.end() ? 0 : it->second);
    if (d != 0) out[kv.first] = static_cast<double>(d) / steps;
  }
  *all = static_cast<double>(hi.all - lo.all) / steps;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string acc = "cpu";
  int64_t steps = 100;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--accelerator") acc = argv[++i];
    if (a == "--steps") steps = std::stoll(argv[++i]);
  }
  if (acc == "cuda" && !torch::cuda::is_available()) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  const torch::Device dev(acc == "cuda" ? torch::kCUDA : torch::kCPU);
  torch::manual_seed(0);
  // Synthetic Fashion-MNIST-shaped data on the CPU, as a dataset in memory would be.
  const torch::Tensor x = torch::randn({4096, 784}), y = torch::randint(10, {4096});
  const int64_t base = 10;
  const bool cuda = dev.is_cuda();
  const auto [tv, th] = time_split([&](int64_t n) { count_fit(x, y, acc, n); },
                                   [&](int64_t n) { count_hand(x, y, dev, n); }, base, steps, cuda);
  std::printf("MLP 784-256-128-10, batch 128, Adam, on %s: wall time (median of 5)\n", acc.c_str());
  std::printf("  %-24s %12s %12s\n", "", "ms per step", "fixed ms");
  std::printf("  %-24s %12.3f %12.1f\n", "volt Trainer.fit", tv.per_step_ms, tv.fixed_ms);
  std::printf("  %-24s %12.3f %12.1f\n", "hand loop", th.per_step_ms, th.fixed_ms);

  at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end));
  double volt_all = 0, hand_all = 0;
  const auto v =
      per_step(count_fit(x, y, acc, base), count_fit(x, y, acc, base + steps), steps, &volt_all);
  const auto h =
      per_step(count_hand(x, y, dev, base), count_hand(x, y, dev, base + steps), steps, &hand_all);

  std::set<std::string> names;
  for (const auto& kv : v) names.insert(kv.first);
  for (const auto& kv : h) names.insert(kv.first);
  std::printf("MLP 784-256-128-10, batch 128, Adam, on %s: ops per optimizer step (%lld steps)\n",
              acc.c_str(), static_cast<long long>(steps));
  std::printf("  %-58s %8s %8s %8s\n", "op (called from user or volt code)", "volt", "hand",
              "volt-hand");
  double vt = 0, ht = 0;
  for (const std::string& n : names) {
    const double a = v.count(n) ? v.at(n) : 0, b = h.count(n) ? h.at(n) : 0;
    vt += a;
    ht += b;
    std::printf("  %-58s %8.2f %8.2f %+9.2f\n", n.c_str(), a, b, a - b);
  }
  std::printf("  %-58s %8.2f %8.2f %+9.2f\n", "total", vt, ht, vt - ht);
  std::printf("  %-58s %8.2f %8.2f %+9.2f\n", "every op, nested ones included", volt_all, hand_all,
              volt_all - hand_all);
  return 0;
}
