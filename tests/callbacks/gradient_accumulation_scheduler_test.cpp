#include <gtest/gtest.h>

#include <algorithm>

#include "error_text.h"
#include "log_capture.h"
#include "manual_module.h"
#include "requires.h"
#include "save_at.h"
#include "tiny.h"

namespace {

using volt_test::SaveAt;

using volt::GradientAccumulationScheduler;
using Schedule = std::map<int64_t, int64_t>;
using volt_test::quiet;
using volt_test::TinyClassifier;

std::shared_ptr<GradientAccumulationScheduler> schedule(std::map<int64_t, int64_t> s) {
  return std::make_shared<GradientAccumulationScheduler>(std::move(s));
}

/// Global step seen after each training batch.
class StepRecorder : public volt::Callback {
 public:
  std::string state_key() const override { return "StepRecorder"; }
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t) override {
    steps.push_back(run.state().global_step);
  }
  std::vector<int64_t> steps;
};

TEST(GradientAccumulationScheduler, FactorByEpochAndItsChecks) {
  GradientAccumulationScheduler s(Schedule{{2, 4}, {5, 1}});
  const std::vector<int64_t> expect = {1, 1, 4, 4, 4, 1, 1};
  for (int64_t e = 0; e < 7; ++e) EXPECT_EQ(s.accumulate_grad_batches(e), expect[e]) << e;
  EXPECT_EQ(s.scheduling().at(0), 1);  // epochs before the first key: no accumulation
  EXPECT_EQ(GradientAccumulationScheduler(Schedule{{0, 8}}).accumulate_grad_batches(100), 8);

  using volt_test::error_of;
  EXPECT_NE(error_of<volt::ConfigError>([] {
              GradientAccumulationScheduler(Schedule{});
            }).find("scheduling is empty"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([] {
              GradientAccumulationScheduler(Schedule{{-1, 2}});
            }).find("epoch -1 is negative"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([] {
              GradientAccumulationScheduler(Schedule{{3, 0}});
            }).find("factor 0 for epoch 3 is below 1"),
            std::string::npos);
}

TEST(GradientAccumulationScheduler, ParsesTheCommandLineForm) {
  EXPECT_EQ(GradientAccumulationScheduler::parse_scheduling(" 0:8, 4 : 4,8:1 "),
            (std::map<int64_t, int64_t>{{0, 8}, {4, 4}, {8, 1}}));
  const auto bad = [](const std::string& text) {
    return volt_test::error_of<volt::ConfigError>(
        [&] { GradientAccumulationScheduler::parse_scheduling(text); });
  };
  EXPECT_NE(bad("").find("no epoch:factor pair"), std::string::npos);
  EXPECT_NE(bad("0:8,").find("expected an epoch"), std::string::npos);
  EXPECT_NE(bad("a:1").find("expected an epoch"), std::string::npos);
  EXPECT_NE(bad("0-8").find("expected ':' at character 2"), std::string::npos);
  EXPECT_NE(bad("0:8 4:4").find("expected ',' or the end"), std::string::npos);
  EXPECT_NE(bad("0:8,0:2").find("epoch 0 appears twice"), std::string::npos);
  EXPECT_NE(bad("0:-2").find("expected a factor"), std::string::npos);
  EXPECT_NE(bad("0:99999999999999999999").find("too large"), std::string::npos);
  EXPECT_NE(bad("x").find("e.g. \"0:8, 4:4, 8:1\""), std::string::npos);
}

// The scheduled run equals one epoch without accumulation, saved, and resumed for a second
// epoch with accumulate_grad_batches=3 (the existing, tested accumulation path).
TEST(GradientAccumulationScheduler, TrainsAsTheSameFactorsSetByHand) {
  volt_test::TempDir dir;
  auto data = volt_test::blobs(160);  // 10 batches of 16
  TinyClassifier scheduled, by_hand;
  {
    torch::NoGradGuard g;
    for (size_t i = 0; i < scheduled.parameters().size(); ++i) {
      by_hand.parameters()[i].copy_(scheduled.parameters()[i]);
    }
  }
  auto rec = std::make_shared<StepRecorder>();
  volt::Trainer ts(quiet(dir / "s").max_epochs(3).callbacks({schedule({{1, 3}, {2, 5}}), rec}));
  const auto lines = volt_test::capture_logs([&] { ts.fit(scheduled, volt_test::loader(data)); });
  // Epoch 0: 10 steps; epoch 1: after batches 3, 6, 9, 10; epoch 2: after 5, 10.
  EXPECT_EQ(ts.state().global_step, 16);
  EXPECT_EQ(std::vector<int64_t>(rec->steps.begin() + 10, rec->steps.end()),
            (std::vector<int64_t>{10, 10, 11, 11, 11, 12, 12, 12, 13, 14,
                                  14, 14, 14, 14, 15, 15, 15, 15, 15, 16}));
  EXPECT_EQ(ts.state().accumulate_grad_batches, 5);
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("epoch 1: 3 batches per optimizer step.") != std::string::npos;
  }));

  const std::string ckpt = dir / "e0.ckpt";
  {
    volt::Trainer t(quiet(dir / "h").max_epochs(1));
    t.fit(by_hand, volt_test::loader(data));
    t.save_checkpoint(ckpt);
  }
  const std::string ckpt1 = dir / "e1.ckpt";
  {
    volt::Trainer t(quiet(dir / "h").max_epochs(2).accumulate_grad_batches(3));
    t.fit(by_hand, volt_test::loader(data), c10::nullopt, ckpt);
    t.save_checkpoint(ckpt1);
  }
  volt::Trainer t(quiet(dir / "h").max_epochs(3).accumulate_grad_batches(5));
  t.fit(by_hand, volt_test::loader(data), c10::nullopt, ckpt1);
  EXPECT_EQ(t.state().global_step, 16);
  EXPECT_TRUE(torch::equal(scheduled.flat_params(), by_hand.flat_params()));
}

