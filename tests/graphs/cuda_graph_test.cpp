// CUDA graph capture and replay (volt/graphs/cuda_graph.h, graphed_module.h): the error paths
// that hold on any machine, and, where a GPU is visible, capture and replay checked against
// eager execution of the same kernels (bit for bit: a replay launches the kernels the eager
// run launched). Without a GPU the CUDA tests skip, naming the reason.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "error_text.h"
#include "volt/core/errors.h"
#include "volt/graphs/cuda_graph.h"
#include "volt/graphs/graphed_module.h"

using volt::CudaGraph;
using volt::GraphedModule;
using volt::GraphOptions;
using volt::TensorList;
using volt_test::error_of;

namespace {

#define VOLT_REQUIRE_CUDA_GRAPHS()                                                    \
  do {                                                                                \
    if (!CudaGraph::available()) {                                                    \
      GTEST_SKIP() << "CUDA graphs unavailable: " << CudaGraph::unavailable_reason(); \
    }                                                                                 \
  } while (0)

struct Mlp : torch::nn::Module {
  Mlp(int64_t in, int64_t hidden, int64_t out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

std::shared_ptr<Mlp> make_mlp(const torch::Device& device, int64_t in = 32, int64_t hidden = 64,
                              int64_t out = 10) {
  torch::manual_seed(0);
  auto m = std::make_shared<Mlp>(in, hidden, out);
  m->to(device);
  return m;
}

volt::TensorFunction forward_of(const std::shared_ptr<Mlp>& m) {
  return [m](const TensorList& in) { return TensorList{m->forward(in[0])}; };
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.detach().to(torch::kDouble) - b.detach().to(torch::kDouble)).abs().max().item<double>();
}

const torch::Device kCuda(torch::kCUDA, 0);

}  // namespace

// ---------------------------------------------------------------- on every machine

TEST(CudaGraph, WithoutAGpuCaptureIsNotAvailableAndReplayIsAValueError) {
  if (CudaGraph::available()) GTEST_SKIP() << "a GPU is visible: the no-GPU path is not taken";
  CudaGraph g("no_gpu");
  EXPECT_FALSE(CudaGraph::unavailable_reason().empty());
  const std::string e = error_of<volt::NotAvailable>([&] { g.capture([] {}); });
  EXPECT_NE(e.find("[Graphs] no_gpu:"), std::string::npos) << e;
  EXPECT_FALSE(g.captured());
  EXPECT_FALSE(g.capturing());
  const std::string r = error_of<volt::ValueError>([&] { g.replay(); });
  EXPECT_NE(r.find("replay() before a successful capture"), std::string::npos) << r;
  error_of<volt::NotAvailable>([] { volt::GraphPool::create(); });
  // The guard form fails the same way and leaves nothing behind.
  error_of<volt::NotAvailable>([&] { volt::GraphCaptureGuard guard(g); });
  EXPECT_FALSE(g.capturing());
}

TEST(CudaGraph, RunOnSideStreamRunsTheWorkItersTimes) {
  int runs = 0;
  volt::run_on_side_stream([&] { ++runs; }, 3);
  EXPECT_EQ(runs, 3);
  volt::run_on_side_stream([&] { ++runs; }, 0);
  EXPECT_EQ(runs, 3);
  const std::string e =
      error_of<volt::ConfigError>([&] { volt::run_on_side_stream([&] { ++runs; }, -1); });
  EXPECT_NE(e.find("iters=-1"), std::string::npos) << e;
}

TEST(GraphedCallable, CpuTensorsAreNotAvailableNamingTheInput) {
  auto m = make_mlp(torch::kCPU);
  const std::string e = error_of<volt::NotAvailable>([&] {
    volt::make_graphed_callable(*m, forward_of(m), {torch::randn({4, 32})}, {}, "mlp");
  });
  EXPECT_NE(e.find("[Graphs] mlp"), std::string::npos) << e;
  EXPECT_NE(e.find("input 0"), std::string::npos) << e;
}

TEST(GraphedModule, BadOptionsAndEmptyForwardAreConfigErrors) {
  auto m = make_mlp(torch::kCPU);
  error_of<volt::ConfigError>(
      [&] { GraphedModule g(*m, forward_of(m), GraphOptions().max_graphs(0)); });
  error_of<volt::ConfigError>(
      [&] { GraphedModule g(*m, forward_of(m), GraphOptions().warmup_iters(0)); });
  const std::string e = error_of<volt::ConfigError>([&] { GraphedModule g(*m, nullptr); });
  EXPECT_NE(e.find("forward function is empty"), std::string::npos) << e;
  GraphedModule g(*m, forward_of(m));
  error_of<volt::NotAvailable>([&] { g({torch::randn({2, 32})}); });
  EXPECT_EQ(g.size(), 0u);  // a failed capture keeps nothing
  EXPECT_EQ(g.stats().misses, 1);
}

// ---------------------------------------------------------------- with a GPU

TEST(CudaGraphCuda, ReplayRepeatsTheCapturedWorkOnNewInputs) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  at::Tensor x = torch::zeros({1024}, kCuda);
  at::Tensor y;
  CudaGraph g("affine");
  volt::run_on_side_stream([&] { y = x * 2 + 1; }, 1);
  g.capture([&] { y = x * 2 + 1; });
  EXPECT_TRUE(g.captured());
  EXPECT_EQ(g.device(), kCuda);
  for (int k = 0; k < 3; ++k) {
    x.copy_(torch::full({1024}, static_cast<float>(k), kCuda));
    g.replay();
    EXPECT_TRUE(torch::equal(y.cpu(), torch::full({1024}, 2.0f * k + 1)));
  }
  EXPECT_EQ(g.replays(), 3);
  const std::string e = error_of<volt::ValueError>([&] { g.capture([&] { y = x + 1; }); });
  EXPECT_NE(e.find("already captured"), std::string::npos) << e;
  g.reset();
  g.capture([&] { y = x + 1; });  // reset() allows a new capture
  g.replay();
  EXPECT_TRUE(torch::equal(y.cpu(), torch::full({1024}, 3.0f)));
}

