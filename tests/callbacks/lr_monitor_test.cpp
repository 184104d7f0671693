// LearningRateMonitor: logged names and values follow the scheduler, per step and per epoch.
#include <gtest/gtest.h>

#include <filesystem>

#include "log_capture.h"
#include "tiny.h"

namespace {

using volt_test::MemoryLogger;

TEST(LearningRateMonitor, LogsSchedulerLrEveryStepWithMomentumAndWeightDecay) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;  // SGD(lr 0.1, momentum 0.9)
  model.scheduler_step_size = 2;
  model.scheduler_interval = volt::Interval::kStep;
  auto mem = std::make_shared<MemoryLogger>();
  auto monitor = std::make_shared<volt::LearningRateMonitor>(
      volt::LearningRateMonitorOptions().log_momentum(true).log_weight_decay(true));
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(1).log_every_n_steps(1).loggers({mem}).callbacks(
          {monitor}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));  // 8 steps
  auto lrs = mem->with("lr-SGD");
  ASSERT_EQ(lrs.size(), 8u);
  for (const auto& [step, m] : lrs) {
    EXPECT_DOUBLE_EQ(m.at("lr-SGD"), 0.1 * std::pow(0.5, step / 2)) << "step " << step;
    EXPECT_DOUBLE_EQ(m.at("lr-SGD-momentum"), 0.9);
    EXPECT_DOUBLE_EQ(m.at("lr-SGD-weight_decay"), 0.0);
  }
  EXPECT_EQ(lrs.front().first, 0);
  EXPECT_EQ(lrs.back().first, 7);
}

// Manual optimization stepping every optimizer once per batch.
struct EveryOptimizerSteps : volt_test::TinyClassifier {
  EveryOptimizerSteps() { set_automatic_optimization(false); }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    for (auto& opt : optimizers()) {
      opt.zero_grad();
      manual_backward(torch::cross_entropy_loss(forward(b.input), b.target));
      opt.step();
    }
    return {};
  }
};

// Manual optimization stepping two optimizers per batch: the step count at a batch's start is
// always even, so "(step + 1) % 2 == 0" never held and nothing was logged. The monitor follows
// the Trainer's cadence: a log each time the count passes a multiple of log_every_n_steps.
TEST(LearningRateMonitor, TwoStepsPerBatchUnderManualOptimizationAreLoggedOnTheTrainersCadence) {
  struct TwoOptimizers : EveryOptimizerSteps {
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      return {volt::OptimizerConfig(std::make_shared<torch::optim::SGD>(
                  fc1->parameters(), torch::optim::SGDOptions(0.1))),
              volt::OptimizerConfig(std::make_shared<torch::optim::SGD>(
                  fc2->parameters(), torch::optim::SGDOptions(0.05)))};
    }
  };
  volt_test::TempDir dir;
  TwoOptimizers model;
  auto mem = std::make_shared<MemoryLogger>();
  auto monitor = std::make_shared<volt::LearningRateMonitor>();
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(1).log_every_n_steps(2).loggers({mem}).callbacks(
          {monitor}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));  // 8 batches, 16 steps
  const auto lrs = mem->with("lr-SGD");
  // At the epoch's start (step 0: optimizers without a scheduler are logged there too) and at
  // the batches starting at steps 2, 4, ..., 14.
  ASSERT_EQ(lrs.size(), 8u);
  EXPECT_EQ(lrs[0].first, 0);
  EXPECT_EQ(lrs[1].first, 2);
  EXPECT_DOUBLE_EQ(lrs[1].second.at("lr-SGD"), 0.1);
  EXPECT_DOUBLE_EQ(lrs[1].second.at("lr-SGD-1"), 0.05);
}

