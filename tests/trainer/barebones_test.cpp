// TrainerOptions::barebones (Lightning's Trainer(barebones=True)): the features that may cost
// speed are off, a fit trains as one with them switched off by hand, and asking for any of them
// anyway is a ConfigError.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "error_text.h"
#include "log_capture.h"
#include "tiny.h"

namespace {

using volt_test::TinyClassifier;

/// Counts validation batches (the sanity check's included) and logs nothing.
class Silent : public TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    return torch::cross_entropy_loss(forward(b.input), b.target);
  }
  void validation_step(const volt::Batch&, int64_t) override { ++val_batches; }
  int64_t val_batches = 0;
};

int64_t files_under(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) n += e.is_regular_file();
  return n;
}

TEST(Barebones, TurnsOffWhatCostsSpeedAndTrainsAsTheSameFitWithThemOffByHand) {
  volt_test::TempDir dir;
  const auto fit = [&](const volt::TrainerOptions& options) {
    torch::manual_seed(2);
    Silent model;
    volt::Trainer t(options);
    std::vector<std::string> lines = volt_test::capture_logs([&] {
      t.fit(model, volt_test::loader(volt_test::blobs(64)),
            volt_test::loader(volt_test::blobs(32)));
    });
    EXPECT_EQ(t.state().global_step, 8);
    EXPECT_EQ(model.val_batches, 4);  // 2 epochs of 2 batches: no sanity check
    return std::make_pair(model.flat_params(), lines);
  };
  const auto bare = fit(volt::TrainerOptions()
                            .accelerator("cpu")
                            .default_root_dir(dir / "bare")
                            .max_epochs(2)
                            .seed(1)
                            .barebones(true));
  EXPECT_FALSE(std::filesystem::exists(dir / "bare"));  // no checkpoint, no log folder
  for (const auto& line : bare.second) {
    EXPECT_EQ(line.find("Total params"), std::string::npos) << "a model summary: " << line;
  }
  std::filesystem::create_directories(dir / "by_hand");
  const auto by_hand = fit(volt::TrainerOptions()
                               .accelerator("cpu")
                               .default_root_dir(dir / "by_hand")
                               .max_epochs(2)
                               .seed(1)
                               .enable_checkpointing(false)
                               .logger(false)
                               .enable_progress_bar(false)
                               .enable_model_summary(false)
                               .num_sanity_val_steps(0)
                               .detect_nonfinite_loss(false));
  EXPECT_EQ(files_under(dir / "by_hand"), 0);
  EXPECT_TRUE(bare.first.equal(by_hand.first));
  // Without it the defaults write a checkpoint and a CSV log, summarise the model and run the
  // sanity check.
  Silent model;
  volt::Trainer t(volt_test::quiet(dir / "full")
                      .max_epochs(2)
                      .enable_checkpointing(true)
                      .logger(true)
                      .enable_model_summary(true)
                      .num_sanity_val_steps(2));
  const auto lines = volt_test::capture_logs([&] {
    t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
  });
  EXPECT_EQ(model.val_batches, 6);
  EXPECT_GE(files_under(dir / "full"), 2);
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("Total params") != std::string::npos;
  }));
}

TEST(Barebones, LoggingAndFeaturesThatCostSpeedAreConfigErrors) {
  volt_test::TempDir dir;
  const auto bare = [&] {
    return volt::TrainerOptions().accelerator("cpu").default_root_dir(dir.path).barebones(true);
  };
  const auto refused = [&](volt::TrainerOptions options, const std::string& phrase) {
    const std::string what =
        volt_test::error_of<volt::ConfigError>([&] { volt::Trainer t(std::move(options)); });
    EXPECT_NE(what.find("[Trainer] barebones=true with " + phrase), std::string::npos) << what;
    EXPECT_NE(what.find("drop one of the two"), std::string::npos) << what;
  };
  refused(bare().enable_checkpointing(true), "enable_checkpointing=true");
  refused(bare().logger(true), "logger=true");
  refused(bare().loggers({std::make_shared<volt_test::MemoryLogger>()}), "a logger in loggers");
  refused(bare().enable_progress_bar(true), "enable_progress_bar=true");
  refused(bare().enable_model_summary(true), "enable_model_summary=true");
  refused(bare().num_sanity_val_steps(2), "num_sanity_val_steps != 0");
  refused(bare().detect_nonfinite_loss(true), "detect_nonfinite_loss=true");
  refused(bare().fast_dev_run(1), "fast_dev_run > 0");
  refused(bare().detect_anomaly(true), "detect_anomaly=true");
  refused(bare().profiler(std::make_shared<volt::SimpleProfiler>()), "a profiler");
  refused(bare().callbacks({std::make_shared<volt::ModelCheckpoint>()}),
          "a ModelCheckpoint in callbacks");
  refused(bare().callbacks({std::make_shared<volt::ProgressBar>()}), "a ProgressBar in callbacks");
  // barebones(false) leaves every setting as it was.
  EXPECT_TRUE(volt::TrainerOptions().barebones(false).enable_checkpointing());
  // Other callbacks run.
  volt::Trainer(bare().max_steps(1).callbacks({std::make_shared<volt::ModelSummary>()}));

  // TinyClassifier logs its loss: as Lightning's log(), a warning and nothing logged (it was a
  // ConfigError before session 106, so a module that logs could not run barebones).
  TinyClassifier model;
  volt::Trainer t(bare().max_steps(2));
  const auto lines =
      volt_test::capture_logs([&] { t.fit(model, volt_test::loader(volt_test::blobs(32))); });
  EXPECT_EQ(t.state().global_step, 2);
  EXPECT_TRUE(volt_test::has(lines,
                             "[Module] log(\"train_loss\") was called, but the Trainer "
                             "runs with barebones=true, where logging is off (it can "
                             "impact raw speed): nothing is logged."));
  EXPECT_TRUE(t.callback_metrics().empty());
}

}  // namespace