TEST(CudaGraphCuda, HostSyncInCaptureIsAValueErrorAndLeavesEverythingUsable) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  at::Tensor x = torch::ones({16}, kCuda);
  const auto caller = torch::cuda::device_count();  // touch the runtime before capture
  (void)caller;
  CudaGraph g("sync");
  const std::string e = error_of<volt::ValueError>([&] {
    g.capture([&] {
      at::Tensor s = x.sum();
      if (s.item<float>() > 0) x.add_(1);  // a host read of a device value
    });
  });
  EXPECT_NE(e.find("[Graphs] sync: the captured work synchronised with the host"),
            std::string::npos)
      << e;
  EXPECT_FALSE(g.capturing());
  EXPECT_FALSE(g.captured());
  // The process is fine: eager work, host reads and a new capture all work.
  EXPECT_EQ((x * 3).sum().item<float>(), 48.0f);
  at::Tensor y;
  CudaGraph h("after_sync");
  h.capture([&] { y = x * 3; });
  h.replay();
  EXPECT_EQ(y.sum().item<float>(), 48.0f);
}

TEST(CudaGraphCuda, CpuWorkCapturesNothingAndIsNotAvailable) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  at::Tensor x = torch::ones({16});
  at::Tensor y;
  CudaGraph g("cpu_work");
  const std::string e = error_of<volt::NotAvailable>([&] { g.capture([&] { y = x * 2; }); });
  EXPECT_NE(e.find("recorded no CUDA operation"), std::string::npos) << e;
  EXPECT_FALSE(g.captured());
  EXPECT_FALSE(g.capturing());
}