// As Lightning's LearningRateMonitor: an optimizer without a scheduler is logged at each epoch
// start as well as on the step cadence (with fewer batches than log_every_n_steps it was never
// logged), and the optimizers with a scheduler are named first ("lr-SGD" is the scheduled one,
// listed second; it was "lr-SGD-1").
TEST(LearningRateMonitor, UnscheduledOptimizersAtEpochStartsAndScheduledOnesNamedFirst) {
  struct Mixed : EveryOptimizerSteps {
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      auto plain =
          std::make_shared<torch::optim::SGD>(fc1->parameters(), torch::optim::SGDOptions(0.1));
      auto scheduled =
          std::make_shared<torch::optim::SGD>(fc2->parameters(), torch::optim::SGDOptions(0.05));
      return {volt::OptimizerConfig(plain),
              volt::OptimizerConfig(scheduled)
                  .scheduler(std::make_shared<volt::StepLR>(*scheduled, 100, 0.5))
                  .interval(volt::Interval::kEpoch)};
    }
  };
  volt_test::TempDir dir;
  Mixed model;
  auto mem = std::make_shared<MemoryLogger>();
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(2).loggers({mem}).callbacks(
      {std::make_shared<volt::LearningRateMonitor>()}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));  // 8 batches an epoch
  const auto rows = mem->with("lr-SGD-1");
  ASSERT_EQ(rows.size(), 2u);  // each epoch start (log_every_n_steps 50: no step rows)
  for (const auto& [step, m] : rows) {
    EXPECT_DOUBLE_EQ(m.at("lr-SGD-1"), 0.1) << step;  // the optimizer without a scheduler
    EXPECT_DOUBLE_EQ(m.at("lr-SGD"), 0.05) << step;   // the scheduled one
  }
}

// As Lightning: a config's name replaces "lr-<Type>" (without counting towards the type's
// numbering), log_key_prefix goes before every name, an optimizer without momentum logs 0 for it
// (with a warning), and the values reach callback_metrics, where EarlyStopping can stop on a rate
// that a plateau scheduler drove down (Lightning's trainer.callback_metrics.update).
TEST(LearningRateMonitor, NamesPrefixesMomentumlessOptimizersAndCallbackMetrics) {
  struct Named : EveryOptimizerSteps {
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      auto a =
          std::make_shared<torch::optim::SGD>(fc1->parameters(), torch::optim::SGDOptions(0.1));
      auto b =
          std::make_shared<torch::optim::SGD>(fc2->parameters(), torch::optim::SGDOptions(0.05));
      auto c = std::make_shared<torch::optim::Adagrad>(fc2->parameters(),
                                                       torch::optim::AdagradOptions(0.01));
      return {volt::OptimizerConfig(a)
                  .scheduler(std::make_shared<volt::StepLR>(*a, 1, 0.5))
                  .interval(volt::Interval::kEpoch)
                  .name("backbone"),
              volt::OptimizerConfig(b), volt::OptimizerConfig(c)};
    }
  };
  volt_test::TempDir dir;
  Named model;
  auto mem = std::make_shared<MemoryLogger>();
  auto monitor = std::make_shared<volt::LearningRateMonitor>(
      volt::LearningRateMonitorOptions().log_momentum(true).log_key_prefix("opt/"));
  auto stop = std::make_shared<volt::EarlyStopping>(volt::EarlyStoppingOptions("opt/backbone")
                                                        .stopping_threshold(0.03)
                                                        .check_on_train_epoch_end(true));
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(10).loggers({mem}).callbacks({monitor, stop}));
  const auto logs =
      volt_test::capture_logs([&] { trainer.fit(model, volt_test::loader(volt_test::blobs(64))); });
  const auto rows = mem->with("opt/backbone");
  ASSERT_FALSE(rows.empty());
  EXPECT_DOUBLE_EQ(rows[0].second.at("opt/backbone"), 0.1);
  EXPECT_DOUBLE_EQ(rows[0].second.at("opt/lr-SGD"), 0.05);  // the first unnamed SGD
  EXPECT_DOUBLE_EQ(rows[0].second.at("opt/lr-Adagrad-momentum"), 0.0);
  // Logged at the starts of epochs 0, 1, 2 as 0.1, 0.05, 0.025: the check at the end of epoch 2
  // reads 0.025 < 0.03 and stops the fit there.
  EXPECT_DOUBLE_EQ(trainer.callback_metrics().at("opt/backbone"), 0.025);
  EXPECT_EQ(trainer.state().epoch, 2);
  int warned = 0;
  for (const auto& l : logs) {
    warned += l.find(
                  "log_momentum is set, but some optimizers do not have momentum (Adagrad); "
                  "their momentum is logged as 0") != std::string::npos;
  }
  EXPECT_EQ(warned, 1);
}

