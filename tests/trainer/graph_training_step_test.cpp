// TrainerOptions::graph_training_step: Trainer.fit with the step replayed from CUDA graphs
// against the same fit run eagerly (same seed, data order and kernels, so bit for bit), the
// logged eager fallbacks with their reasons, and the optimizer state a checkpoint sees. The
// CUDA tests skip without a GPU; the fallback on a machine without one is tested everywhere.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <volt/volt.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "error_text.h"
#include "log_capture.h"
#include "precision/detail/quiet_dispatcher.h"
#include "tiny.h"

using volt_test::capture_logs;
using volt_test::error_of;

namespace {

// No dropout: the graphed and eager runs must launch the same kernels on the same values.
class GraphNet : public volt::Module {
 public:
  explicit GraphNet(std::string optimizer = "fused_adamw", bool host_sync = false,
                    bool per_step_schedule = false)
      : optimizer_(std::move(optimizer)),
        host_sync_(host_sync),
        per_step_schedule_(per_step_schedule) {
    torch::manual_seed(0);
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 2));
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto logits = fc2->forward(torch::relu(fc1->forward(b.input)));
    auto loss = torch::cross_entropy_loss(logits, b.target);
    if (host_sync_ && loss.item<float>() < 0) loss = loss * 2;  // a host read in the step
    log("train_loss", loss);
    log("train_acc", logits.argmax(1).eq(b.target).to(torch::kFloat).mean(),
        volt::LogOptions().on_step(false).on_epoch(true));
    return loss;
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    if (per_step_schedule_) {  // the lr decays at every step
      std::shared_ptr<torch::optim::Optimizer> opt;
      if (optimizer_ == "sgd") {
        opt = std::make_shared<torch::optim::SGD>(parameters(),
                                                  torch::optim::SGDOptions(0.1).momentum(0.9));
      } else {
        opt = std::make_shared<volt::FusedSGD>(parameters(),
                                               volt::FusedSGDOptions(0.1).momentum(0.9));
      }
      scheduled = opt;
      volt::OptimizerConfig c(opt);
      c.scheduler(std::make_shared<volt::ExponentialLR>(*opt, 0.9)).interval(volt::Interval::kStep);
      return {c};
    }
    if (optimizer_ == "sgd") {
      return {std::make_shared<torch::optim::SGD>(parameters(),
                                                  torch::optim::SGDOptions(0.1).momentum(0.9))};
    }
    if (optimizer_ == "adam") {
      return {std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-2))};
    }
    adamw = std::make_shared<volt::FusedAdamW>(parameters(), volt::FusedAdamWOptions(1e-2));
    return {adamw};
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  std::shared_ptr<volt::FusedAdamW> adamw;
  std::shared_ptr<torch::optim::Optimizer> scheduled;  // with the per-step schedule

 private:
  std::string optimizer_;
  bool host_sync_;
  bool per_step_schedule_;
};

struct FitResult {
  double last_lr = 0;
  std::vector<at::Tensor> params;
  std::vector<double> losses;  // train_loss as logged, step by step
  volt::Metrics metrics;
  std::vector<std::string> logs;
  int64_t global_step = 0;
};

FitResult fit(GraphNet& net, bool graphed, const std::string& accelerator, int64_t n = 160,
              c10::optional<double> clip_norm = c10::nullopt,
              const std::string& precision = "32-true",
              std::vector<std::shared_ptr<volt::Callback>> callbacks = {}) {
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  volt::TrainerOptions opts;
  if (clip_norm)
    opts.gradient_clip_val(*clip_norm).gradient_clip_algorithm(volt::ClipAlgorithm::kNorm);
  volt::Trainer trainer(opts.accelerator(accelerator)
                            .precision(precision)
                            .max_epochs(2)
                            .loggers({logger})
                            .log_every_n_steps(1)
                            .enable_checkpointing(false)
                            .enable_progress_bar(false)
                            .enable_model_summary(false)
                            .num_sanity_val_steps(0)
                            .callbacks(std::move(callbacks))
                            .graph_training_step(graphed)
                            .graph_options(volt::GraphOptions().warmup_iters(2)));
  auto dl = volt_test::loader(volt_test::blobs(n), 16, /*shuffle=*/true);
  FitResult r;
  r.logs = capture_logs([&] { trainer.fit(net, dl); });
  for (const auto& p : net.parameters()) r.params.push_back(p.detach().cpu().clone());
  for (const auto& rec : logger->with("train_loss"))
    r.losses.push_back(rec.second.at("train_loss"));
  r.metrics = trainer.callback_metrics();
  r.global_step = trainer.state().global_step;
  if (net.scheduled) r.last_lr = net.scheduled->param_groups().front().options().get_lr();
  return r;
}

