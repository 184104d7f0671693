// SimpleProfiler on a real run: every loop stage and hook is timed, counts match the loop, the
// report lands in the run folder, and a report that cannot be written never fails the run.

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tiny.h"

namespace {

volt::TrainerOptions options(const std::string& dir, std::shared_ptr<volt::Profiler> p) {
  return volt::TrainerOptions()
      .accelerator("cpu")
      .max_epochs(2)
      .default_root_dir(dir)
      .enable_progress_bar(false)
      .num_sanity_val_steps(0)
      .profiler(std::move(p));
}

TEST(SimpleProfiler, TimesEveryStageAndHookOfAFit) {
  volt_test::TempDir dir;
  auto prof =
      std::make_shared<volt::SimpleProfiler>(volt::SimpleProfilerOptions().filename("perf"));
  volt_test::TinyClassifier model;
  volt::Trainer trainer(options(dir.path, prof));
  // 128 rows / 16 = 8 train batches, 64 / 16 = 4 validation batches, per epoch.
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)),
              volt_test::loader(volt_test::blobs(64, 8, 2), 16, false));
  const std::string path = prof->last_report_path();
  ASSERT_EQ(path, trainer.log_dir() + "/fit-perf.txt");
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string report = ss.str();
  for (const char* action :
       {"training_step", "backward", "optimizer_step", "get_train_batch", "validation_step",
        "get_validation_batch", "[Module]on_train_epoch_start",
        // Module hooks the loops call around the epoch-metric reduction and checkpointing go
        // through the same dispatch point.
        "[Module]on_train_epoch_end", "[Module]on_validation_epoch_end",
        "[Module]on_save_checkpoint",
        "[Callback]ModelCheckpoint{monitor=,mode=min,every_n_train_steps=0,every_n_epochs=1}"
        ".on_validation_end",
        "FIT Profiler Report"}) {
    EXPECT_NE(report.find(action), std::string::npos) << action << "\n" << report;
  }
  // describe() reported and reset; a second report of the same numbers is in the file.
  EXPECT_TRUE(prof->stats().empty());
  auto calls_of = [&](const std::string& action) -> long long {
    std::istringstream l2(report);
    std::string ln;
    while (std::getline(l2, ln)) {
      if (ln.rfind(action + " ", 0) == 0) {
        std::vector<std::string> cols;
        std::stringstream cs(ln);
        std::string c;
        while (std::getline(cs, c, '|')) cols.push_back(c);
        return std::stoll(cols.at(2));
      }
    }
    return -1;
  };
  EXPECT_EQ(calls_of("training_step"), 16);
  EXPECT_EQ(calls_of("optimizer_step"), 16);
  EXPECT_EQ(calls_of("validation_step"), 8);
  EXPECT_EQ(calls_of("get_train_batch"), 18);  // 8 batches + the end-of-stream call, per epoch
}

TEST(SimpleProfiler, TimesTheTestPassModuleHooks) {
  volt_test::TempDir dir;
  auto prof =
      std::make_shared<volt::SimpleProfiler>(volt::SimpleProfilerOptions().filename("perf"));
  volt_test::TinyClassifier model;
  volt::Trainer trainer(options(dir.path, prof));
  trainer.test(model, volt_test::loader(volt_test::blobs(64, 8, 2), 16, false));
  std::ifstream in(prof->last_report_path());
  std::stringstream ss;
  ss << in.rdbuf();
  for (const char* action :
       {"[Module]on_test_epoch_start", "[Module]on_test_epoch_end", "test_step"}) {
    EXPECT_NE(ss.str().find(action), std::string::npos) << action << "\n" << ss.str();
  }
}

TEST(SimpleProfiler, UnwritableReportWarnsAndTheRunSucceeds) {
  volt_test::TempDir dir;
  std::ofstream(dir / "file") << "x";
  auto prof = std::make_shared<volt::SimpleProfiler>(
      volt::SimpleProfilerOptions().dirpath(dir / "file").filename("perf"));
  volt_test::TinyClassifier model;
  volt::Trainer trainer(options(dir.path, prof));
  EXPECT_NO_THROW(trainer.fit(model, volt_test::loader(volt_test::blobs(64))));
  EXPECT_EQ(prof->last_report_path(), "");
  EXPECT_EQ(trainer.state().status, volt::RunStatus::kFinished);
}

TEST(SimpleProfiler, RejectsAFileNameWithAFolder) {
  try {
    volt::SimpleProfiler p(volt::SimpleProfilerOptions().filename("a/b"));
    FAIL();
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("[SimpleProfiler] filename \"a/b\" contains a '/'"),
              std::string::npos);
  }
}

}  // namespace
