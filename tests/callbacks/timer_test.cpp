// Timer: stops fit at its limit (per step or per epoch), measures stages, keeps elapsed time
// across checkpoint/resume.
#include <gtest/gtest.h>

#include "tiny.h"

namespace {

TEST(Timer, ParsesDurationsAndRejectsBadOnes) {
  EXPECT_DOUBLE_EQ(volt::Timer::parse_duration("01:02:03:04"), ((24 + 2) * 60 + 3) * 60 + 4);
  EXPECT_DOUBLE_EQ(volt::Timer::parse_duration("00:00:00:00"), 0.0);
  // The last: more digits than an int64 holds (std::out_of_range escaped before session 22).
  for (const char* bad :
       {"1:2:3", "00:12:00:xx", "", "00:00:-1:00", "99999999999999999999:00:00:00"}) {
    try {
      volt::Timer::parse_duration(bad);
      FAIL() << bad;
    } catch (const volt::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("DD:HH:MM:SS"), std::string::npos);
    }
  }
  EXPECT_THROW(volt::Timer(volt::TimerOptions().duration_s(-1.0)), volt::ConfigError);
}

TEST(Timer, StopsAfterTheFirstStepOrEpochWhenTheLimitIsReached) {
  volt_test::TempDir dir;
  {
    volt_test::TinyClassifier model;
    auto timer =
        std::make_shared<volt::Timer>(volt::TimerOptions().duration_s(1e-6).verbose(false));
    volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(5).callbacks({timer}));
    trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
    EXPECT_EQ(trainer.state().global_step, 1);
    EXPECT_GT(timer->time_elapsed(volt::Stage::kFit), 0.0);
    EXPECT_LE(timer->time_remaining(), 0.0);
  }
  {
    volt_test::TinyClassifier model;
    auto timer = std::make_shared<volt::Timer>(
        volt::TimerOptions().duration_s(1e-6).interval(volt::Interval::kEpoch).verbose(false));
    volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(5).callbacks({timer}));
    trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
    EXPECT_EQ(trainer.state().global_step, 8);  // one full epoch of 8 batches
    trainer.save_checkpoint(dir / "spent.ckpt");
  }
  // Resumed with its time spent, the fit trains no further (Lightning's on_fit_start check);
  // it trained another epoch past the limit. A duration of 0 trains nothing, as there.
  for (const double duration : {1e-6, 0.0}) {
    volt_test::TinyClassifier model;
    auto timer = std::make_shared<volt::Timer>(
        volt::TimerOptions().duration_s(duration).interval(volt::Interval::kEpoch).verbose(false));
    volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(5).callbacks({timer}));
    trainer.fit(model, volt_test::loader(volt_test::blobs(128)), c10::nullopt,
                duration > 0 ? dir / "spent.ckpt" : std::string());
    EXPECT_EQ(trainer.state().global_step, duration > 0 ? 8 : 0) << duration;
  }
}

TEST(Timer, MeasuresStagesAndRestoresElapsedTime) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto timer = std::make_shared<volt::Timer>(volt::TimerOptions().duration_s(3600.0));
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(2).callbacks({timer}));
  auto data = volt_test::loader(volt_test::blobs(128));
  trainer.fit(model, data, volt_test::loader(volt_test::blobs(32), 16, false));
  const double fit = timer->time_elapsed(volt::Stage::kFit);
  EXPECT_GT(fit, 0.0);
  EXPECT_GT(timer->time_elapsed(volt::Stage::kValidate), 0.0);
  EXPECT_EQ(timer->time_elapsed(volt::Stage::kTest), 0.0);
  EXPECT_NEAR(timer->time_remaining(), 3600.0 - fit, 1e-6);
  torch::serialize::OutputArchive ar;
  timer->save_state(ar);
  std::ostringstream os;
  ar.save_to(os);
  std::istringstream is(os.str());
  torch::serialize::InputArchive in;
  in.load_from(is);
  volt::Timer resumed(volt::TimerOptions().duration_s(3600.0));
  resumed.load_state(in);
  EXPECT_DOUBLE_EQ(resumed.time_elapsed(volt::Stage::kFit), fit);
}

}  // namespace