TEST(CudaGraphCuda, GuardAbortsTheCaptureWhenItsScopeThrows) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  at::Tensor x = torch::ones({16}, kCuda);
  at::Tensor y;
  CudaGraph g("guarded");
  try {
    volt::GraphCaptureGuard guard(g);
    y = x * 5;
    throw std::runtime_error("user code failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(g.capturing());
  EXPECT_FALSE(g.captured());
  {
    volt::GraphCaptureGuard guard(g);
    y = x * 5;
    guard.end();
  }
  x.fill_(2);
  g.replay();
  EXPECT_EQ(y.sum().item<float>(), 160.0f);
}

// The reference's HPUGraphsModel pattern, as a plain loop: the whole training step (forward,
// backward, SGD-with-momentum step) captured once after warm-up steps, then replayed on each
// batch, against the same steps run eagerly from the same initial weights.
TEST(CudaGraphCuda, GraphedTrainingStepEqualsEagerTraining) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  const int64_t kSteps = 12, kWarmup = 3, kBatch = 64;
  torch::manual_seed(1);
  std::vector<at::Tensor> xs, ys;
  for (int64_t k = 0; k < kSteps; ++k) {
    xs.push_back(torch::randn({kBatch, 784}).to(kCuda));
    ys.push_back(torch::randint(0, 10, {kBatch}, torch::kLong).to(kCuda));
  }
  auto eager = make_mlp(kCuda, 784, 256, 10);
  auto graphed = make_mlp(kCuda, 784, 256, 10);  // the same seed: the same initial weights
  auto sgd = torch::optim::SGDOptions(0.05).momentum(0.9);
  torch::optim::SGD opt_e(eager->parameters(), sgd);
  torch::optim::SGD opt_g(graphed->parameters(), sgd);
  auto clear_grads = [](torch::nn::Module& m) {
    for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
  };

  std::vector<float> eager_losses;
  for (int64_t k = 0; k < kSteps; ++k) {
    clear_grads(*eager);
    at::Tensor loss = torch::cross_entropy_loss(eager->forward(xs[k]), ys[k]);
    loss.backward();
    opt_e.step();
    eager_losses.push_back(loss.item<float>());
  }

  at::Tensor sx = xs[0].clone(), sy = ys[0].clone(), sloss;
  auto step = [&] {
    clear_grads(*graphed);
    sloss = torch::cross_entropy_loss(graphed->forward(sx), sy);
    sloss.backward();
    opt_g.step();
  };
  std::vector<float> graphed_losses;
  for (int64_t k = 0; k < kWarmup; ++k) {  // real steps, on a side stream
    sx.copy_(xs[k]);
    sy.copy_(ys[k]);
    volt::run_on_side_stream(step, 1);
    graphed_losses.push_back(sloss.item<float>());
  }
  clear_grads(*graphed);  // the graph allocates the gradients in its pool
  CudaGraph g("train_step");
  g.capture([&] {
    sloss = torch::cross_entropy_loss(graphed->forward(sx), sy);
    sloss.backward();
    opt_g.step();
  });
  for (int64_t k = kWarmup; k < kSteps; ++k) {
    sx.copy_(xs[k]);
    sy.copy_(ys[k]);
    g.replay();
    graphed_losses.push_back(sloss.item<float>());
  }
  for (int64_t k = 0; k < kSteps; ++k) {
    EXPECT_EQ(graphed_losses[k], eager_losses[k]) << "step " << k;
  }
  const auto pe = eager->parameters(), pg = graphed->parameters();
  for (size_t i = 0; i < pe.size(); ++i) {
    EXPECT_TRUE(torch::equal(pe[i], pg[i]))
        << "parameter " << i << " max diff " << max_diff(pe[i], pg[i]);
  }
}

