// TrainerOptions::trace_training_step: fits whose training_step is traced and replayed with its
// elementwise chains fused, against the same fits run eagerly (weights and every logged value);
// a ragged last batch with its own trace; what cannot be traced running eagerly with the reason
// logged (host reads, numbers logged, skipped batches, manual optimization, a kernel filling
// memory outside libtorch's ops; branches on batch_idx or the epoch and names logged by batch,
// found by the checked steps), volt's own fused kernels traced through their references; the
// exclusion of graph_training_step. Each test runs in its own process with a private
// KernelCache folder.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "error_text.h"
#include "log_capture.h"
#include "manual_module.h"
#include "scoped_env.h"
#include "tiny.h"
#include "volt/kernels/kernel_cache.h"

namespace {

using volt_test::capture_logs;
using volt_test::has;

struct TraceStep : ::testing::Test {
  // The cache writes in the background: let it finish before the folder is removed.
  ~TraceStep() override { volt::KernelCache::global().flush(); }
  volt_test::TempDir dir;
  volt_test::ScopedEnv env{"VOLT_KERNEL_CACHE_CONFIG", dir.path + "/kernels,false,64"};
};

// GELU(tanh) written as libtorch ops (an 11-op elementwise chain a trace fuses) between the
// tiny classifier's layers, dropout included; logs the loss and the activations' mean.
class GeluNet : public volt_test::TinyClassifier {
 public:
  at::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto h = fc1->forward(b.input);
    h = 0.5 * h * (1.0 + torch::tanh(0.7978845608028654 * (h + 0.044715 * h * h * h)));
    const auto loss = torch::cross_entropy_loss(fc2->forward(drop->forward(h)), b.target);
    log("train_loss", loss, volt::LogOptions().prog_bar(true));
    log("act_mean", h.mean().detach(), volt::LogOptions().on_epoch(true));
    return loss;
  }
};

struct FitResult {
  at::Tensor weights;
  std::map<std::string, std::vector<double>> logged;  // per name, in step order
  std::vector<std::string> lines;                     // what volt logged
};

template <typename Net>
FitResult fit(const std::string& root, bool traced, int64_t samples = 128,
              std::function<void(Net&)> setup = nullptr,
              volt::Spec<volt::Precision> precision = "32-true") {
  Net net;
  torch::manual_seed(3);
  for (auto& p : net.parameters()) p.data().uniform_(-0.5, 0.5);
  if (setup) setup(net);
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  FitResult out;
  out.lines = capture_logs([&] {
    volt::Trainer trainer(volt_test::quiet(root)
                              .max_epochs(2)
                              .log_every_n_steps(1)
                              .loggers({logger})
                              .precision(precision)
                              .trace_training_step(traced));
    trainer.fit(net, volt_test::loader(volt_test::blobs(samples)));
  });
  out.weights = net.flat_params();
  for (const auto& r : logger->records) {
    for (const auto& kv : r.second) out.logged[kv.first].push_back(kv.second);
  }
  return out;
}

int count(const std::vector<std::string>& lines, const std::string& phrase) {
  int n = 0;
  for (const auto& l : lines) n += has(l, phrase) ? 1 : 0;
  return n;
}

void expect_logged_equal(const FitResult& a, const FitResult& b, const std::string& name,
                         double tol) {
  ASSERT_TRUE(a.logged.count(name)) << name;
  ASSERT_TRUE(b.logged.count(name)) << name;
  const auto& x = a.logged.at(name);
  const auto& y = b.logged.at(name);
  ASSERT_EQ(x.size(), y.size()) << name;
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(x[i], y[i], tol * (1 + std::abs(y[i]))) << name << " at record " << i;
  }
}

