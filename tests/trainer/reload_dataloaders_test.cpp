// reload_dataloaders_every_n_epochs: the Trainer asks the DataModule for new loaders every N
// epochs, telling it the epoch (a curriculum that grows the data set), also across a resume.
#include <gtest/gtest.h>

#include <algorithm>

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

/// Validation data that grows with the epoch it is built for (16 x (epoch + 1) samples, at most
/// 64), so a validation's loss tells which epoch's loaders it ran on.
class GrowingValidation : public Curriculum {
 public:
  c10::optional<volt::DataLoader> val_dataloader() override {
    val_epochs.push_back(current_epoch());
    const int64_t n = std::min<int64_t>(16 * (current_epoch() + 1), 64);
    return volt::DataLoader(std::make_shared<volt::TensorDataset>(val_->inputs().slice(0, 0, n),
                                                                  val_->targets().slice(0, 0, n)),
                            volt::DataLoaderOptions(16));
  }

 private:
  std::shared_ptr<volt::TensorDataset> val_ = volt_test::blobs(64, 8, 3);
};

// Lightning's schedule for the validation loaders (_should_reload_val_dl): rebuilt at a
// validation N or more epochs after their last build, not with the training loader. With
// check_val_every_n_epoch=3 and N=2 the fit validates at epochs 2, 5 and 8 and rebuilds them
// there (epoch 0 validates nothing, so the build as fit starts does not count); the training
// loader at 0, 2, 4, 6, 8. Before session 110 the validation loaders went with the training
// loader (0, 2, 4, 6, 8): epoch 5 validated on epoch 4's data.
TEST(ReloadDataloaders, ValidationLoadersReloadAtValidationsNEpochsApartAsLightnings) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  GrowingValidation data;
  volt::Trainer(
      quiet(dir.path).max_epochs(9).reload_dataloaders_every_n_epochs(2).check_val_every_n_epoch(3))
      .fit(model, data);
  EXPECT_EQ(data.train_epochs, (std::vector<int64_t>{0, 2, 4, 6, 8}));
  EXPECT_EQ(data.val_epochs, (std::vector<int64_t>{0, 2, 5, 8}));
}

// The validation loaders' last build is checkpointed: with check_val_every_n_epoch=2 and N=3 the
// fit validates at epochs 1 and 3 on loaders built at epoch 1. A fit resumed after epoch 1
// builds those again (its training loader is epoch 0's until epoch 3) and its epoch-3 validation
// gives the uninterrupted fit's loss (had it followed the training loader's schedule, it would
// have validated on epoch 0's data).
TEST(ReloadDataloaders, AResumedFitValidatesOnTheLoadersOfTheirLastBuild) {
  volt_test::TempDir dir;
  const auto opts = [&](int64_t epochs) {
    return quiet(dir.path)
        .max_epochs(epochs)
        .reload_dataloaders_every_n_epochs(3)
        .check_val_every_n_epoch(2);
  };
  torch::manual_seed(5);
  volt_test::TinyClassifier whole_model;
  GrowingValidation whole;
  volt::Trainer whole_trainer(opts(4));
  whole_trainer.fit(whole_model, whole);
  EXPECT_EQ(whole.val_epochs, (std::vector<int64_t>{0, 1}));

  torch::manual_seed(5);
  volt_test::TinyClassifier model;
  GrowingValidation first;
  volt::Trainer t(opts(2));
  t.fit(model, first);
  t.save_checkpoint(dir / "epoch1.ckpt");
  GrowingValidation resumed;
  volt::Trainer rest(opts(4));
  rest.fit(model, resumed, dir / "epoch1.ckpt");
  EXPECT_EQ(resumed.train_epochs, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(resumed.val_epochs, (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(torch::equal(model.flat_params(), whole_model.flat_params()));
  EXPECT_EQ(rest.callback_metrics().at("val_loss"),
            whole_trainer.callback_metrics().at("val_loss"));
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
