// SimpleProfiler on a real run: every loop stage and hook is timed, counts match the loop, the
// report lands in the run folder, and a report that cannot be written never fails the run.

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "file_text.h"
#include "log_capture.h"
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
  const std::string report = volt_test::file_text(path);
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
  const std::string report = volt_test::file_text(prof->last_report_path());
  for (const char* action :
       {"[Module]on_test_epoch_start", "[Module]on_test_epoch_end", "test_step"}) {
    EXPECT_NE(report.find(action), std::string::npos) << action << "\n" << report;
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

// The ranks of a job share the log folder: each writes its own report (rank 0 the name a single
// process uses), and a printed report comes from rank 0 alone. Before session 81 every rank
// wrote <stage>-<filename>.txt over the others' and printed its table to the shared terminal.
TEST(SimpleProfiler, EachRankWritesItsOwnReportAndOnlyRankZeroPrints) {
  volt_test::TempDir dir;
  for (int64_t rank : {0, 1, 3}) {
    volt::SimpleProfiler p(volt::SimpleProfilerOptions().filename("perf"));
    p.setup("fit", rank, dir.path);
    p.start("step");
    p.stop("step");
    p.describe("fit", dir.path);
    EXPECT_EQ(p.last_report_path(),
              dir / (rank == 0 ? std::string("fit-perf.txt")
                               : "fit-perf-rank" + std::to_string(rank) + ".txt"));
    EXPECT_TRUE(std::ifstream(p.last_report_path()).good());
  }
  for (int64_t rank : {0, 1}) {
    volt::SimpleProfiler printed;
    printed.setup("fit", rank, dir.path);
    printed.start("step");
    printed.stop("step");
    testing::internal::CaptureStderr();
    printed.describe("fit", dir.path);
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(err.find("FIT Profiler Report") != std::string::npos, rank == 0) << err;
  }
}

// Lightning's SimpleProfiler opens its report file to append: a second run writing to the same
// folder (two fits of one Trainer, or runs without a logger sharing default_root_dir) adds its
// report after the first one's, which volt replaced.
TEST(SimpleProfiler, ALaterRunsReportIsAppendedToTheEarlierOnes) {
  volt_test::TempDir dir;
  for (const char* action : {"first_run", "second_run"}) {
    volt::SimpleProfiler p(volt::SimpleProfilerOptions().filename("perf"));
    p.setup("fit", 0, dir.path);
    p.start(action);
    p.stop(action);
    p.describe("fit", dir.path);
  }
  const std::string text = volt_test::file_text(dir / "fit-perf.txt");
  EXPECT_NE(text.find("first_run"), std::string::npos) << text;
  EXPECT_NE(text.find("second_run"), std::string::npos) << text;
  EXPECT_LT(text.find("first_run"), text.find("second_run")) << text;
}

// A row is the action's name and 75 characters: names of 184 characters or more overflowed the
// 256-byte line buffer, losing the row's numbers and its newline (the next row ran into it). A
// region never stopped is not in the report, and is said so.
TEST(SimpleProfiler, LongNamesKeepTheirRowsAndARegionLeftOpenIsWarnedAbout) {
  volt_test::TempDir dir;
  const std::string long_name(200, 'n');
  volt::SimpleProfiler p(volt::SimpleProfilerOptions().filename("perf"));
  p.setup("fit", 0, dir.path);
  p.start(long_name);
  p.stop(long_name);
  p.start("short");
  p.stop("short");
  p.start("left_open");
  const auto lines = volt_test::capture_logs([&] { p.describe("fit", dir.path); });
  EXPECT_TRUE(volt_test::has(lines, "regions started but never stopped: \"left_open\""))
      << lines.size();
  const std::string text = volt_test::file_text(dir / "fit-perf.txt");
  int rows = 0;
  size_t at = 0;
  for (std::string line; at < text.size(); at += line.size() + 1) {
    line = text.substr(at, text.find('\n', at) - at);
    if (line.rfind(long_name, 0) == 0 || line.rfind("short ", 0) == 0) {
      ++rows;
      EXPECT_NE(line.find('%'), std::string::npos) << line;  // the row ends with its share
      EXPECT_EQ(line.find("short", 1), std::string::npos) << line;
    }
  }
  EXPECT_EQ(rows, 2) << text;
}

// A module that stops an action the Trainer opened breaks the Trainer's own stop of it. Before
// session 81 that stop ran in a destructor and threw: std::terminate ended the process. Now a
// hook's action fails the run with the ProfilerError, and the step's (timed by a scope guard)
// is logged and the run goes on.
TEST(SimpleProfiler, AModuleStoppingATrainerActionIsAnErrorNotAnAbort) {
  struct StopsItsHook : volt_test::TinyClassifier {
    void on_train_epoch_start() override { profiler().stop("[Module]on_train_epoch_start"); }
  };
  struct StopsItsStep : volt_test::TinyClassifier {
    torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
      profiler().stop("training_step");
      return volt_test::TinyClassifier::training_step(b, i);
    }
  };
  volt_test::TempDir dir;
  {
    StopsItsHook model;
    volt::Trainer trainer(options(dir / "hook", std::make_shared<volt::SimpleProfiler>()));
    EXPECT_THROW(trainer.fit(model, volt_test::loader(volt_test::blobs(32))), volt::ProfilerError);
  }
  StopsItsStep model;
  volt::Trainer trainer(
      options(dir / "step", std::make_shared<volt::SimpleProfiler>()).max_epochs(1));
  const auto logs =
      volt_test::capture_logs([&] { trainer.fit(model, volt_test::loader(volt_test::blobs(32))); });
  EXPECT_EQ(trainer.state().status, volt::RunStatus::kFinished);
  EXPECT_TRUE(volt_test::has(logs, "stop(\"training_step\") without a matching start"))
      << logs.size();
}

}  // namespace
