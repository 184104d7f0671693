// CUDA graphs on a GPU (issue #15), side by side in one run:
//  1. The training step of the Fashion-MNIST MLP 784-256-128-10, batch 128, SGD with momentum:
//     eager (a hand-written libtorch loop) against the whole step (forward, backward, optimizer
//     step) replayed from one volt::CudaGraph. Steps/s.
//  2. The MLP's forward+backward through volt::make_graphed_callable against eager (the
//     optimizer step stays eager on both sides). Steps/s.
//  3. Inference of the demo transformer (examples/models.h) at batch 1, 2, 4, 8: eager
//     forward under no_grad against volt::wrap_in_graph (asynchronous, as the eager launches).
//     Calls/s.
//  4. Trainer.fit of the MLP eager against graph_training_step (SGD momentum, and
//     volt::FusedAdamW), the data on the CPU in pinned memory. Steps/s.
// Each figure is the median of R rounds; rounds interleave the contenders.
//
//   build/benchmarks/volt_bench_cuda_graphs [--rounds R] [--steps N]

#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_trainer.h"
#include "host_memory.h"
#include "models.h"
#include "timing.h"

namespace {

using volt_bench::median;
using volt_bench::time_ms;

const torch::Device kCuda(torch::kCUDA, 0);

std::shared_ptr<volt_examples::MlpNet> make_mlp() {
  torch::manual_seed(0);
  auto m = std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{256, 128});
  m->to(kCuda);
  return m;
}

struct Batches {
  std::vector<torch::Tensor> x, y;
};

Batches make_batches(int64_t n, int64_t batch) {
  Batches b;
  for (int64_t i = 0; i < n; ++i) {
    b.x.push_back(torch::randn({batch, 1, 28, 28}).to(kCuda));
    b.y.push_back(torch::randint(0, 10, {batch}, torch::kLong).to(kCuda));
  }
  return b;
}

void clear_grads(torch::nn::Module& m) {
  for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
}

// Steps/s of the eager step.
double eager_train(const Batches& b, int64_t steps) {
  auto net = make_mlp();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::cuda::synchronize();
  const double ms = time_ms([&] {
    for (int64_t k = 0; k < steps; ++k) {
      const size_t i = static_cast<size_t>(k) % b.x.size();
      clear_grads(*net);
      auto loss = torch::cross_entropy_loss(net->forward(b.x[i]), b.y[i]);
      loss.backward();
      opt.step();
    }
    torch::cuda::synchronize();
  });
  return steps / (ms / 1000.0);
}

// Steps/s of the whole step replayed from one graph (capture excluded, batch copy included).
double graphed_train(const Batches& b, int64_t steps) {
  auto net = make_mlp();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::Tensor sx = b.x[0].clone(), sy = b.y[0].clone(), loss;
  volt::run_on_side_stream(
      [&] {
        clear_grads(*net);
        loss = torch::cross_entropy_loss(net->forward(sx), sy);
        loss.backward();
        opt.step();
      },
      3);
  clear_grads(*net);
  volt::CudaGraph g("mlp_train_step");
  g.capture([&] {
    loss = torch::cross_entropy_loss(net->forward(sx), sy);
    loss.backward();
    opt.step();
  });
  torch::cuda::synchronize();
  const double ms = time_ms([&] {
    for (int64_t k = 0; k < steps; ++k) {
      const size_t i = static_cast<size_t>(k) % b.x.size();
      sx.copy_(b.x[i]);
      sy.copy_(b.y[i]);
      g.replay();
    }
    torch::cuda::synchronize();
  });
  return steps / (ms / 1000.0);
}

// Steps/s with forward+backward replayed by make_graphed_callable, the optimizer eager.
double callable_train(const Batches& b, int64_t steps, bool graphed) {
  auto net = make_mlp();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  volt::TensorFunction fwd = [net](const volt::TensorList& in) {
    return volt::TensorList{net->forward(in[0])};
  };
  std::unique_ptr<volt::GraphedCallable> g;
  if (graphed) {
    g = std::make_unique<volt::GraphedCallable>(
        volt::make_graphed_callable(*net, fwd, {b.x[0]}, {}, "mlp"));
  }
  torch::cuda::synchronize();
  const double ms = time_ms([&] {
    for (int64_t k = 0; k < steps; ++k) {
      const size_t i = static_cast<size_t>(k) % b.x.size();
      clear_grads(*net);
      auto out = graphed ? (*g)({b.x[i]})[0] : net->forward(b.x[i]);
      auto loss = torch::cross_entropy_loss(out, b.y[i]);
      loss.backward();
      opt.step();
    }
    torch::cuda::synchronize();
  });
  return steps / (ms / 1000.0);
}

// The MLP as a volt::Module: cross-entropy, train_loss logged every step.
class MlpModule : public volt::Module {
 public:
  explicit MlpModule(bool adamw) : adamw_(adamw) {
    torch::manual_seed(0);
    net_ = register_module("net",
                           std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{256, 128}));
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto loss = torch::cross_entropy_loss(net_->forward(b.input), b.target);
    log("train_loss", loss);
    return loss;
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    if (adamw_) return {std::make_shared<volt::FusedAdamW>(parameters(), 1e-3)};
    return {std::make_shared<torch::optim::SGD>(parameters(),
                                                torch::optim::SGDOptions(0.01).momentum(0.9))};
  }

 private:
  bool adamw_;
  std::shared_ptr<volt_examples::MlpNet> net_;
};