size_t count_containing(const std::vector<std::string>& logs, const std::string& what) {
  size_t n = 0;
  for (const auto& l : logs) n += l.find(what) != std::string::npos;
  return n;
}

void expect_same_training(const FitResult& eager, const FitResult& graphed) {
  ASSERT_EQ(eager.params.size(), graphed.params.size());
  for (size_t i = 0; i < eager.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(eager.params[i], graphed.params[i]))
        << "parameter " << i << " max diff "
        << (eager.params[i] - graphed.params[i]).abs().max().item<double>();
  }
  EXPECT_EQ(eager.losses, graphed.losses);
  EXPECT_EQ(eager.global_step, graphed.global_step);
  ASSERT_TRUE(graphed.metrics.count("train_acc"));
  EXPECT_EQ(eager.metrics.at("train_acc"), graphed.metrics.at("train_acc"));
}

#define VOLT_REQUIRE_CUDA_GRAPHS()                                                          \
  do {                                                                                      \
    if (!volt::CudaGraph::available()) {                                                    \
      GTEST_SKIP() << "CUDA graphs unavailable: " << volt::CudaGraph::unavailable_reason(); \
    }                                                                                       \
  } while (0)

}  // namespace

TEST(GraphTrainingStep, OptionsValidateAndPrint) {
  const std::string e = error_of<volt::ConfigError>([] {
    volt::TrainerOptions().graph_options(volt::GraphOptions().warmup_iters(0)).validate();
  });
  EXPECT_NE(e.find("warmup_iters"), std::string::npos) << e;
  std::ostringstream os;
  os << volt::TrainerOptions().graph_training_step(true);
  EXPECT_NE(os.str().find("graph_training_step=1, graph_options=GraphOptions(warmup_iters=3"),
            std::string::npos)
      << os.str();
}

TEST(GraphTrainingStep, WhereItCannotCaptureItRunsEagerlyLoggedOnceWithTheReason) {
  // On the CPU (any machine): the reason is the missing GPU or the CPU parameters.
  GraphNet a, b;
  const FitResult eager = fit(a, false, "cpu");
  const FitResult graphed = fit(b, true, "cpu");
  EXPECT_EQ(count_containing(graphed.logs,
                             "graph_training_step: running the training step "
                             "eagerly"),
            1u);
  EXPECT_EQ(count_containing(eager.logs, "graph_training_step"), 0u);
  expect_same_training(eager, graphed);
  EXPECT_EQ(graphed.global_step, 20);
}

TEST(GraphTrainingStepCuda, EqualsEagerFitBitForBitWithFusedAdamW) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  GraphNet a, b;
  const FitResult eager = fit(a, false, "cuda");
  const FitResult graphed = fit(b, true, "cuda");
  EXPECT_EQ(count_containing(graphed.logs, "running the training step eagerly"), 0u)
      << ::testing::PrintToString(graphed.logs);
  EXPECT_EQ(count_containing(graphed.logs, "graph_training_step: captured the step"), 1u);
  expect_same_training(eager, graphed);
  // The replays advanced FusedAdamW's step counts on the device; fit's end read them back.
  ASSERT_TRUE(b.adamw);
  for (const auto& kv : b.adamw->state()) {
    EXPECT_EQ(static_cast<volt::FusedAdamWParamState&>(*kv.second).step(), 20);
  }
}