TEST(GradientAccumulationScheduler, ResumesExactlyFromACheckpointTakenMidAccumulation) {
  volt_test::TempDir dir;
  auto data = volt_test::blobs(160);
  TinyClassifier whole;
  auto save = std::make_shared<SaveAt>(1, 4, dir / "mid.ckpt");  // 5 batches in: 2 of 3 summed
  volt::Trainer tw(quiet(dir / "w").max_epochs(2).callbacks({schedule({{1, 3}}), save}));
  tw.fit(whole, volt_test::loader(data));
  ASSERT_EQ(save->accumulated_at_save, 2);

  TinyClassifier resumed;
  volt::Trainer tr(quiet(dir / "r").max_epochs(2).callbacks({schedule({{1, 3}})}));
  tr.fit(resumed, volt_test::loader(data), c10::nullopt, dir / "mid.ckpt");
  EXPECT_EQ(tr.state().global_step, tw.state().global_step);
  EXPECT_TRUE(torch::equal(whole.flat_params(), resumed.flat_params()));
}

using ManualModule = volt_test::ManualTinyClassifier;

/// Changes the factor between the micro-batches of a step.
class ChangeMidStep : public volt::Callback {
 public:
  std::string state_key() const override { return "ChangeMidStep"; }
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t) override {
    run.set_accumulate_grad_batches(2);
  }
};

TEST(GradientAccumulationScheduler, RefusesWhatLightningRefuses) {
  volt_test::TempDir dir;
  auto data = volt_test::loader(volt_test::blobs(64));
  const auto fit_error = [&](volt::TrainerOptions o, volt::Module& m) {
    return volt_test::error_of<volt::Error>([&] { volt::Trainer(o).fit(m, data); });
  };
  TinyClassifier model;
  EXPECT_NE(fit_error(quiet(dir.path).max_epochs(2).accumulate_grad_batches(2).callbacks(
                          {schedule({{1, 4}})}),
                      model)
                .find("the Trainer's accumulate_grad_batches is 2 and this callback schedules"),
            std::string::npos);
  ManualModule manual;
  EXPECT_NE(fit_error(quiet(dir.path).max_epochs(2).callbacks({schedule({{1, 4}})}), manual)
                .find("manual optimization"),
            std::string::npos);
  // DeepSpeed fixes the factor: refused before training, not at the epoch that changes it.
  // A one-process DeepSpeed fit on the CPU makes a Gloo group (not in the CUDA wheels).
  if (volt_test::gloo()) {
    TinyClassifier zero;
    const auto before = zero.flat_params();
    EXPECT_NE(fit_error(quiet(dir.path)
                            .strategy("deepspeed_stage_2")
                            .max_epochs(3)
                            .callbacks({schedule({{2, 4}})}),
                        zero)
                  .find("[DeepSpeedStrategy] the gradient accumulation factor cannot change"),
              std::string::npos);
    EXPECT_TRUE(torch::equal(before, zero.flat_params()));
    // A schedule that never changes the factor is fine there.
    TinyClassifier zero_ok;
    volt::Trainer tz(quiet(dir.path)
                         .strategy("deepspeed_stage_2")
                         .max_epochs(1)
                         .callbacks({schedule({{0, 1}})}));
    tz.fit(zero_ok, data);
    EXPECT_EQ(tz.state().global_step, 4);
  }
  // Changing it while a step is part accumulated would mix scales.
  TinyClassifier mid;
  EXPECT_NE(volt_test::error_of<volt::ValueError>([&] {
              volt::Trainer(quiet(dir.path).max_epochs(1).accumulate_grad_batches(3).callbacks(
                                {std::make_shared<ChangeMidStep>()}))
                  .fit(mid, data);
            }).find("accumulate_grad_batches changed from 3 to 2 at batch 0 while 1 batches"),
            std::string::npos);
}

}  // namespace
