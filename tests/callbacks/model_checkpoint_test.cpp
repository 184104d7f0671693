#include <gtest/gtest.h>

#include <fstream>

#include "tiny.h"

namespace {

// Logs a scripted validation score per epoch: 5, 3, 4, 1, 2.
class Scripted : public volt_test::TinyClassifier {
 public:
  void validation_step(const volt::Batch&, int64_t) override {
    static const double s[] = {5, 3, 4, 1, 2, 6, 7, 8};
    log("score", s[current_epoch()]);
  }
};

bool exists(const std::string& p) { return std::ifstream(p).good(); }

TEST(ModelCheckpoint, KeepsTopKAndTracksBest) {
  volt_test::TempDir dir;
  Scripted model;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
      .dirpath(dir / "c").monitor("score").save_top_k(2).filename("{epoch}-{score:.1f}")
      .save_last(true));
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(5).callbacks({ckpt}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(ckpt->best_model_path(), dir / "c/epoch=3-score=1.0.ckpt");
  EXPECT_DOUBLE_EQ(*ckpt->best_model_score(), 1.0);
  EXPECT_EQ(ckpt->best_k_models().size(), 2u);
  EXPECT_TRUE(exists(dir / "c/epoch=3-score=1.0.ckpt"));
  EXPECT_TRUE(exists(dir / "c/epoch=4-score=2.0.ckpt"));
  EXPECT_FALSE(exists(dir / "c/epoch=1-score=3.0.ckpt"));
  EXPECT_FALSE(exists(dir / "c/epoch=0-score=5.0.ckpt"));
  EXPECT_TRUE(exists(dir / "c/last.ckpt"));
  // The best checkpoint loads into a fresh module for testing.
  Scripted fresh;
  volt::Trainer t2(volt_test::quiet(dir.path));
  EXPECT_NO_THROW(t2.test(fresh, volt_test::loader(volt_test::blobs(32)), ckpt->best_model_path()));
  EXPECT_TRUE(fresh.flat_params().defined());
}

TEST(ModelCheckpoint, EveryNTrainStepsWithoutMonitorKeepsLatest) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir.path).every_n_train_steps(4));
  volt::Trainer t(volt_test::quiet(dir.path).max_steps(10).callbacks({ckpt}));
  t.fit(model, volt_test::loader(volt_test::blobs(160)));
  EXPECT_EQ(ckpt->best_model_path(), dir / "epoch=0-step=8.ckpt");
  EXPECT_FALSE(exists(dir / "epoch=0-step=4.ckpt"));
}

TEST(ModelCheckpoint, FilenameTemplate) {
  volt::ModelCheckpoint c(volt::ModelCheckpointOptions().filename("{epoch:02d}-{val/loss:.3f}-x"));
  EXPECT_EQ(c.format_filename({{"val/loss", 0.12345}}, 3, 100), "epoch=03-val_loss=0.123-x");
  EXPECT_THROW(c.format_filename({}, 0, 0), volt::ConfigError);
}

TEST(ModelCheckpoint, InvalidOptions) {
  EXPECT_THROW(volt::ModelCheckpoint(volt::ModelCheckpointOptions().save_top_k(-2)), volt::ConfigError);
  EXPECT_THROW(volt::ModelCheckpoint(volt::ModelCheckpointOptions().save_top_k(3)), volt::ConfigError);
  EXPECT_THROW(volt::ModelCheckpoint(volt::ModelCheckpointOptions().every_n_train_steps(-1)),
               volt::ConfigError);
}

}  // namespace