TEST_F(TraceStep, ATracedFitMatchesTheEagerFitWithEveryLoggedValue) {
  const FitResult eager = fit<GeluNet>(dir / "eager", false);
  const FitResult traced = fit<GeluNet>(dir / "traced", true);
  // Batches of 16 from 128 samples: one signature, traced once, with the GELU chain fused.
  EXPECT_EQ(count(traced.lines, "trace of 'training_step'"), 1);
  EXPECT_TRUE(has(traced.lines, "fused chain")) << "no fused chain reported";
  EXPECT_FALSE(has(traced.lines, "running training_step eagerly"));
  EXPECT_FALSE(has(eager.lines, "trace of 'training_step'"));
  // The same ops and dropout masks but GELU's tanh (a few ulp) over 16 SGD steps.
  EXPECT_LT((eager.weights - traced.weights).abs().max().item<double>(), 1e-4);
  // Every step's values, logged from the replays' outputs.
  ASSERT_EQ(traced.logged.at("train_loss").size(), 16u);
  expect_logged_equal(traced, eager, "train_loss", 1e-5);
  expect_logged_equal(traced, eager, "act_mean_step", 1e-5);
  expect_logged_equal(traced, eager, "act_mean_epoch", 1e-5);  // the epoch mean of the replays'
  ASSERT_EQ(traced.logged.at("act_mean_epoch").size(), 2u);
  // The values change from step to step: a replay logs what it computed, not the trace's.
  const auto& acts = traced.logged.at("act_mean_step");
  EXPECT_NE(acts.front(), acts.back());
}

TEST_F(TraceStep, UnderBf16MixedATracedFitMatchesTheEagerFit) {
  // Autocast runs above the tracer: its casts to bfloat16 are recorded as ops of the trace and
  // the matmuls see bfloat16 inputs, so a replay (under autocast again) computes what the eager
  // step does. The GELU chain runs in bfloat16 here, which the fuser leaves to libtorch. (Every
  // linear in bfloat16: this CPU's probe would keep them in fp32.)
  const auto bf16 = [] {
    return std::make_shared<volt::MixedPrecision>(volt::MixedPrecisionOptions().cpu_policy(false));
  };
  const FitResult eager = fit<GeluNet>(dir / "eager", false, 128, nullptr, bf16());
  const FitResult traced = fit<GeluNet>(dir / "traced", true, 128, nullptr, bf16());
  EXPECT_EQ(count(traced.lines, "trace of 'training_step'"), 1);
  EXPECT_FALSE(has(traced.lines, "running training_step eagerly"));
  EXPECT_LT((eager.weights - traced.weights).abs().max().item<double>(), 1e-6);
  expect_logged_equal(traced, eager, "train_loss", 1e-6);
  expect_logged_equal(traced, eager, "act_mean_step", 1e-6);
  // And it is bfloat16 training: the fp32 fit differs by more than float32's rounding.
  const FitResult fp32 = fit<GeluNet>(dir / "fp32", false);
  EXPECT_GT((eager.weights - fp32.weights).abs().max().item<double>(), 1e-4);
}

TEST_F(TraceStep, ARaggedLastBatchGetsItsOwnTrace) {
  // 120 samples: 7 batches of 16 and one of 8 per epoch, two signatures.
  const FitResult eager = fit<GeluNet>(dir / "eager", false, 120);
  const FitResult traced = fit<GeluNet>(dir / "traced", true, 120);
  EXPECT_EQ(count(traced.lines, "trace of 'training_step'"), 2);
  EXPECT_TRUE(has(traced.lines, "Float[8, 8]")) << "no trace for the batch of 8";
  EXPECT_LT((eager.weights - traced.weights).abs().max().item<double>(), 1e-4);
  expect_logged_equal(traced, eager, "train_loss", 1e-5);
}

// Without dropout: a step traced and then run eagerly draws no random numbers twice, so the
// fallback's fit equals the eager fit bit for bit.
class PlainNet : public volt_test::TinyClassifier {
 public:
  PlainNet() { drop->options.p(0.0); }
  at::Tensor training_step(const volt::Batch& b, int64_t batch_idx) override {
    const auto logits = forward(b.input);
    auto loss = torch::cross_entropy_loss(logits, b.target);
    if (host_read && loss.item<double>() > 1e9) loss = loss * 0;
    if (log_number) log("lr", 0.1);
    if (skip_first && batch_idx == 0) return {};
    if (branch_on_batch && batch_idx % 2 == 1) loss = loss * 0.5;
    if (branch_on_epoch && current_epoch() >= 1) loss = loss * 0.5;
    if (branch_on_step && global_step() >= 10) loss = loss * 0.5;
    if (unfilled) {
      // A "kernel" writing its result through a data pointer, as custom CPU code does.
      at::Tensor out = at::empty_like(logits);
      const at::Tensor src = logits.detach().contiguous();
      std::copy(src.data_ptr<float>(), src.data_ptr<float>() + src.numel(), out.data_ptr<float>());
      loss = loss + 0 * out.sum();
    }
    log("train_loss", loss);
    if (name_by_batch) log(batch_idx % 2 == 0 ? "even_loss" : "odd_loss", loss);
    return loss;
  }
  bool host_read = false, log_number = false, skip_first = false, unfilled = false;
  bool branch_on_batch = false, branch_on_epoch = false, branch_on_step = false;
  bool name_by_batch = false;
};