TEST(GraphedCallableCuda, ForwardAndBackwardEqualEager) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  auto ref = make_mlp(kCuda);
  auto m = make_mlp(kCuda);
  const at::Tensor sample = torch::randn({8, 32}, kCuda).requires_grad_();
  volt::GraphedCallable g = volt::make_graphed_callable(*m, forward_of(m), {sample}, {}, "mlp");
  EXPECT_TRUE(g.has_backward());
  EXPECT_EQ(g.key().str(), "train+grad(float[8, 32] cuda:0 grad)");
  for (int k = 0; k < 3; ++k) {
    const at::Tensor x = torch::randn({8, 32}, kCuda);
    const at::Tensor w = torch::randn({8, 10}, kCuda);
    at::Tensor xe = x.clone().requires_grad_(), xg = x.clone().requires_grad_();
    ref->zero_grad();
    for (auto& p : m->parameters()) p.mutable_grad() = at::Tensor();
    const at::Tensor oe = ref->forward(xe);
    (oe * w).sum().backward();
    const at::Tensor og = g({xg})[0];
    EXPECT_TRUE(torch::equal(oe, og)) << "forward, call " << k << ": " << max_diff(oe, og);
    (og * w).sum().backward();
    ASSERT_TRUE(xg.grad().defined());
    EXPECT_TRUE(torch::equal(xe.grad(), xg.grad()))
        << "input grad: " << max_diff(xe.grad(), xg.grad());
    const auto pr = ref->parameters(), pm = m->parameters();
    for (size_t i = 0; i < pr.size(); ++i) {
      ASSERT_TRUE(pm[i].grad().defined()) << "parameter " << i;
      EXPECT_TRUE(torch::equal(pr[i].grad(), pm[i].grad()))
          << "parameter " << i << ": " << max_diff(pr[i].grad(), pm[i].grad());
    }
  }
  EXPECT_EQ(g.replays(), 3);
}

TEST(GraphedCallableCuda, OtherShapesAreValueErrorsAndOtherModesRunEagerly) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  auto m = make_mlp(kCuda);
  volt::GraphedCallable g =
      volt::make_graphed_callable(*m, forward_of(m), {torch::randn({8, 32}, kCuda)}, {}, "mlp");
  const std::string e = error_of<volt::ValueError>([&] { g({torch::randn({9, 32}, kCuda)}); });
  EXPECT_NE(e.find("input 0 is float[9, 32] cuda:0"), std::string::npos) << e;
  EXPECT_NE(e.find("volt::GraphedModule"), std::string::npos) << e;
  error_of<volt::ValueError>([&] { g({}); });
  m->eval();  // captured in training mode: runs eagerly, no replay
  const at::Tensor x = torch::randn({8, 32}, kCuda);
  const at::Tensor out = g({x})[0];
  EXPECT_EQ(g.replays(), 0);
  EXPECT_TRUE(torch::equal(out, m->forward(x)));
}

TEST(GraphedModuleCuda, CapturesPerSignatureEvictsAndMatchesEager) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  auto m = make_mlp(kCuda);
  GraphedModule cached(*m, forward_of(m), GraphOptions().max_graphs(2).warmup_iters(1), "mlp");
  const std::vector<int64_t> batches = {4, 8, 4, 8, 16, 4};
  for (const int64_t b : batches) {
    const at::Tensor x = torch::randn({b, 32}, kCuda);
    const at::Tensor out = cached({x})[0];
    EXPECT_TRUE(torch::equal(out, m->forward(x))) << "batch " << b;
  }
  // 4 miss, 8 miss, 4 hit, 8 hit, 16 miss (evicts 4), 4 miss (evicts 8).
  EXPECT_EQ(cached.stats().misses, 4);
  EXPECT_EQ(cached.stats().hits, 2);
  EXPECT_EQ(cached.stats().evictions, 2);
  EXPECT_EQ(cached.size(), 2u);
  error_of<volt::NotAvailable>([&] { cached({torch::randn({4, 32})}); });
}

