// reload_dataloaders_every_n_epochs: the Trainer asks the DataModule for new loaders every N
// epochs, telling it the epoch (a curriculum that grows the data set), also across a resume.
#include <gtest/gtest.h>

#include "error_text.h"
#include "tiny.h"

namespace {

using volt_test::quiet;

/// Epochs 0 and 1 train on the first 32 samples, later epochs on all 64; records the epoch of
/// each loader request.
class Curriculum : public volt::DataModule {
 public:
  volt::DataLoader train_dataloader() override {
    train_epochs.push_back(current_epoch());
    const int64_t n = current_epoch() < 2 ? 32 : 64;
    return volt::DataLoader(std::make_shared<volt::TensorDataset>(all_->inputs().slice(0, 0, n),
                                                                  all_->targets().slice(0, 0, n)),
                            volt::DataLoaderOptions(16).shuffle(true).seed(1));
  }
  c10::optional<volt::DataLoader> val_dataloader() override {
    val_epochs.push_back(current_epoch());
    return volt::DataLoader(all_, volt::DataLoaderOptions(32));
  }
  std::vector<int64_t> train_epochs, val_epochs;

 private:
  std::shared_ptr<volt::TensorDataset> all_ = volt_test::blobs(64);
};

/// The batches each epoch trained on.
class EpochBatches : public volt::Callback {
 public:
  std::string state_key() const override { return "EpochBatches"; }
  void on_train_epoch_end(volt::RunContext& run, volt::Module&) override {
    batches.push_back(run.state().num_training_batches);
  }
  std::vector<int64_t> batches;
};

TEST(ReloadDataloaders, EveryNEpochsTheDataModuleBuildsTheLoadersOfThatEpoch) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  Curriculum data;
  auto batches = std::make_shared<EpochBatches>();
  volt::Trainer(
      quiet(dir.path).max_epochs(5).reload_dataloaders_every_n_epochs(2).callbacks({batches}))
      .fit(model, data);
  EXPECT_EQ(data.train_epochs, (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(data.val_epochs, (std::vector<int64_t>{0, 2, 4}));
  // From epoch 2 the curriculum's bigger data set: 4 batches of 16 instead of 2.
  EXPECT_EQ(batches->batches, (std::vector<int64_t>{2, 2, 4, 4, 4}));

  // Off (the default): one request when fit starts.
  Curriculum once;
  auto b2 = std::make_shared<EpochBatches>();
  volt::Trainer(quiet(dir.path).max_epochs(3).callbacks({b2})).fit(model, once);
  EXPECT_EQ(once.train_epochs, (std::vector<int64_t>{0}));
  EXPECT_EQ(b2->batches, (std::vector<int64_t>{2, 2, 2}));
}

TEST(ReloadDataloaders, AResumedFitUsesTheLoadersTheUninterruptedFitWouldAndEndsBitForBit) {
  volt_test::TempDir dir;
  const auto opts = [&] { return quiet(dir.path).reload_dataloaders_every_n_epochs(2); };
  torch::manual_seed(5);
  volt_test::TinyClassifier whole_model;
  Curriculum whole;
  volt::Trainer(opts().max_epochs(6)).fit(whole_model, whole);
  EXPECT_EQ(whole.train_epochs, (std::vector<int64_t>{0, 2, 4}));

  torch::manual_seed(5);
  volt_test::TinyClassifier model;
  Curriculum first;
  volt::Trainer t(opts().max_epochs(3));
  t.fit(model, first);
  EXPECT_EQ(first.train_epochs, (std::vector<int64_t>{0, 2}));
  t.save_checkpoint(dir / "epoch2.ckpt");  // after epoch 2: the resumed fit starts at epoch 3

  Curriculum resumed;
  auto batches = std::make_shared<EpochBatches>();
  volt::Trainer(opts().max_epochs(6).callbacks({batches})).fit(model, resumed, dir / "epoch2.ckpt");
  // Built once as fit starts, then for epoch 2, whose loaders the uninterrupted fit trained
  // epoch 3 with, then at epoch 4 as it did (Lightning would count from 3: 3, 5).
  EXPECT_EQ(resumed.train_epochs, (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(batches->batches, (std::vector<int64_t>{4, 4, 4}));  // epochs 3, 4 and 5
  EXPECT_TRUE(torch::equal(model.flat_params(), whole_model.flat_params()));
}

TEST(ReloadDataloaders, LoadersGivenDirectlyServeEveryEpochAndANegativeNIsAConfigError) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto batches = std::make_shared<EpochBatches>();
  volt::Trainer(
      quiet(dir.path).max_epochs(3).reload_dataloaders_every_n_epochs(1).callbacks({batches}))
      .fit(model, volt_test::loader(volt_test::blobs(48), 16));
  EXPECT_EQ(batches->batches, (std::vector<int64_t>{3, 3, 3}));
  const std::string e = volt_test::error_of<volt::ConfigError>(
      [&] { volt::Trainer(quiet(dir.path).reload_dataloaders_every_n_epochs(-1)); });
  EXPECT_NE(e.find("reload_dataloaders_every_n_epochs=-1 must be >= 0"), std::string::npos) << e;
}

}  // namespace
