// FusedAdamW, FusedSGD and FusedClipNorm against libtorch's AdamW, SGD and clip_grad_norm_ on
// a model with many small parameters and one with a few large ones. Each repetition times one
// libtorch call and one fused call back to back (interleaved, so drift hits both alike); the
// table shows the median microseconds per call and the speed-up. Prints markdown. float32 on all
// three workloads, then bfloat16 parameters (bf16-true training) on the small and large ones.
//
//   build/benchmarks/volt_bench_fused_optim [repetitions]

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

Workload many_small() {
  // 150 tensors: the weights and biases of a stack of small layers.
  const std::vector<std::vector<int64_t>> cycle = {{64, 64}, {64},      {128, 64},
                                                   {128},    {10, 128}, {10}};
  Workload w{"150 small tensors", {}};
  for (int i = 0; i < 150; ++i) w.shapes.push_back(cycle[i % cycle.size()]);
  return w;
}

// Fixed cost per tensor and step: almost no arithmetic.
Workload many_tiny() {
  Workload w{"150 tiny tensors (16 elements)", {}};
  for (int i = 0; i < 150; ++i) w.shapes.push_back({16});
  return w;
}

Workload few_large() {
  return {"4 x 1M-element tensors", {{1000, 1000}, {1000, 1000}, {1000, 1000}, {1000, 1000}}};
}

int64_t numel_of(const Workload& w) {
  int64_t n = 0;
  for (const auto& s : w.shapes) {
    int64_t k = 1;
    for (auto d : s) k *= d;
    n += k;
  }
  return n;
}

/// Two identical parameter sets with identical gradients.
std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> make_params(const Workload& w,
                                                                              torch::Dtype dtype) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> a, b;
  for (const auto& s : w.shapes) {
    auto p = torch::randn(s, dtype).requires_grad_();
    auto q = p.detach().clone().requires_grad_();
    auto g = torch::randn(s, dtype);
    p.mutable_grad() = g.clone();
    q.mutable_grad() = g.clone();
    a.push_back(p);
    b.push_back(q);
  }
  return {a, b};
}

double micros(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double max_abs_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, (a[i].detach().to(torch::kDouble) - b[i].detach().to(torch::kDouble))
                        .abs()
                        .max()
                        .item<double>());
  }
  return d;
}

struct Row {
  std::string workload, op;
  int threads;
  double torch_us, fused_us, diff;
};

/// Times `reference` and `fused` interleaved; `diff` compares the two parameter sets after.
Row measure(const std::string& workload, const std::string& op, int threads, int reps,
            const std::function<void()>& reference, const std::function<void()>& fused,
            const std::function<double()>& diff) {
  for (int i = 0; i < 3; ++i) {  // warm-up: state allocation, page faults, thread pool
    reference();
    fused();
  }
  std::vector<double> ta, tb;
  for (int i = 0; i < reps; ++i) {
    ta.push_back(micros(reference));
    tb.push_back(micros(fused));
  }
  return {workload, op, threads, median(ta), median(tb), diff()};
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 100;
  std::vector<Row> rows;
  struct Run {
    Workload w;
    torch::Dtype dtype;
  };
  for (const Run& run : {Run{many_small(), torch::kFloat}, Run{many_tiny(), torch::kFloat},
                         Run{few_large(), torch::kFloat}, Run{many_small(), torch::kBFloat16},
                         Run{few_large(), torch::kBFloat16}}) {
    Workload w = run.w;
    if (run.dtype == torch::kBFloat16) w.name += ", bf16";
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      const int n = w.shapes.size() > 10 ? reps : std::max(10, reps / 4);
      {
        auto [a, b] = make_params(w, run.dtype);
        torch::optim::AdamW ref(a, torch::optim::AdamWOptions(1e-3));
        volt::FusedAdamW fused(b, volt::FusedAdamWOptions(1e-3));
        rows.push_back(measure(
            w.name, "AdamW step", threads, n, [&] { ref.step(); }, [&] { fused.step(); },
            [&] { return max_abs_diff(a, b); }));
      }
      {
        auto [a, b] = make_params(w, run.dtype);
        torch::optim::SGD ref(a, torch::optim::SGDOptions(1e-3).momentum(0.9));
        volt::FusedSGD fused(b, volt::FusedSGDOptions(1e-3).momentum(0.9));
        rows.push_back(measure(
            w.name, "SGD(momentum) step", threads, n, [&] { ref.step(); }, [&] { fused.step(); },
            [&] { return max_abs_diff(a, b); }));
      }
      {
        // max_norm below the norm, so every call scales the gradients in both versions.
        auto [a, b] = make_params(w, run.dtype);
        auto grads = [](const std::vector<torch::Tensor>& ps) {
          std::vector<torch::Tensor> g;
          for (const auto& p : ps) g.push_back(p.grad());
          return g;
        };
        rows.push_back(measure(
            w.name, "clip_grad_norm_ (L2)", threads, n,
            [&] { torch::nn::utils::clip_grad_norm_(a, 1e-3); },
            [&] { volt::fused_clip_grad_norm_(b, 1e-3); },
            [&] { return max_abs_diff(grads(a), grads(b)); }));
      }
    }
  }
  std::printf("| workload | threads | op | libtorch µs | fused µs | speed-up | max abs diff |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %d | %s | %.1f | %.1f | %.2fx | %.1e |\n", r.workload.c_str(), r.threads,
                r.op.c_str(), r.torch_us, r.fused_us, r.torch_us / r.fused_us, r.diff);
  }
  std::printf(
      "\nElements: %lld (small), %lld (tiny), %lld (large); median of %d (small, tiny) / "
      "%d (large) interleaved repetitions.\n",
      static_cast<long long>(numel_of(many_small())), static_cast<long long>(numel_of(many_tiny())),
      static_cast<long long>(numel_of(few_large())), reps, std::max(10, reps / 4));
  return 0;
}