void expect_eager_fallback(const std::string& root, std::function<void(PlainNet&)> setup,
                           const std::string& reason) {
  const FitResult eager = fit<PlainNet>(root + "/eager", false, 128, setup);
  const FitResult traced = fit<PlainNet>(root + "/traced", true, 128, setup);
  EXPECT_EQ(count(traced.lines, "trace_training_step: running training_step eagerly"), 1) << reason;
  EXPECT_TRUE(has(traced.lines, reason)) << "expected the reason: " << reason;
  EXPECT_TRUE(torch::equal(eager.weights, traced.weights)) << reason;
  EXPECT_EQ(eager.logged.at("train_loss"), traced.logged.at("train_loss")) << reason;
}

TEST_F(TraceStep, AHostReadInTrainingStepRunsItEagerlyNamingTheRead) {
  expect_eager_fallback(
      dir.path, [](PlainNet& n) { n.host_read = true; },
      "read a tensor's value on the host while traced (aten::_local_scalar_dense: item(), "
      "float() or bool() of a tensor)");
}

TEST_F(TraceStep, ANumberLoggedInTrainingStepRunsItEagerly) {
  expect_eager_fallback(
      dir.path, [](PlainNet& n) { n.log_number = true; },
      "log(\"lr\", number) while the step is traced");
}

TEST_F(TraceStep, ASkippedBatchRunsTheStepEagerly) {
  expect_eager_fallback(
      dir.path, [](PlainNet& n) { n.skip_first = true; }, "a skipped batch");
}

TEST_F(TraceStep, MemoryFilledOutsideLibtorchsOpsRunsTheStepEagerly) {
  expect_eager_fallback(
      dir.path, [](PlainNet& n) { n.unfilled = true; },
      "reads a tensor made by aten::empty_like that no recorded op wrote");
}

// A step whose ops depend on batch_idx or the epoch would be replayed with the traced step's
// choice: the step after the trace and each epoch's first step run it under the tracer again,
// and a difference turns the step eager, from that step on (so the fit equals the eager one).
TEST_F(TraceStep, ABranchOnBatchIdxIsFoundAtTheStepAfterTheTrace) {
  expect_eager_fallback(
      dir.path, [](PlainNet& n) { n.branch_on_batch = true; },
      "ran other ops on a later call with the same input signature than when it was traced: "
      "op ");
  const FitResult traced =
      fit<PlainNet>(dir / "again", true, 128, [](PlainNet& n) { n.branch_on_batch = true; });
  EXPECT_TRUE(has(traced.lines, "(at epoch 0, batch_idx 1)"));
  EXPECT_TRUE(has(traced.lines, "aten::mul(")) << "the differing op is named";
}

// With dropout: the step whose check failed runs again eagerly from the random state it started
// with, so the fit still equals the eager fit bit for bit.
class DropoutBranchNet : public GeluNet {
 public:
  at::Tensor training_step(const volt::Batch& b, int64_t batch_idx) override {
    const at::Tensor loss = GeluNet::training_step(b, batch_idx);
    return batch_idx % 2 == 1 ? loss * 0.5 : loss;
  }
};

TEST_F(TraceStep, AFallbackStepDrawsTheRandomNumbersTheEagerStepDraws) {
  const FitResult eager = fit<DropoutBranchNet>(dir / "eager", false);
  const FitResult traced = fit<DropoutBranchNet>(dir / "traced", true);
  EXPECT_EQ(count(traced.lines, "running training_step eagerly"), 1);
  EXPECT_TRUE(has(traced.lines, "(at epoch 0, batch_idx 1)"));
  EXPECT_TRUE(torch::equal(eager.weights, traced.weights));
  EXPECT_EQ(eager.logged.at("train_loss"), traced.logged.at("train_loss"));
}

