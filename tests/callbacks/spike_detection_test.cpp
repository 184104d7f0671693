// SpikeDetection (Lightning's): a training loss far above its running mean ends the fit with
// TrainingSpikeError on every rank at the same batch and leaves the batches to skip in a JSON
// file; drops, warm-up batches and (optionally) non-finite losses are not spikes; its state
// resumes; bad options are ConfigErrors. The losses are scripted values added to a real
// module's output, so each test knows exactly which batch must spike.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <volt/volt.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "error_text.h"
#include "file_text.h"
#include "log_capture.h"
#include "requires.h"
#include "tiny.h"
#include "training_jobs.h"

namespace {

using volt_test::file_text;

using volt_test::quiet;

constexpr int64_t kPerEpoch = 8;  // 64 samples, batch 8

// A linear model whose loss is a scripted value (by the fit's batch number: epoch × 8 + batch)
// plus 0 × its output, so that backward and the optimizer run as usual.
class Scripted : public volt::Module {
 public:
  explicit Scripted(std::vector<double> losses) : losses_(std::move(losses)) {
    fc = register_module("fc", torch::nn::Linear(8, 2));
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t batch_idx) override {
    const auto n = static_cast<size_t>(current_epoch() * kPerEpoch + batch_idx);
    const double v = n < losses_.size() ? losses_[n] : 1.0;
    return fc->forward(b.input).sum() * 0.0 + v;
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {volt::OptimizerConfig(
        std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)))};
  }
  torch::nn::Linear fc{nullptr};

 private:
  std::vector<double> losses_;
};

volt::DataLoader data() {
  return volt_test::loader(volt_test::blobs(64), 8, /*shuffle=*/false);
}

std::vector<double> ones(size_t n) {
  return std::vector<double>(n, 1.0);
}

struct Outcome {
  std::string error;  // what the fit threw ("" when it finished)
  int64_t batch_idx = -1;
  std::shared_ptr<volt::SpikeDetection> callback;
};

Outcome fit(const std::string& root, std::vector<double> losses,
            volt::SpikeDetectionOptions options = volt::SpikeDetectionOptions(),
            int64_t epochs = 1) {
  Outcome out;
  out.callback = std::make_shared<volt::SpikeDetection>(options);
  Scripted m(std::move(losses));
  volt::Trainer t(quiet(root).max_epochs(epochs).callbacks({out.callback}));
  try {
    t.fit(m, data());
  } catch (const volt::TrainingSpikeError& e) {
    out.error = e.what();
    out.batch_idx = e.batch_idx();
  }
  return out;
}

}  // namespace

TEST(SpikeDetection, AJumpAboveTheRunningMeanEndsTheFitAndWritesTheBatchesToSkip) {
  volt_test::TempDir dir;
  std::vector<double> losses = ones(8);
  losses[5] = 3.5;  // mean 1, 2.5 above it: at least rtol (2) × |mean|
  const Outcome o = fit(dir.path, losses);
  ASSERT_EQ(o.batch_idx, 5) << o.error;
  EXPECT_TRUE(volt_test::has(o.error, "[SpikeDetection] training spike in batch 5 of epoch 0"))
      << o.error;
  EXPECT_TRUE(volt_test::has(o.error, "loss 3.5 against a running mean of 1 over the last 5"))
      << o.error;
  EXPECT_EQ(o.callback->bad_batches(), (std::vector<int64_t>{4, 5}));
  // Lightning's file: a JSON list of the batch and the one before it, in the run's log_dir
  // (default_root_dir here: the run has no logger).
  EXPECT_EQ(nlohmann::json::parse(file_text(dir / "skip_batches.json")),
            nlohmann::json::parse("[4, 5]"));
  EXPECT_TRUE(volt_test::has(o.error, "written to " + (dir / "skip_batches.json"))) << o.error;

  // With a logger the list goes into the run's folder, beside its checkpoints.
  {
    auto cb = std::make_shared<volt::SpikeDetection>();
    Scripted m(losses);
    volt::Trainer t(quiet(dir / "logged").logger(true).max_epochs(1).callbacks({cb}));
    EXPECT_FALSE(volt_test::error_of<volt::TrainingSpikeError>([&] { t.fit(m, data()); }).empty());
    EXPECT_NE(t.log_dir(), dir / "logged");
    EXPECT_EQ(nlohmann::json::parse(file_text(t.log_dir() + "/skip_batches.json")),
              nlohmann::json::parse("[4, 5]"));
  }
  // 3.0 is 2.0 above the mean: exactly rtol × mean, a spike; 2.9 is not.
  losses[5] = 2.9;
  EXPECT_EQ(fit(dir.path, losses).batch_idx, -1);
  losses[5] = 3.0;
  EXPECT_EQ(fit(dir.path, losses).batch_idx, 5);
}