TEST(GraphTrainingStepCuda, ARaggedLastBatchGetsItsOwnGraph) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  GraphNet a("sgd"), b("sgd");
  const FitResult eager = fit(a, false, "cuda", /*n=*/150);  // 9 batches of 16, one of 6
  const FitResult graphed = fit(b, true, "cuda", 150);
  EXPECT_EQ(count_containing(graphed.logs, "graph_training_step: captured the step"), 2u)
      << ::testing::PrintToString(graphed.logs);
  expect_same_training(eager, graphed);
}

// Clipping by norm is captured with the step: the norm and the coefficient stay on the device
// (FusedClipNorm's CUDA path), so nothing falls back; the clip is real (SGD, whose step scales
// with the gradient, ends elsewhere without it).
TEST(GraphTrainingStepCuda, ClippingByNormIsCapturedAndEqualsEagerFit) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  GraphNet a("sgd"), b("sgd"), c("sgd");
  const FitResult eager = fit(a, false, "cuda", 160, 0.05);
  const FitResult graphed = fit(b, true, "cuda", 160, 0.05);
  EXPECT_EQ(count_containing(graphed.logs, "running the training step eagerly"), 0u)
      << ::testing::PrintToString(graphed.logs);
  EXPECT_EQ(count_containing(graphed.logs, "graph_training_step: captured the step"), 1u);
  expect_same_training(eager, graphed);
  const FitResult unclipped = fit(c, true, "cuda");
  EXPECT_FALSE(torch::equal(unclipped.params.front(), graphed.params.front()));
}

// A per-step schedule (the lr changes at every step): volt's fused optimizers read the lr from
// a device scalar written before each replay, so the step is captured once and each replay
// uses its own step's lr. Bitwise the eager fit, which itself follows torch::optim::SGD under
// the same schedule (to float32 rounding of the lr).
TEST(GraphTrainingStepCuda, APerStepScheduleIsReadFromTheDeviceWithoutCapturingAgain) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  GraphNet a("fused_sgd", false, true), b("fused_sgd", false, true), ref("sgd", false, true);
  const FitResult eager = fit(a, false, "cuda");
  const FitResult graphed = fit(b, true, "cuda");
  const FitResult reference = fit(ref, false, "cuda");
  EXPECT_EQ(count_containing(graphed.logs, "running the training step eagerly"), 0u)
      << ::testing::PrintToString(graphed.logs);
  EXPECT_EQ(count_containing(graphed.logs, "capturing again"), 0u);
  EXPECT_EQ(count_containing(graphed.logs, "graph_training_step: captured the step"), 1u);
  expect_same_training(eager, graphed);
  EXPECT_NEAR(graphed.last_lr, 0.1 * std::pow(0.9, 20), 1e-12);
  for (size_t i = 0; i < eager.params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(eager.params[i], reference.params[i], 1e-4, 1e-5))
        << "parameter " << i << " max diff "
        << (eager.params[i] - reference.params[i]).abs().max().item<double>();
  }
}

// bf16 autocast and bf16 weights are captured with the step: autocast's cast cache is filled
// and cleared inside the captured forward, so each replay casts the weights the last replay
// updated. Bitwise the eager fit, and not the fp32 one (the precision is really applied).
TEST(GraphTrainingStepCuda, Bf16PrecisionsAreCapturedAndEqualEagerFit) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  GraphNet fp32;
  const FitResult full = fit(fp32, true, "cuda");
  for (const std::string precision : {"bf16-mixed", "bf16-true"}) {
    SCOPED_TRACE(precision);
    GraphNet a, b;
    const FitResult eager = fit(a, false, "cuda", 160, c10::nullopt, precision);
    const FitResult graphed = fit(b, true, "cuda", 160, c10::nullopt, precision);
    EXPECT_EQ(count_containing(graphed.logs, "running the training step eagerly"), 0u)
        << ::testing::PrintToString(graphed.logs);
    EXPECT_EQ(count_containing(graphed.logs, "graph_training_step: captured the step"), 1u);
    expect_same_training(eager, graphed);
    EXPECT_NE(graphed.losses, full.losses);
  }
}