TEST_F(TraceStep, ABranchOnTheEpochIsFoundAtTheEpochsFirstStep) {
  expect_eager_fallback(
      dir.path, [](PlainNet& n) { n.branch_on_epoch = true; },
      "ran other ops on a later call with the same input signature than when it was traced");
  const FitResult traced =
      fit<PlainNet>(dir / "again", true, 128, [](PlainNet& n) { n.branch_on_epoch = true; });
  // Found at epoch 1's first step, after epoch 0's replays (which took the same branch there).
  EXPECT_TRUE(has(traced.lines,
                  "(at epoch 1, batch_idx 0; the 6 steps of this batch signature since its last "
                  "check (epoch 0, batch_idx 1) replayed the trace"));
}

TEST_F(TraceStep, ABranchOnTheStepCountIsFoundAtTheNextPowerOfTwo) {
  // Traced steps 2 (after the trace), 9 (epoch 1's first), 16, 32, ... are checked: a branch
  // from global_step 10 on (the 11th step) is found at the 16th, after five stale replays,
  // which the warning counts with the one before them (steps 10-15 since the check at the 9th).
  const FitResult traced =
      fit<PlainNet>(dir / "traced", true, 128, [](PlainNet& n) { n.branch_on_step = true; });
  EXPECT_EQ(count(traced.lines, "running training_step eagerly"), 1);
  EXPECT_TRUE(has(traced.lines,
                  "(at epoch 1, batch_idx 7; the 6 steps of this batch signature since its last "
                  "check (epoch 1, batch_idx 0) replayed the trace and may have repeated its "
                  "choices)"));
}

TEST_F(TraceStep, NamesLoggedByBatchIdxAreFoundAtTheStepAfterTheTrace) {
  // The same ops, but a replay would log every step's value under the traced step's name.
  const auto odd_even = [](PlainNet& n) { n.name_by_batch = true; };
  expect_eager_fallback(dir.path, odd_even,
                        "training_step logged other names or options on a later call than when "
                        "it was traced (train_loss, even_loss at the trace; train_loss, odd_loss "
                        "now)");
  const FitResult eager = fit<PlainNet>(dir / "eager2", false, 128, odd_even);
  const FitResult traced = fit<PlainNet>(dir / "traced2", true, 128, odd_even);
  EXPECT_EQ(traced.logged.at("odd_loss"), eager.logged.at("odd_loss"));
  EXPECT_EQ(traced.logged.at("even_loss"), eager.logged.at("even_loss"));
}

// Seeded batches that change from batch to batch. `ragged`: every batch a different number of
// rows (as sequences of varying length give), a new signature each step; after as many traces
// were dropped as are kept (8) the step runs eagerly. `extra_kinds` > 0: batches of 4 rows with
// an extra tensor "extra<k>" (k = batch index % extra_kinds, one the step does not read), so a
// fit sees that many batch layouts.
class ChangingBatches : public volt::Dataset {
 public:
  ChangingBatches(int64_t size, bool ragged, int64_t extra_kinds = 0)
      : size_(size), ragged_(ragged), kinds_(extra_kinds) {}
  int64_t size() const override { return size_; }
  volt::Example get(int64_t) const override {
    throw std::logic_error("ChangingBatches collates its own batches");
  }
  c10::optional<volt::Batch> get_batch(const std::vector<int64_t>& indices) const override {
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(indices.front()));
    const int64_t rows = ragged_ ? 1 + indices.front() : static_cast<int64_t>(indices.size());
    volt::Batch b;
    b.input = at::randn({rows, 8}, gen);
    b.target = (b.input.sum(1) > 0).to(torch::kLong);
    if (kinds_ > 0) b.extra["extra" + std::to_string(indices.front() / 4 % kinds_)] = b.input * 2;
    return b;
  }

 private:
  int64_t size_;
  bool ragged_;
  int64_t kinds_;
};

// A PlainNet (weights drawn from seed 3) fitted on `data` in order, traced or eagerly.
FitResult fit_in_order(const std::string& root, bool traced, int64_t epochs,
                       std::shared_ptr<volt::Dataset> data, int64_t batch) {
  PlainNet net;
  torch::manual_seed(3);
  for (auto& p : net.parameters()) p.data().uniform_(-0.5, 0.5);
  FitResult out;
  out.lines = capture_logs([&] {
    volt::Trainer trainer(volt_test::quiet(root).max_epochs(epochs).trace_training_step(traced));
    trainer.fit(net,
                volt::DataLoader(std::move(data), volt::DataLoaderOptions(batch).shuffle(false)));
  });
  out.weights = net.flat_params();
  return out;
}

