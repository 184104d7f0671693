// bf16-mixed against fp32 on this CPU. (1) Per op: forward + backward of each op the demo models
// use, in fp32 and under bf16 autocast. (2) Whole training steps (forward, backward, SGD step)
// of a Linear-heavy MLP, the demo MLP and the demo CNN in fp32, bf16-mixed with libtorch's
// built-in autocast policy, bf16-mixed with volt's CPU policy (the "bf16-mixed" default), and
// 64-true (the model and its inputs in float64).
// Every repetition runs each variant once, back to back (interleaved, so drift hits all alike);
// tables show medians. Prints markdown.
//
//   build/benchmarks/volt_bench_precision [--reps N] [--threads N]

#include <torch/torch.h>
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
#include "timing.h"

namespace {

using volt_bench::median;

using Clock = std::chrono::steady_clock;

double millis(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Runs every variant once per repetition (after one warm-up round); returns medians in ms.
std::vector<double> interleaved(const std::vector<std::function<void()>>& variants, int reps) {
  for (auto& f : variants) f();
  std::vector<std::vector<double>> t(variants.size());
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < variants.size(); ++i) t[i].push_back(millis(variants[i]));
  }
  std::vector<double> out;
  for (auto& v : t) out.push_back(median(v));
  return out;
}

struct OpCase {
  std::string name;
  std::function<at::Tensor()> run;  // returns a scalar to backward through
};

void op_table(int reps) {
  torch::manual_seed(0);
  auto x_mlp = torch::randn({256, 784});
  torch::nn::Linear big(784, 1024), sq(1024, 1024);
  auto h = torch::randn({256, 1024}, torch::requires_grad());
  auto img = torch::randn({64, 1, 28, 28});
  torch::nn::Conv2d c1(torch::nn::Conv2dOptions(1, 32, 3).padding(1));
  torch::nn::Conv2d c2(torch::nn::Conv2dOptions(32, 64, 3).padding(1));
  auto f1 = torch::randn({64, 32, 28, 28}, torch::requires_grad());
  torch::nn::BatchNorm2d bn(32);
  auto logits = torch::randn({256, 10}, torch::requires_grad());
  auto target = torch::randint(0, 10, {256});
  std::vector<OpCase> cases = {
      {"linear 256x784 -> 1024", [&] { return big->forward(x_mlp).sum(); }},
      {"linear 256x1024 -> 1024", [&] { return sq->forward(h).sum(); }},
      {"conv2d 64x1x28x28 -> 32 (3x3)", [&] { return c1->forward(img).sum(); }},
      {"conv2d 64x32x28x28 -> 64 (3x3)", [&] { return c2->forward(f1).sum(); }},
      {"relu 256x1024", [&] { return torch::relu(h).sum(); }},
      {"batch_norm 64x32x28x28", [&] { return bn->forward(f1).sum(); }},
      {"max_pool2d 64x32x28x28", [&] { return torch::max_pool2d(f1, 2).sum(); }},
      {"cross_entropy 256x10", [&] { return torch::cross_entropy_loss(logits, target); }},
  };
  std::printf("### Per op, forward + backward, %d threads (median of %d)\n\n",
              at::get_num_threads(), reps);
  std::printf("| op | fp32 ms | bf16 autocast ms | bf16 / fp32 time |\n|---|---:|---:|---:|\n");
  for (auto& c : cases) {
    auto fp32 = [&] { c.run().backward(); };
    auto bf16 = [&] {
      at::Tensor l;
      {
        volt::AutocastGuard g(c10::kCPU);
        l = c.run();
      }
      l.to(at::kFloat).backward();
    };
    auto t = interleaved({fp32, bf16}, reps);
    std::printf("| %s | %.3f | %.3f | %.2f |\n", c.name.c_str(), t[0], t[1], t[1] / t[0]);
  }
  std::printf("\n");
}

template <typename Net>
std::function<void()> step_fn(std::shared_ptr<Net> net, std::shared_ptr<volt::Precision> precision,
                              at::Tensor x, at::Tensor y) {
  precision->setup(torch::kCPU);
  precision->convert_module(*net);  // 64-true: float64 weights (the others keep fp32's)
  x = precision->convert_input(volt::Batch{x, y, {}}).input;
  auto opt = std::make_shared<torch::optim::SGD>(net->parameters(),
                                                 torch::optim::SGDOptions(0.01).momentum(0.9));
  return [=] {
    at::Tensor loss;
    {
      auto ctx = precision->forward_context();
      loss = torch::cross_entropy_loss(net->forward(x), y);
    }
    precision->backward(loss, nullptr);
    precision->optimizer_step(*opt);
    opt->zero_grad();
  };
}

template <typename Net, typename Make>
void step_row(const std::string& name, Make make, int64_t batch, std::vector<int64_t> in_shape,
              int reps) {
  torch::manual_seed(0);
  std::vector<int64_t> shape = {batch};
  shape.insert(shape.end(), in_shape.begin(), in_shape.end());
  auto x = torch::randn(shape);
  auto y = torch::randint(0, 10, {batch});
  auto builtin = std::make_shared<volt::MixedPrecision>(
      volt::MixedPrecisionOptions().cpu_policy(false).read_env_lists(false));
  auto volt_default =
      std::make_shared<volt::MixedPrecision>(volt::MixedPrecisionOptions().read_env_lists(false));
  auto t = interleaved({step_fn(make(), std::make_shared<volt::Fp32Precision>(), x, y),
                        step_fn(make(), builtin, x, y), step_fn(make(), volt_default, x, y),
                        step_fn(make(), std::make_shared<volt::DoublePrecision>(), x, y)},
                       reps);
  std::printf("| %s, batch %lld | %.2f | %.2f (%.2fx) | %.2f (%.2fx) | %.2f (%.2fx) |\n",
              name.c_str(), static_cast<long long>(batch), t[0], t[1], t[0] / t[1], t[2],
              t[0] / t[2], t[3], t[0] / t[3]);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 30;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      at::set_num_threads(std::atoi(argv[++i]));
  }
  std::printf("## bf16-mixed vs fp32 (libtorch %d.%d, %d threads)\n\n", TORCH_VERSION_MAJOR,
              TORCH_VERSION_MINOR, at::get_num_threads());
  op_table(reps);
  std::printf("### Training step (forward, backward, SGD), median ms; speed vs fp32 in ()\n\n");
  std::printf(
      "| model | fp32 | bf16-mixed, libtorch policy | bf16-mixed, volt CPU policy | 64-true |\n"
      "|---|---:|---:|---:|---:|\n");
  using volt_examples::CnnNet;
  using volt_examples::MlpNet;
  step_row<MlpNet>(
      "MLP 784-1024-1024-10",
      [] {
        return std::make_shared<MlpNet>(std::vector<int64_t>{1024, 1024});
      },
      256, {784}, reps);
  step_row<MlpNet>(
      "demo MLP 784-128-10", [] { return std::make_shared<MlpNet>(); }, 64, {784}, reps);
  step_row<CnnNet>(
      "demo CNN", [] { return std::make_shared<CnnNet>(); }, 64, {1, 28, 28}, reps);
  return 0;
}