// fp16 with loss scaling skips a step on inf/NaN gradients, decided on the host: the step runs
// eagerly, said once, and trains exactly as without the option.
TEST(GraphTrainingStepCuda, LossScalingRunsEagerlyWithTheReason) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  GraphNet a, b;
  const FitResult eager = fit(a, false, "cuda", 160, c10::nullopt, "16-mixed");
  const FitResult graphed = fit(b, true, "cuda", 160, c10::nullopt, "16-mixed");
  EXPECT_EQ(count_containing(graphed.logs, "with loss scaling (the scaler reads found_inf"), 1u)
      << ::testing::PrintToString(graphed.logs);
  expect_same_training(eager, graphed);
}

TEST(GraphTrainingStepCuda, AHostSyncInTheStepFallsBackToEagerOnce) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  GraphNet a("fused_adamw", true), b("fused_adamw", true);
  const FitResult eager = fit(a, false, "cuda");
  const FitResult graphed = fit(b, true, "cuda");
  ASSERT_EQ(count_containing(graphed.logs, "running the training step eagerly"), 1u)
      << ::testing::PrintToString(graphed.logs);
  EXPECT_EQ(count_containing(graphed.logs, "synchronised with the host"), 1u);
  // The failed capture changed nothing: the same training as eager, step counts included.
  expect_same_training(eager, graphed);
  for (const auto& kv : b.adamw->state()) {
    EXPECT_EQ(static_cast<volt::FusedAdamWParamState&>(*kv.second).step(), 20);
  }
}

TEST(GraphTrainingStepCuda, AnOptimizerWithHostStateRunsEagerly) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  GraphNet a("adam"), b("adam");
  const FitResult eager = fit(a, false, "cuda");
  const FitResult graphed = fit(b, true, "cuda");
  EXPECT_EQ(count_containing(graphed.logs, "keeps state a graph cannot advance"), 1u)
      << ::testing::PrintToString(graphed.logs);
  expect_same_training(eager, graphed);
}

namespace {

// libtorch's warnings (TORCH_WARN) raised in this thread while it is installed; autograd
// replays the warnings of its device threads in the thread that called backward.
class WarningRecorder : public volt::detail::WarningSink {
 public:
  void take(const std::string& msg) override { messages.push_back(msg); }
  std::vector<std::string> messages;
};

// The reference's HPUGraphsModel inside a Trainer, with manual optimization: kWarmup eager
// steps on the side stream, then forward, backward and the optimizer step captured on the next
// batch; from then on each batch is copied into the static inputs, the graph replayed and the
// step counted (ManualOptimizer::count_step). graphed=false runs every step eagerly.
class HpuGraphsStyleNet : public volt::Module {
 public:
  static constexpr int kWarmup = 3;
  explicit HpuGraphsStyleNet(bool graphed) : graphed_(graphed) {
    set_automatic_optimization(false);
    torch::manual_seed(0);
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 2));
  }
  at::Tensor loss_of(const at::Tensor& x, const at::Tensor& y) {
    return torch::cross_entropy_loss(fc2->forward(torch::relu(fc1->forward(x))), y);
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto opt = optimizers().at(0);
    if (!graphed_ || warm_ < kWarmup) {
      // As the reference's model: the static loss holds the last eager step's autograd graph
      // (and so its gradient accumulators) until the capture replaces it.
      auto eager_step = [&] {
        opt.zero_grad();
        static_loss_ = loss_of(b.input, b.target);
        manual_backward(static_loss_);
        opt.step();
        losses.push_back(static_loss_.detach().clone());
      };
      if (graphed_) {
        volt::run_on_side_stream(eager_step, 1);
        ++warm_;
      } else {
        eager_step();
      }
      return {};
    }
    if (!graph_) {
      static_x_ = b.input.clone();
      static_y_ = b.target.clone();
      opt.zero_grad();  // the graph allocates the gradients in its pool
      graph_ = std::make_unique<volt::CudaGraph>("manual_step");
      graph_->capture([&] {
        static_loss_ = loss_of(static_x_, static_y_);
        static_loss_.backward();
        opt.optimizer().step();
      });
    }
    static_x_.copy_(b.input);
    static_y_.copy_(b.target);
    graph_->replay();
    opt.count_step();
    losses.push_back(static_loss_.detach().clone());
    return {};
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {std::make_shared<torch::optim::SGD>(parameters(),
                                                torch::optim::SGDOptions(0.1).momentum(0.9))};
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  std::vector<at::Tensor> losses;
  std::unique_ptr<volt::CudaGraph> graph_;

 private:
  bool graphed_;
  int warm_ = 0;
  at::Tensor static_x_, static_y_, static_loss_;
};

}  // namespace