TEST_F(TraceStep, EachBatchLayoutIsTracedUpToFourThenTheStepRunsEagerly) {
  // 12 batches of 4 with 3 (then 5) layouts, each layout with its own trace; a fifth layout
  // turns the step eager, naming the layouts. Both fits end where the eager fit ends.
  for (int64_t kinds : {3, 5}) {
    auto data = std::make_shared<ChangingBatches>(48, /*ragged=*/false, kinds);
    const FitResult eager = fit_in_order(dir.path, false, 2, data, 4);
    const FitResult traced = fit_in_order(dir.path, true, 2, data, 4);
    EXPECT_EQ(count(traced.lines, "trace of 'training_step'"), kinds == 3 ? 3 : 4);
    EXPECT_EQ(count(traced.lines,
                    "running training_step eagerly: the batches came in more than 4 layouts "
                    "(which tensors they hold): (input target extra0), (input target extra1), "
                    "(input target extra2), (input target extra3) and now (input target extra4)"),
              kinds == 3 ? 0 : 1);
    EXPECT_LT((eager.weights - traced.weights).abs().max().item<double>(), 1e-5) << kinds;
  }
}

TEST_F(TraceStep, ASignatureThatKeepsChangingTurnsTheStepEager) {
  auto data = std::make_shared<ChangingBatches>(40, /*ragged=*/true);
  const FitResult eager = fit_in_order(dir.path, false, 1, data, 1);
  const FitResult traced = fit_in_order(dir.path, true, 1, data, 1);
  EXPECT_EQ(count(traced.lines, "trace of 'training_step'"), 16);
  EXPECT_EQ(count(traced.lines,
                  "running training_step eagerly: the batch's signature changed 16 "
                  "times, more than the 8 traces kept"),
            1);
  EXPECT_LT((eager.weights - traced.weights).abs().max().item<double>(), 1e-5);
}

TEST_F(TraceStep, ManualOptimizationRunsEagerlyWithTheReason) {
  volt_test::ManualTinyClassifier net;
  const auto lines = capture_logs([&] {
    volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1).trace_training_step(true));
    trainer.fit(net, volt_test::loader(volt_test::blobs(64)));
  });
  EXPECT_EQ(count(lines, "running training_step eagerly: manual optimization"), 1);
  EXPECT_FALSE(has(lines, "trace of 'training_step'"));
}

// volt's fused kernels inside a traced training_step run their reference compositions while
// traced (their loops write memory a trace cannot see), and the replays match the eager fit,
// where the kernels themselves run.
class FusedKernelNet : public volt_test::TinyClassifier {
 public:
  FusedKernelNet() { drop->options.p(0.0); }
  at::Tensor training_step(const volt::Batch& b, int64_t) override {
    const auto h =
        volt::fused_linear_activation(b.input, fc1->weight, fc1->bias, volt::Activation::kGeluTanh);
    const auto loss = volt::fused_linear_cross_entropy(h, fc2->weight, fc2->bias, b.target);
    log("train_loss", loss);
    return loss;
  }
};

TEST_F(TraceStep, VoltsFusedKernelsAreTracedThroughTheirReferences) {
  const FitResult eager = fit<FusedKernelNet>(dir / "eager", false);
  const FitResult traced = fit<FusedKernelNet>(dir / "traced", true);
  EXPECT_EQ(count(traced.lines, "trace of 'training_step'"), 1);
  EXPECT_FALSE(has(traced.lines, "running training_step eagerly"));
  EXPECT_FALSE(has(traced.lines, "using the reference composition"));  // no fallback warning
  EXPECT_LT((eager.weights - traced.weights).abs().max().item<double>(), 1e-4);
  expect_logged_equal(traced, eager, "train_loss", 1e-5);
}

TEST_F(TraceStep, GraphAndTraceTogetherAreAConfigError) {
  const std::string e = volt_test::error_of<volt::ConfigError>([&] {
    volt::Trainer trainer(
        volt_test::quiet(dir.path).graph_training_step(true).trace_training_step(true));
  });
  EXPECT_TRUE(has(e, "graph_training_step and trace_training_step are both set")) << e;
  EXPECT_TRUE(has(e, "choose one")) << e;
}

}  // namespace