TEST(SpikeDetection, AbsoluteAndRelativeBoundsMustBothHold) {
  volt_test::TempDir dir;
  std::vector<double> losses = ones(8);
  losses[6] = 2.0;  // 1.0 above a mean of 1
  const auto opts = [] { return volt::SpikeDetectionOptions(); };
  EXPECT_EQ(fit(dir.path, losses, opts().atol(0.5).rtol(0)).batch_idx, 6);
  EXPECT_EQ(fit(dir.path, losses, opts().atol(1.5).rtol(0)).batch_idx, -1);
  EXPECT_EQ(fit(dir.path, losses, opts().atol(0.5).rtol(0.5)).batch_idx, 6);
  EXPECT_EQ(fit(dir.path, losses, opts().atol(0.5).rtol(2)).batch_idx, -1);
}

// A loss below the running mean is never a spike when the loss should fall, even when it is
// above the previous batch's and far from the mean (Lightning compares the absolute distance and
// would stop this run at batch 4). In "max" mode the bad side is below the mean.
TEST(SpikeDetection, OnlyTheBadSideOfTheMeanSpikes) {
  volt_test::TempDir dir;
  const std::vector<double> falling{1, 1, 1, 0.1, 0.2, 0.2, 0.2, 0.2};
  EXPECT_EQ(fit(dir.path, falling, volt::SpikeDetectionOptions().atol(0.5).rtol(0)).batch_idx, -1);
  std::vector<double> rising = ones(8);
  rising[4] = 0.2;
  const auto max = volt::SpikeDetectionOptions().mode(volt::Mode::kMax).rtol(0.5);
  EXPECT_EQ(fit(dir.path, rising, max).batch_idx, 4);
  rising[4] = 1.8;  // above the mean: an improvement in max mode
  EXPECT_EQ(fit(dir.path, rising, max).batch_idx, -1);
}

// No worse than the previous batch: not a spike (the mean lags behind a loss that rose
// gradually); the warm-up batches are not judged but do enter the mean.
TEST(SpikeDetection, AGradualRiseAndTheWarmupAreNotSpikes) {
  volt_test::TempDir dir;
  EXPECT_EQ(fit(dir.path, {1, 1, 1, 3, 3, 3, 3, 3}).batch_idx, 3);
  const Outcome o =
      fit(dir.path, {1, 1, 1, 3, 3, 3, 3, 3}, volt::SpikeDetectionOptions().warmup(4));
  EXPECT_EQ(o.batch_idx, -1) << o.error;
  // window 10 over 8 losses: (1 + 1 + 1 + 3 × 5) / 8 = 2.25; window 5: the last five, 3.
  EXPECT_DOUBLE_EQ(o.callback->running_mean(), 2.25);
  EXPECT_DOUBLE_EQ(
      fit(dir.path, {1, 1, 1, 3, 3, 3, 3, 3}, volt::SpikeDetectionOptions().warmup(8).window(5))
          .callback->running_mean(),
      3.0);
}

TEST(SpikeDetection, ANonFiniteLossIsASpikeUnlessFiniteOnlyIsOff) {
  volt_test::TempDir dir;
  std::vector<double> losses = ones(8);
  losses[3] = std::numeric_limits<double>::quiet_NaN();
  const Outcome o = fit(dir.path, losses);
  EXPECT_EQ(o.batch_idx, 3) << o.error;
  EXPECT_TRUE(volt_test::has(o.error, "loss nan")) << o.error;
  // Off: the NaN is neither judged nor averaged (the Trainer's own check is off here too).
  Outcome skipped;
  skipped.callback =
      std::make_shared<volt::SpikeDetection>(volt::SpikeDetectionOptions().finite_only(false));
  Scripted m(losses);
  volt::Trainer(
      quiet(dir.path).max_epochs(1).detect_nonfinite_loss(false).callbacks({skipped.callback}))
      .fit(m, data());
  EXPECT_DOUBLE_EQ(skipped.callback->running_mean(), 1.0);
}