TEST(WrapInGraphCuda, InferenceMatchesEagerAndCopiesOutputsWhenAsked) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  auto m = make_mlp(kCuda);
  m->eval();
  GraphedModule aliased = volt::wrap_in_graph(*m, forward_of(m));
  GraphedModule copied =
      volt::wrap_in_graph(*m, forward_of(m), GraphOptions().disable_tensor_cache(true));
  EXPECT_TRUE(aliased.inference());
  const at::Tensor x1 = torch::randn({2, 32}, kCuda), x2 = torch::randn({2, 32}, kCuda);
  at::Tensor a1, a2, c1, c2, e1, e2;
  {
    torch::NoGradGuard no_grad;
    e1 = m->forward(x1);
    e2 = m->forward(x2);
  }
  a1 = aliased({x1})[0].clone();  // the graph's buffer, copied before the next replay
  a2 = aliased({x2})[0];
  c1 = copied({x1})[0];
  c2 = copied({x2})[0];
  EXPECT_FALSE(a2.requires_grad());
  EXPECT_TRUE(torch::equal(a1, e1));
  EXPECT_TRUE(torch::equal(a2, e2));
  EXPECT_TRUE(torch::equal(c1, e1));  // not overwritten by the second replay
  EXPECT_TRUE(torch::equal(c2, e2));
  const at::Tensor a3 = aliased({x1})[0];
  EXPECT_EQ(a3.data_ptr(), a2.data_ptr());  // outputs alias the static buffer by default
  EXPECT_NE(c1.data_ptr(), c2.data_ptr());
  EXPECT_EQ(aliased.stats().misses, 1);
  EXPECT_EQ(aliased.stats().hits, 2);
}

// The reference's two dynamic-model patterns (docs/CUDA_GRAPHS.md): a branch chosen by host
// code between separately graphed submodules, and a data-dependent op (nonzero) run eagerly
// between two graphed regions, the second cached per input shape.
TEST(DynamicModelsCuda, BranchesAndDynamicOpsRunBetweenGraphedRegions) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  torch::manual_seed(0);
  torch::nn::Linear a(16, 16), b(16, 16), head(16, 4);
  a->to(kCuda);
  b->to(kCuda);
  head->to(kCuda);
  a->eval();
  b->eval();
  head->eval();
  auto eager = [&](const at::Tensor& x, bool use_a) {
    at::Tensor y = torch::relu(use_a ? a->forward(x) : b->forward(x));
    at::Tensor rows = torch::nonzero(y.sum(1) > 1.0).squeeze(1);  // dynamic: host sync, shape
    return head->forward(y.index_select(0, rows));
  };
  GraphedModule ga = volt::wrap_in_graph(
      *a, [&](const TensorList& in) { return TensorList{torch::relu(a->forward(in[0]))}; });
  GraphedModule gb = volt::wrap_in_graph(
      *b, [&](const TensorList& in) { return TensorList{torch::relu(b->forward(in[0]))}; });
  GraphedModule gh = volt::wrap_in_graph(
      *head, [&](const TensorList& in) { return TensorList{head->forward(in[0])}; },
      GraphOptions().max_graphs(4));
  torch::NoGradGuard no_grad;
  for (int k = 0; k < 6; ++k) {
    const at::Tensor x = torch::randn({32, 16}, kCuda);
    const bool use_a = k % 2 == 0;
    const at::Tensor y = (use_a ? ga : gb)({x})[0];                     // graphed branch
    const at::Tensor rows = torch::nonzero(y.sum(1) > 1.0).squeeze(1);  // eager dynamic op
    const at::Tensor out = gh({y.index_select(0, rows)})[0];            // graphed, per shape
    const at::Tensor ref = eager(x, use_a);
    ASSERT_EQ(out.sizes(), ref.sizes()) << "step " << k;
    EXPECT_TRUE(torch::equal(out, ref)) << "step " << k << ": " << max_diff(out, ref);
  }
  EXPECT_EQ(ga.stats().misses, 1);
  EXPECT_EQ(gb.stats().misses, 1);
  EXPECT_EQ(ga.stats().hits + gb.stats().hits, 4);
  EXPECT_GE(gh.stats().misses, 1);  // one graph per row count seen (at most 4 kept)
  EXPECT_LE(gh.size(), 4u);
}