TEST(GraphTrainingStepCuda, ManualOptimizationCapturedByTheModuleEqualsEagerFit) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  auto run = [](HpuGraphsStyleNet& net) {
    volt::Trainer trainer(volt::TrainerOptions()
                              .accelerator("cuda")
                              .max_epochs(2)
                              .enable_checkpointing(false)
                              .enable_progress_bar(false)
                              .enable_model_summary(false)
                              .num_sanity_val_steps(0));
    trainer.fit(net, volt_test::loader(volt_test::blobs(160), 16, /*shuffle=*/false));
    return trainer.state().global_step;
  };
  HpuGraphsStyleNet eager(false), graphed(true);
  EXPECT_EQ(run(eager), 20);
  WarningRecorder warnings;
  int64_t steps = 0;
  {
    volt::detail::WarningHandlerGuard guard(&warnings);
    steps = run(graphed);
  }
  EXPECT_EQ(steps, 20);  // 3 eager steps and 17 replays, each counted
  ASSERT_TRUE(graphed.graph_ && graphed.graph_->captured());
  EXPECT_EQ(graphed.graph_->replays(), 20 - HpuGraphsStyleNet::kWarmup);
  ASSERT_EQ(eager.losses.size(), graphed.losses.size());
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_EQ(eager.losses[i].item<float>(), graphed.losses[i].item<float>()) << "step " << i;
  }
  const auto pe = eager.parameters(), pg = graphed.parameters();
  for (size_t i = 0; i < pe.size(); ++i) {
    EXPECT_TRUE(torch::equal(pe[i], pg[i]))
        << "parameter " << i << " max diff " << (pe[i] - pg[i]).abs().max().item<double>();
  }
  // Warm-up and capture share one stream, so torch 2.x's "AccumulateGrad node's stream does
  // not match" warning (seen before the warm-up moved onto the capture stream) is not raised.
  for (const std::string& w : warnings.messages) {
    EXPECT_EQ(w.find("AccumulateGrad"), std::string::npos) << w;
  }
}

namespace {

// What on_before_zero_grad saw at every step: the step's gradient of fc2's weight and the
// stepped weight (read on the host, outside any capture).
class ZeroGradWatcher : public volt::Callback {
 public:
  std::string state_key() const override { return "ZeroGradWatcher"; }
  void on_before_zero_grad(volt::RunContext&, volt::Module& m, torch::optim::Optimizer&) override {
    const auto& net = static_cast<GraphNet&>(m);
    grads.push_back(net.fc2->weight.grad().detach().cpu().clone());
    weights.push_back(net.fc2->weight.detach().cpu().clone());
  }
  std::vector<at::Tensor> grads, weights;
};

// Freezes fc1 when the second epoch starts (as BaseFinetuning would).
class FreezeFc1AtSecondEpoch : public volt::Callback {
 public:
  std::string state_key() const override { return "FreezeFc1AtSecondEpoch"; }
  void on_train_epoch_start(volt::RunContext& run, volt::Module& m) override {
    if (run.state().epoch != 1) return;
    for (auto& p : static_cast<GraphNet&>(m).fc1->parameters()) p.requires_grad_(false);
  }
};

// A learning-rate warm-up in optimizer_step: an override a replay cannot repeat.
class WarmupNet : public GraphNet {
 public:
  void optimizer_step(int64_t, int64_t, torch::optim::Optimizer& opt,
                      const std::function<bool()>& step) override {
    const double scale = std::min(1.0, static_cast<double>(++calls_) / 10.0);
    for (auto& g : opt.param_groups()) g.options().set_lr(1e-2 * scale);
    step();
  }