// Steps/s of Trainer.fit, eager or with graph_training_step; data on the CPU, pinned batches.
double trainer_fit(bool graphed, bool adamw, const torch::Tensor& x, const torch::Tensor& y,
                   int64_t steps) {
  MlpModule m(adamw);
  volt::Trainer t(volt_bench::bench_trainer("cuda", steps).graph_training_step(graphed));
  auto ds = std::make_shared<volt::TensorDataset>(x, y);
  volt::DataLoader dl(ds, volt::DataLoaderOptions(128).shuffle(true).seed(1).pin_memory(true));
  torch::cuda::synchronize();
  const double ms = time_ms([&] {
    t.fit(m, dl);
    torch::cuda::synchronize();
  });
  return steps / (ms / 1000.0);
}

// Calls/s of the transformer's forward, eager or through wrap_in_graph.
double infer(volt_examples::TransformerNet& net, int64_t batch, int64_t calls, bool graphed) {
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({batch, 1, 28, 28}).to(kCuda);
  volt::TensorFunction fwd = [&net](const volt::TensorList& in) {
    return volt::TensorList{net.forward(in[0])};
  };
  std::unique_ptr<volt::GraphedModule> g;
  if (graphed) {
    g = std::make_unique<volt::GraphedModule>(
        volt::wrap_in_graph(net, fwd, volt::GraphOptions().asynchronous(true)));  // moved
    (*g)({x});  // capture outside the timing
  }
  for (int i = 0; i < 5; ++i) graphed ? (*g)({x}) : fwd({x});
  torch::cuda::synchronize();
  const double ms = time_ms([&] {
    for (int64_t k = 0; k < calls; ++k) graphed ? (*g)({x}) : fwd({x});
    torch::cuda::synchronize();
  });
  return calls / (ms / 1000.0);
}

}  // namespace

int main(int argc, char** argv) {
  volt_bench::same_host_malloc_for_every_contender();
  int rounds = 3;
  int64_t steps = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoll(argv[i + 1]);
  }
  if (!volt::CudaGraph::available()) {
    std::printf("skipped: %s\n", volt::CudaGraph::unavailable_reason().c_str());
    return 0;
  }
  const Batches b = make_batches(16, 128);
  eager_train(b, 50);  // warm the libraries up
  std::vector<double> e, g, ce, cg;
  for (int r = 0; r < rounds; ++r) {
    e.push_back(eager_train(b, steps));
    g.push_back(graphed_train(b, steps));
    ce.push_back(callable_train(b, steps, false));
    cg.push_back(callable_train(b, steps, true));
  }
  std::printf("MLP 784-256-128-10, batch 128, SGD momentum, %lld steps, median of %d rounds\n",
              static_cast<long long>(steps), rounds);
  std::printf("  whole step   eager %9.1f steps/s  graphed %9.1f steps/s  x%.2f\n", median(e),
              median(g), median(g) / median(e));
  std::printf(
      "  fwd+bwd      eager %9.1f steps/s  graphed %9.1f steps/s  x%.2f "
      "(make_graphed_callable, optimizer eager)\n",
      median(ce), median(cg), median(cg) / median(ce));

  const torch::Tensor x = torch::randn({16384, 1, 28, 28}), y = torch::randint(0, 10, {16384});
  for (const bool adamw : {false, true}) {
    std::vector<double> te, tg;
    for (int r = 0; r < rounds; ++r) {
      te.push_back(trainer_fit(false, adamw, x, y, steps));
      tg.push_back(trainer_fit(true, adamw, x, y, steps));
    }
    std::printf(
        "  Trainer.fit  eager %9.1f steps/s  graphed %9.1f steps/s  x%.2f (%s, data on "
        "the CPU, pinned)\n",
        median(te), median(tg), median(tg) / median(te),
        adamw ? "volt::FusedAdamW" : "SGD momentum");
  }

  torch::manual_seed(0);
  for (const bool fused : {true, false}) {
    auto net = std::make_shared<volt_examples::TransformerNet>(64, 4, 2, fused);
    net->to(kCuda);
    net->eval();
    std::printf("demo transformer (dim 64, 4 heads, 2 layers, %s attention), inference\n",
                fused ? "volt::fused_sdpa" : "reference");
    try {
      for (const int64_t batch : {1, 2, 4, 8}) {
        std::vector<double> ie, ig;
        for (int r = 0; r < rounds; ++r) {
          ie.push_back(infer(*net, batch, steps, false));
          ig.push_back(infer(*net, batch, steps, true));
        }
        std::printf("  batch %lld  eager %9.1f calls/s  graphed %9.1f calls/s  x%.2f\n",
                    static_cast<long long>(batch), median(ie), median(ig), median(ig) / median(ie));
      }
    } catch (const std::exception& ex) {
      std::printf("  failed: %s\n", ex.what());
    }
  }
  return 0;
}