// The running mean, the previous loss and the batches seen are checkpointed: a fit resumed from
// the end of epoch 0 stops at the same batch of epoch 1 with the same message as the
// uninterrupted fit.
TEST(SpikeDetection, AResumedFitJudgesAsTheUninterruptedOne) {
  volt_test::TempDir dir;
  std::vector<double> losses(16);
  for (size_t i = 0; i < losses.size(); ++i) losses[i] = 1.0 + 0.1 * static_cast<double>(i % 3);
  losses[10] = 4.0;  // epoch 1, batch 2
  const Outcome whole = fit(dir / "whole", losses, volt::SpikeDetectionOptions(), 2);
  ASSERT_EQ(whole.batch_idx, 2) << whole.error;

  {
    Scripted m(losses);
    auto cb = std::make_shared<volt::SpikeDetection>();
    volt::Trainer t(quiet(dir / "cut").max_epochs(1).callbacks({cb}));
    t.fit(m, data());
    t.save_checkpoint(dir / "epoch0.ckpt");
  }
  Scripted m(losses);
  auto cb = std::make_shared<volt::SpikeDetection>();
  volt::Trainer t(quiet(dir / "whole").max_epochs(2).callbacks({cb}));
  const std::string resumed = volt_test::error_of<volt::TrainingSpikeError>(
      [&] { t.fit(m, data(), c10::nullopt, dir / "epoch0.ckpt"); });
  EXPECT_EQ(resumed, whole.error);
  EXPECT_EQ(cb->bad_batches(), (std::vector<int64_t>{1, 2}));
  // Without the restored state the first judged batch of the resumed fit would be later (the
  // warm-up again) and the mean would be of epoch 1 alone.
  EXPECT_TRUE(volt_test::has(resumed, "over the last 10 batches")) << resumed;
}

TEST(SpikeDetection, BadOptionsAreConfigErrors) {
  using O = volt::SpikeDetectionOptions;
  const auto error = [](O o) {
    return volt_test::error_of<volt::ConfigError>([&] { volt::SpikeDetection s(o); });
  };
  EXPECT_TRUE(volt_test::has(error(O().window(0)), "window=0 must be >= 1"));
  EXPECT_TRUE(volt_test::has(error(O().warmup(-1)), "warmup=-1 must be >= 0"));
  EXPECT_TRUE(volt_test::has(error(O().atol(-1)), "must be finite and >= 0"));
  EXPECT_TRUE(volt_test::has(error(O().rtol(std::nan(""))), "must be finite and >= 0"));
  EXPECT_TRUE(volt_test::has(error(O().rtol(0)), "atol and rtol are both 0"));
  // Registered for configs and the CLI, with these options' defaults.
  auto made = std::dynamic_pointer_cast<volt::SpikeDetection>(
      volt::registry().callbacks.create("SpikeDetection"));
  ASSERT_NE(made, nullptr);
  EXPECT_EQ(made->options().window(), 10);
  EXPECT_DOUBLE_EQ(made->options().rtol(), 2.0);
  EXPECT_EQ(made->exclude_batches_file("/runs/a"), "/runs/a/skip_batches.json");
  EXPECT_EQ(volt::SpikeDetection(O().exclude_batches_path("/x/y")).exclude_batches_file("r"),
            "/x/y/skip_batches.json");
  EXPECT_EQ(volt::SpikeDetection(O().exclude_batches_path("/x/y.json")).exclude_batches_file("r"),
            "/x/y.json");
}

// Two DDP processes: rank 1's loss spikes alone (50 times its value in its 6th training_step);
// both ranks end at that batch with TrainingSpikeError (rank 0 saying another rank's loss
// spiked) within seconds instead of one waiting for the other, and rank 0 wrote the list.
TEST(SpikeDetection, ASpikeOnOneRankEndsEveryRankAtThatBatch) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const auto job = volt_test::run_job(
      {"--root", dir.path, "--out", dir / "w", "--devices", "2", "--batch", "8", "--epochs", "1",
       "--spike-rank", "1", "--spike-call", "5", "--timeout", "20"},
      std::chrono::seconds(60));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(job.code, 1) << job.output;
  EXPECT_LT(secs, 15.0) << job.output;
  EXPECT_TRUE(volt_test::has(job.output, "training spike in batch 5 of epoch 0")) << job.output;
  EXPECT_TRUE(volt_test::has(job.output, "another rank's loss spiked")) << job.output;
  EXPECT_TRUE(volt_test::has(job.output, "against a running mean")) << job.output;
  EXPECT_EQ(nlohmann::json::parse(file_text(dir / "skip.json")), nlohmann::json::parse("[4, 5]"));
}