 private:
  int64_t calls_ = 0;
};

}  // namespace

// on_before_zero_grad runs after every replayed step (outside the graph, as in an eager step),
// seeing that step's gradients and updated weights: the same values, step for step, as eager.
TEST(GraphTrainingStepCuda, OnBeforeZeroGradRunsAfterEveryReplayWithItsGradients) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  auto eager_watch = std::make_shared<ZeroGradWatcher>();
  auto graphed_watch = std::make_shared<ZeroGradWatcher>();
  GraphNet a, b;
  const FitResult eager = fit(a, false, "cuda", 160, c10::nullopt, "32-true", {eager_watch});
  const FitResult graphed = fit(b, true, "cuda", 160, c10::nullopt, "32-true", {graphed_watch});
  EXPECT_EQ(count_containing(graphed.logs, "graph_training_step: captured the step"), 1u)
      << ::testing::PrintToString(graphed.logs);
  expect_same_training(eager, graphed);
  ASSERT_EQ(eager_watch->grads.size(), 20u);
  ASSERT_EQ(graphed_watch->grads.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_TRUE(torch::equal(eager_watch->grads[i], graphed_watch->grads[i])) << "step " << i;
    EXPECT_TRUE(torch::equal(eager_watch->weights[i], graphed_watch->weights[i])) << "step " << i;
  }
}

// A module overriding optimizer_step (a warm-up that changes the lr at each step) runs eagerly,
// said once with the override's name, and trains exactly as the eager fit.
TEST(GraphTrainingStepCuda, AnOverriddenOptimizerStepRunsEagerlyWithTheReason) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  WarmupNet a, b;
  const FitResult eager = fit(a, false, "cuda");
  const FitResult graphed = fit(b, true, "cuda");
  EXPECT_EQ(count_containing(graphed.logs, "the module overrides optimizer_step"), 1u)
      << ::testing::PrintToString(graphed.logs);
  EXPECT_EQ(count_containing(graphed.logs, "running the training step eagerly"), 1u);
  expect_same_training(eager, graphed);
}

// Freezing a layer between epochs changes the set of gradients the captured backward writes:
// the rest of the fit runs eagerly, said once, and trains exactly as the eager fit (the frozen
// layer stays where the first epoch left it).
TEST(GraphTrainingStepCuda, FreezingALayerDuringFitRunsTheRestEagerly) {
  VOLT_REQUIRE_CUDA_GRAPHS();
  GraphNet a, b;
  const FitResult eager = fit(a, false, "cuda", 160, c10::nullopt, "32-true",
                              {std::make_shared<FreezeFc1AtSecondEpoch>()});
  const FitResult graphed = fit(b, true, "cuda", 160, c10::nullopt, "32-true",
                                {std::make_shared<FreezeFc1AtSecondEpoch>()});
  EXPECT_EQ(count_containing(graphed.logs, "graph_training_step: captured the step"), 1u)
      << ::testing::PrintToString(graphed.logs);
  EXPECT_EQ(
      count_containing(graphed.logs, "the parameters that require a gradient changed during fit"),
      1u)
      << ::testing::PrintToString(graphed.logs);
  expect_same_training(eager, graphed);
}
