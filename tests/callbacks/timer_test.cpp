// Timer: stops fit at its limit (per step or per epoch), measures stages, keeps elapsed time
// across checkpoint/resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <regex>

#include "log_capture.h"
#include "tiny.h"

namespace {

TEST(Timer, ParsesDurationsAndRejectsBadOnes) {
  EXPECT_DOUBLE_EQ(volt::Timer::parse_duration("01:02:03:04"), ((24 + 2) * 60 + 3) * 60 + 4);
  EXPECT_DOUBLE_EQ(volt::Timer::parse_duration("00:00:00:00"), 0.0);
  // The last: more digits than an int64 holds (std::out_of_range escaped before session 22).
  // Lightning's pattern, (\d+):(\d\d):(\d\d):(\d\d): days of any length, two digits after.
  EXPECT_DOUBLE_EQ(volt::Timer::parse_duration("123:00:00:01"), 123 * 86400.0 + 1);
  for (const char* bad :
       {"1:2:3", "00:12:00:xx", "", "00:00:-1:00", "99999999999999999999:00:00:00", "1:2:3:4",
        "00:120:00:00", "00:1:00:00", "00:00:00:000"}) {
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
    EXPECT_LE(*timer->time_remaining(), 0.0);
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
  EXPECT_NEAR(*timer->time_remaining(), 3600.0 - fit, 1e-6);
  EXPECT_NEAR(*timer->time_remaining(volt::Stage::kValidate),
              3600.0 - timer->time_elapsed(volt::Stage::kValidate), 1e-6);
  EXPECT_FALSE(volt::Timer().time_remaining().has_value());  // no duration: none
  // Each stage's start and end (training: on_train_start to on_train_end).
  ASSERT_TRUE(timer->start_time() && timer->end_time());
  EXPECT_NEAR(std::chrono::duration<double>(*timer->end_time() - *timer->start_time()).count(), fit,
              1e-6);
  ASSERT_TRUE(timer->start_time(volt::Stage::kValidate).has_value());
  EXPECT_FALSE(timer->start_time(volt::Stage::kTest).has_value());
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

TEST(Timer, VerboseSaysLightningsLineWhenItStops) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto timer = std::make_shared<volt::Timer>(volt::TimerOptions().duration_s(1e-6));
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(5).callbacks({timer}));
  const auto lines = volt_test::capture_logs(
      [&] { trainer.fit(model, volt_test::loader(volt_test::blobs(128))); });
  const std::regex said(
      R"(\[Timer\] Time limit reached\. Elapsed time is \d+:\d\d:\d\d\. Signaling Trainer to stop\.)");
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
    return std::regex_search(l, said);
  })) << ::testing::PrintToString(lines);
}

// Lightning's callback connector: with a Timer among the callbacks, Trainer max_time is ignored
// (said once); max_time 0 is accepted ("00:00:00:00") and trains nothing.
TEST(Timer, ATimerCallbackOverridesMaxTime) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto timer = std::make_shared<volt::Timer>(volt::TimerOptions().duration_s(3600.0));
  std::unique_ptr<volt::Trainer> trainer;
  const auto lines = volt_test::capture_logs([&] {
    trainer = std::make_unique<volt::Trainer>(
        volt_test::quiet(dir.path).max_epochs(2).max_time(1e-6).callbacks({timer}));
  });
  EXPECT_TRUE(volt_test::has(lines,
                             "ignoring max_time=1e-06 s: the callbacks already contain a "
                             "Timer"))
      << ::testing::PrintToString(lines);
  trainer->fit(model, volt_test::loader(volt_test::blobs(128)));
  EXPECT_EQ(trainer->state().global_step, 16);  // both epochs: max_time stopped nothing

  volt_test::TinyClassifier other;
  volt::Trainer none(volt_test::quiet(dir.path).max_epochs(2).max_time(0.0));
  none.fit(other, volt_test::loader(volt_test::blobs(128)));
  EXPECT_EQ(none.state().global_step, 0);
}

}  // namespace
