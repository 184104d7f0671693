// ckpt_path "last" and "best": resolved through the run's ModelCheckpoint.
#include <gtest/gtest.h>

#include "tiny.h"

namespace {

using volt_test::quiet;
using volt_test::TinyClassifier;

std::shared_ptr<volt::ModelCheckpoint> checkpoint_to(const std::string& dir) {
  return std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                     .dirpath(dir)
                                                     .monitor("val_acc")
                                                     .mode(volt::Mode::kMax)
                                                     .save_last(true));
}

TEST(CheckpointPath, LastResumesFromTheNewestLastCheckpointInANewProcessLikeTrainer) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(64), val = volt_test::blobs(32, 8, 3);
  {
    TinyClassifier model;
    volt::Trainer trainer(quiet(dir.path).max_epochs(2).callbacks({checkpoint_to(dir / "ckpt")}));
    trainer.fit(model, volt_test::loader(train), volt_test::loader(val, 32, false));
    EXPECT_EQ(trainer.state().global_step, 8);
  }
  // A fresh Trainer and model (as after a restart) continue from last.ckpt: epoch 2 only.
  TinyClassifier model;
  volt::Trainer trainer(quiet(dir.path).max_epochs(3).callbacks({checkpoint_to(dir / "ckpt")}));
  trainer.fit(model, volt_test::loader(train), volt_test::loader(val, 32, false), "last");
  EXPECT_EQ(trainer.state().global_step, 12);
  EXPECT_EQ(trainer.state().epoch, 2);
}

TEST(CheckpointPath, LastWithoutACheckpointStartsFreshWithAWarning) {
  volt_test::TempDir dir;
  std::vector<std::string> lines;
  volt::set_log_sink([&](volt::LogLevel level, const std::string& line) {
    if (level == volt::LogLevel::kWarning) lines.push_back(line);
  });
  TinyClassifier model;
  volt::Trainer trainer(quiet(dir.path).max_epochs(1).callbacks({checkpoint_to(dir / "none")}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)), c10::nullopt, "last");
  volt::set_log_sink(nullptr);
  EXPECT_EQ(trainer.state().global_step, 4);
  // Two warnings: this one, and ModelCheckpoint's (its monitor val_acc never comes without
  // validation data, so only last.ckpt is written).
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("no last checkpoint exists; training starts from scratch"),
            std::string::npos)
      << lines[0];
  EXPECT_NE(lines[1].find("monitor \"val_acc\" is not among the logged metrics"), std::string::npos)
      << lines[1];
}

TEST(CheckpointPath, BestLoadsTheBestWeightsForTest) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(128), val = volt_test::blobs(64, 8, 3);
  TinyClassifier model;
  auto ckpt = checkpoint_to(dir / "ckpt");
  volt::Trainer trainer(quiet(dir.path).max_epochs(3).callbacks({ckpt}));
  trainer.fit(model, volt_test::loader(train), volt_test::loader(val, 64, false));
  ASSERT_FALSE(ckpt->best_model_path().empty());
  const double best = *ckpt->best_model_score();
  // Spoil the weights: "best" must bring the best epoch's back.
  {
    torch::NoGradGuard g;
    for (auto& p : model.parameters()) p.zero_();
  }
  auto m = trainer.validate(model, volt_test::loader(val, 64, false), "best");
  EXPECT_DOUBLE_EQ(m.at("val_acc"), best);
}

TEST(CheckpointPath, BestBeforeAnyFitIsAConfigError) {
  volt_test::TempDir dir;
  TinyClassifier model;
  volt::Trainer trainer(quiet(dir.path).callbacks({checkpoint_to(dir / "ckpt")}));
  try {
    trainer.test(model, volt_test::loader(volt_test::blobs(32)), "best");
    FAIL() << "expected ConfigError";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no best checkpoint exists yet"), std::string::npos);
  }
}

TEST(CheckpointPath, LastNeedsAModelCheckpoint) {
  volt_test::TempDir dir;
  TinyClassifier model;
  volt::Trainer trainer(quiet(dir.path).max_epochs(1));  // enable_checkpointing(false)
  try {
    trainer.fit(model, volt_test::loader(volt_test::blobs(32)), c10::nullopt, "last");
    FAIL() << "expected ConfigError";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs a ModelCheckpoint callback"), std::string::npos);
  }
}

}  // namespace