TEST(LearningRateMonitor, EpochIntervalAndParamGroupNames) {
  struct TwoGroups : volt_test::TinyClassifier {
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(fc1->parameters(), std::make_unique<torch::optim::AdamWOptions>(0.01));
      groups.emplace_back(fc2->parameters(), std::make_unique<torch::optim::AdamWOptions>(0.02));
      auto opt = std::make_shared<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(0.01));
      return {volt::OptimizerConfig(opt)
                  .scheduler(std::make_shared<volt::StepLR>(*opt, 1, 0.1))
                  .interval(volt::Interval::kEpoch)};
    }
  };
  volt_test::TempDir dir;
  TwoGroups model;
  auto mem = std::make_shared<MemoryLogger>();
  auto monitor = std::make_shared<volt::LearningRateMonitor>(
      volt::LearningRateMonitorOptions().log_momentum(true));
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(3).log_every_n_steps(1).loggers({mem}).callbacks(
          {monitor}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
  auto pg2 = mem->with("lr-AdamW/pg2");
  ASSERT_EQ(pg2.size(), 3u);  // once per epoch (the scheduler's interval)
  for (size_t e = 0; e < 3; ++e) {
    EXPECT_EQ(pg2[e].first, static_cast<int64_t>(8 * e));
    EXPECT_NEAR(pg2[e].second.at("lr-AdamW/pg2"), 0.02 * std::pow(0.1, e), 1e-15);
    EXPECT_NEAR(pg2[e].second.at("lr-AdamW/pg1"), 0.01 * std::pow(0.1, e), 1e-15);
    EXPECT_DOUBLE_EQ(pg2[e].second.at("lr-AdamW/pg1-momentum"), 0.9);
  }
  EXPECT_EQ(monitor->last_logged().count("lr-AdamW/pg1"), 1u);
}

TEST(LearningRateMonitor, FollowsOneCycleMomentumOnFusedAdamW) {
  struct Fused : volt_test::TinyClassifier {
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      auto opt = std::make_shared<volt::FusedAdamW>(parameters(), volt::FusedAdamWOptions(0.01));
      return {
          volt::OptimizerConfig(opt)
              .scheduler(std::make_shared<volt::OneCycleLR>(*opt, volt::OneCycleLROptions(0.1, 8)))
              .interval(volt::Interval::kStep)};
    }
  };
  volt_test::TempDir dir;
  Fused model;
  auto mem = std::make_shared<MemoryLogger>();
  auto monitor = std::make_shared<volt::LearningRateMonitor>(
      volt::LearningRateMonitorOptions().log_momentum(true).log_weight_decay(true));
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(1).log_every_n_steps(1).loggers({mem}).callbacks(
          {monitor}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
  auto rows = mem->with("lr-FusedAdamW-momentum");
  ASSERT_EQ(rows.size(), 8u);
  EXPECT_NEAR(rows[0].second.at("lr-FusedAdamW"), 0.1 / 25, 1e-12);       // max_lr / div_factor
  EXPECT_NEAR(rows[0].second.at("lr-FusedAdamW-momentum"), 0.95, 1e-12);  // max_momentum first
  EXPECT_LT(rows[2].second.at("lr-FusedAdamW-momentum"), 0.95);           // cycled down
  EXPECT_DOUBLE_EQ(rows[0].second.at("lr-FusedAdamW-weight_decay"), 1e-2);
}

TEST(LearningRateMonitor, NeedsALogger) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1).callbacks(
      {std::make_shared<volt::LearningRateMonitor>()}));
  try {
    trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
    FAIL() << "expected ConfigError";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("has no logger"), std::string::npos) << e.what();
  }
  // The same run under fast_dev_run, still without a logger: the same error (Lightning's too).
  volt::Trainer smoke(volt_test::quiet(dir.path).fast_dev_run(2).callbacks(
      {std::make_shared<volt::LearningRateMonitor>()}));
  EXPECT_THROW(smoke.fit(model, volt_test::loader(volt_test::blobs(32))), volt::ConfigError);
}

TEST(LearningRateMonitor, FastDevRunMutesTheLoggersWithoutFailing) {
  // fast_dev_run drops the loggers (no files); a config with loggers and a LearningRateMonitor,
  // such as the shipped configs/fashion_mnist_mlp.yaml, must still pass its smoke test. Before,
  // it failed with "the Trainer has no logger". As Lightning (DummyLogger): it logs into nothing.
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto mem = std::make_shared<MemoryLogger>();
  for (bool default_logger : {false, true}) {
    auto options = volt_test::quiet(dir.path).fast_dev_run(2).callbacks(
        {std::make_shared<volt::LearningRateMonitor>()});
    if (default_logger) {
      options.logger(true);  // the CSVLogger the Trainer would add
    } else {
      options.loggers({mem});
    }
    volt::Trainer trainer(options);
    EXPECT_NO_THROW(trainer.fit(model, volt_test::loader(volt_test::blobs(64))));
    EXPECT_EQ(trainer.state().global_step, 2);
  }
  EXPECT_TRUE(mem->with("lr-SGD").empty());
  EXPECT_FALSE(std::filesystem::exists(dir / "volt_logs"));
}

}  // namespace