// Fabric's form (Lightning Fabric's SpikeDetection, reached through fabric.call) judges as the
// Trainer's callback: the same scripted losses stop a Fabric loop at the same batch with the
// same verdict and list; a callback without the hook is skipped; by default the list goes to
// the working directory (Lightning Fabric's default).
TEST(FabricSpikeDetection, AFabricLoopStopsAtTheBatchTheTrainersFitDoes) {
  volt_test::TempDir dir;
  std::vector<double> losses = ones(8);
  losses[5] = 3.5;
  const Outcome trainer = fit(dir / "trainer", losses);
  ASSERT_EQ(trainer.batch_idx, 5) << trainer.error;

  struct Other : volt::FabricCallback {};
  const auto run = [&](volt::SpikeDetectionOptions options, std::string& error) {
    auto spikes = std::make_shared<volt::FabricSpikeDetection>(options);
    volt::Fabric fabric(
        volt::FabricOptions().accelerator("cpu").callbacks({std::make_shared<Other>(), spikes}));
    volt::seed_everything(123);
    auto net = torch::nn::Linear(8, 2);
    auto opt = std::make_shared<torch::optim::SGD>(net->parameters(), 0.01);
    fabric.setup(net, {opt});
    int64_t i = 0;
    error = volt_test::error_of<volt::TrainingSpikeError>([&] {
      for (volt::Batch& b : fabric.setup_dataloader(data()).stream(0)) {
        b = fabric.to_device(b);
        const at::Tensor loss = net->forward(b.input).sum() * 0.0 + losses[i];
        fabric.backward(loss);
        fabric.step(*opt);
        fabric.zero_grad(*opt);
        fabric.call(&volt::FabricSpikeDetection::on_train_batch_end, fabric, loss, i);
        ++i;
      }
    });
    EXPECT_EQ(i, 5) << error;  // the call for batch 5 threw
    return spikes;
  };
  std::string error;
  auto spikes = run(volt::SpikeDetectionOptions().exclude_batches_path(dir / "f.json"), error);
  EXPECT_TRUE(volt_test::has(
      error,
      "[SpikeDetection] training spike in batch 5: loss 3.5 against a running mean of 1 "
      "over the last 5 batches. Batches to leave out [4, 5] written to " +
          (dir / "f.json")))
      << error;
  EXPECT_EQ(spikes->detector().bad_batches(), trainer.callback->bad_batches());
  EXPECT_EQ(nlohmann::json::parse(file_text(dir / "f.json")), nlohmann::json::parse("[4, 5]"));

  // The default: skip_batches.json in the working directory.
  const auto cwd = std::filesystem::current_path();
  std::filesystem::create_directories(dir / "cwd");
  std::filesystem::current_path(dir / "cwd");
  run(volt::SpikeDetectionOptions(), error);
  std::filesystem::current_path(cwd);
  EXPECT_EQ(nlohmann::json::parse(file_text(dir / "cwd/skip_batches.json")),
            nlohmann::json::parse("[4, 5]"));
  EXPECT_TRUE(volt_test::has(error, "written to " + (dir / "cwd/skip_batches.json"))) << error;
}

// A per-sample loss handed to Fabric's hook is a ValueError naming the fix (it was libtorch's
// raw error from item()), and the detector has seen nothing.
TEST(FabricSpikeDetection, ALossOfSeveralValuesIsAValueError) {
  auto spikes = std::make_shared<volt::FabricSpikeDetection>(volt::SpikeDetectionOptions());
  volt::Fabric fabric(volt::FabricOptions().accelerator("cpu").callbacks({spikes}));
  const std::string error = volt_test::error_of<volt::ValueError>([&] {
    fabric.call(&volt::FabricSpikeDetection::on_train_batch_end, fabric, torch::ones({4}),
                int64_t{0});
  });
  EXPECT_TRUE(volt_test::has(error,
                             "[SpikeDetection] the loss has 4 values (shape [4]); pass "
                             "the batch's scalar loss"))
      << error;
  EXPECT_TRUE(spikes->detector().bad_batches().empty());
}

// Two ranks of a Fabric loop (tests/support/fabric_worker.cpp): rank 1's loss spikes alone at
// step 5; both ranks' loops end there within seconds (the ranks agree on the verdict through the
// strategy), and rank 0 wrote the list.
TEST(FabricSpikeDetection, ASpikeOnOneRankEndsEveryRanksLoopAtThatBatch) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const auto job = volt_test::run_job(
      volt_test::fabric_worker(),
      {"--out", dir / "w", "--devices", "2", "--batch", "8", "--spike-file", dir / "skip.json",
       "--spike-rank", "1", "--spike-step", "5", "--timeout", "20"},
      std::chrono::seconds(60));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(job.code, 1) << job.output;
  EXPECT_LT(secs, 15.0) << job.output;
  EXPECT_TRUE(volt_test::has(job.output, "training spike in batch 5: loss")) << job.output;
  EXPECT_TRUE(volt_test::has(job.output, "training spike in batch 5: another rank's loss spiked"))
      << job.output;
  EXPECT_EQ(nlohmann::json::parse(file_text(dir / "skip.json")), nlohmann::json::parse("[4, 5]"));
  // Without a spike the same loop runs to its end with the callback judging every step.
  const auto clean = volt_test::run_job(volt_test::fabric_worker(),
                                        {"--out", dir / "c", "--devices", "2", "--batch", "8",
                                         "--spike-file", dir / "clean.json", "--timeout", "20"});
  EXPECT_EQ(clean.code, 0) << clean.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "clean.json"));
}
