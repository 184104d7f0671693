// A module's own loaders (Module::train_dataloader() and the others; Lightning's
// trainer.fit(model)): the entry points given only the module run on them as on the same loaders
// given, fit(module, train) validates on the module's, a DataModule replaces them, reloads and
// BatchSizeFinder ask the module, and a module without them gets an error naming the hook.
#include <gtest/gtest.h>

#include "error_text.h"
#include "log_capture.h"
#include "save_at.h"
#include "tiny.h"
#include "tuner_models.h"

namespace {

using volt_test::quiet;
using volt_test::TempDir;

std::shared_ptr<volt::TensorDataset> train_set() {
  return volt_test::blobs(256, 8, 1);
}
std::shared_ptr<volt::TensorDataset> val_set() {
  return volt_test::blobs(48, 8, 2);
}
volt::DataLoader train_loader(int64_t batch_size = 16) {
  return volt::DataLoader(train_set(), volt::DataLoaderOptions(batch_size).shuffle(true).seed(4));
}
volt::DataLoader val_loader(int64_t batch_size = 16) {
  return volt::DataLoader(val_set(), volt::DataLoaderOptions(batch_size));
}
// Other data than the validation set's, so that a stage asking the wrong hook shows.
volt::DataLoader test_loader() {
  return volt::DataLoader(volt_test::blobs(40, 8, 3), volt::DataLoaderOptions(16));
}
volt::DataLoader predict_loader() {
  return volt::DataLoader(volt_test::blobs(24, 8, 4), volt::DataLoaderOptions(8));
}

/// TinyClassifier that brings its data, recording the epoch of each request (current_epoch()).
template <typename Base = volt_test::TinyClassifier>
class OwnData : public Base {
 public:
  void setup(volt::Stage) override { set_up = true; }
  volt::DataLoader train_dataloader() override {
    asked_before_setup |= !set_up;
    train_epochs.push_back(this->current_epoch());
    return train_loader(batch_size_);
  }
  c10::optional<volt::DataLoader> val_dataloader() override {
    asked_before_setup |= !set_up;
    val_epochs.push_back(this->current_epoch());
    return val_loader(batch_size_);
  }
  c10::optional<volt::DataLoader> test_dataloader() override { return test_loader(); }
  c10::optional<volt::DataLoader> predict_dataloader() override { return predict_loader(); }
  std::vector<int64_t> train_epochs, val_epochs;
  bool set_up = false, asked_before_setup = false;

 protected:
  int64_t batch_size_ = 16;
};

/// OwnData whose batch size BatchSizeFinder may set (Lightning's `model.batch_size`).
class SizedOwnData : public OwnData<volt_test::Hungry> {
 public:
  // Hungry records the validation batches too: none, so that its record ends with the fit's.
  c10::optional<volt::DataLoader> val_dataloader() override { return c10::nullopt; }
  c10::optional<int64_t> batch_size() const override { return batch_size_; }
  void set_batch_size(int64_t b) override { batch_size_ = b; }
};

TEST(ModuleDataloaders, EveryEntryPointRunsOnTheModulesLoadersAsOnTheSameLoadersGiven) {
  TempDir dir;
  torch::manual_seed(3);
  OwnData<> own;
  volt::Trainer t(quiet(dir.path).max_epochs(2).num_sanity_val_steps(2));
  t.fit(own);
  // Asked for once each (no reload), inside the run.
  EXPECT_EQ(own.train_epochs, (std::vector<int64_t>{0}));
  EXPECT_EQ(own.val_epochs, (std::vector<int64_t>{0}));
  EXPECT_FALSE(own.asked_before_setup);
  ASSERT_TRUE(t.callback_metrics().count("val_loss"));

  torch::manual_seed(3);
  volt_test::TinyClassifier given;
  volt::Trainer g(quiet(dir.path).max_epochs(2).num_sanity_val_steps(2));
  g.fit(given, train_loader(), val_loader());
  EXPECT_TRUE(torch::equal(own.flat_params(), given.flat_params()));
  EXPECT_EQ(t.callback_metrics().at("val_loss"), g.callback_metrics().at("val_loss"));

  // validate / test / predict given only the module.
  volt::Trainer e(quiet(dir.path));
  const volt::Metrics v = e.validate(own);
  EXPECT_EQ(v.at("val_loss"), e.validate(own, val_loader()).at("val_loss"));
  const volt::Metrics ts = e.test(own);
  EXPECT_EQ(ts.at("test_acc"), e.test(own, test_loader()).at("test_acc"));
  const std::vector<at::Tensor> p = e.predict(own);
  const std::vector<at::Tensor> pg = e.predict(own, predict_loader());
  ASSERT_EQ(p.size(), 3u);  // 24 samples in batches of 8
  ASSERT_EQ(p.size(), pg.size());
  for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(torch::equal(p[i], pg[i])) << i;
}

TEST(ModuleDataloaders, FitGivenOnlyATrainingLoaderValidatesOnTheModules) {
  TempDir dir;
  torch::manual_seed(3);
  OwnData<> own;
  volt::Trainer t(quiet(dir.path).max_epochs(2));
  t.fit(own, train_loader());
  EXPECT_TRUE(own.train_epochs.empty());  // the loader given trains
  EXPECT_EQ(own.val_epochs, (std::vector<int64_t>{0}));
  torch::manual_seed(3);
  volt_test::TinyClassifier given;
  volt::Trainer g(quiet(dir.path).max_epochs(2));
  g.fit(given, train_loader(), val_loader());
  EXPECT_TRUE(torch::equal(own.flat_params(), given.flat_params()));
  EXPECT_EQ(t.callback_metrics().at("val_loss"), g.callback_metrics().at("val_loss"));

  // A validation limit of 0: no validation loader is asked for (Lightning's setup_data).
  OwnData<> off;
  volt::Trainer(quiet(dir.path).max_epochs(1).limit_val_batches(0)).fit(off, train_loader());
  volt::Trainer(quiet(dir.path).max_epochs(1).limit_val_batches(0)).fit(off);
  EXPECT_TRUE(off.val_epochs.empty());
  EXPECT_EQ(off.train_epochs, (std::vector<int64_t>{0}));

  // An empty list of validation loaders is no validation.
  OwnData<> none;
  volt::Trainer n(quiet(dir.path).max_epochs(1));
  n.fit(none, train_loader(), std::vector<volt::DataLoader>{});
  EXPECT_TRUE(none.val_epochs.empty());
  EXPECT_FALSE(n.callback_metrics().count("val_loss"));

  // Under reload_dataloaders_every_n_epochs the module's validation loaders are rebuilt on
  // their schedule; the training loader given is not asked for again.
  OwnData<> reloaded;
  volt::Trainer r(quiet(dir.path).max_epochs(4).reload_dataloaders_every_n_epochs(2));
  r.fit(reloaded, train_loader());
  EXPECT_TRUE(reloaded.train_epochs.empty());
  EXPECT_EQ(reloaded.val_epochs, (std::vector<int64_t>{0, 2}));
}

TEST(ModuleDataloaders, ADataModuleReplacesTheModulesLoaders) {
  TempDir dir;
  OwnData<> own;
  volt_test::SizedData data(64, 16);
  volt::Trainer t(quiet(dir.path).max_epochs(1));
  t.fit(own, data);
  t.validate(own, data);
  EXPECT_TRUE(own.train_epochs.empty());
  EXPECT_TRUE(own.val_epochs.empty());
  EXPECT_TRUE(t.callback_metrics().count("val_loss"));
}

TEST(ModuleDataloaders, ReloadsAskTheModuleAtTheEpochsTheyAreFor) {
  TempDir dir;
  OwnData<> own;
  volt::Trainer(quiet(dir.path).max_epochs(5).reload_dataloaders_every_n_epochs(2)).fit(own);
  EXPECT_EQ(own.train_epochs, (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(own.val_epochs, (std::vector<int64_t>{0, 2, 4}));
}

TEST(ModuleDataloaders, AFitOnTheModulesLoadersResumesExactlyAndItsCheckpointsHoldNoDataModule) {
  TempDir dir;
  torch::manual_seed(9);
  OwnData<> whole;
  volt::Trainer(quiet(dir.path).max_epochs(3).callbacks(
                    {std::make_shared<volt_test::SaveAt>(1, 2, dir / "mid.ckpt")}))
      .fit(whole);
  torch::manual_seed(9);
  OwnData<> resumed;
  volt::Trainer(quiet(dir.path).max_epochs(3)).fit(resumed, dir / "mid.ckpt");
  EXPECT_TRUE(torch::equal(resumed.flat_params(), whole.flat_params()));
  // No DataModule entry, where a DataModule's run writes one.
  torch::serialize::InputArchive entry;
  EXPECT_FALSE(volt::TorchCheckpointIO().load(dir / "mid.ckpt").try_read("datamodule", entry));
  volt_test::SizedData data(64, 16);
  volt::Trainer(quiet(dir.path).max_epochs(1).callbacks(
                    {std::make_shared<volt_test::SaveAt>(0, -1, dir / "data.ckpt")}))
      .fit(resumed, data);
  EXPECT_TRUE(volt::TorchCheckpointIO().load(dir / "data.ckpt").try_read("datamodule", entry));
}

TEST(ModuleDataloaders, BatchSizeFinderSizesTheModulesLoaders) {
  TempDir dir;
  // As BatchSizeFinder.TheFitRunsAtTheSizeFoundAndAResumeKeepsIt: 10 MiB hold 32 samples'
  // scratch of Hungry, not 64.
  SizedOwnData own;
  auto finder = std::make_shared<volt::BatchSizeFinder>(
      volt::BatchSizeFinderOptions().max_memory_bytes(10 * volt_test::kMiB));
  volt::Trainer(quiet(dir.path).max_epochs(1).callbacks({finder})).fit(own);
  EXPECT_EQ(finder->optimal_batch_size(), c10::optional<int64_t>(32));
  EXPECT_EQ(own.batch_size(), c10::optional<int64_t>(32));
  // 256 samples: the epoch ran 8 batches of 32 after the trials.
  ASSERT_GE(own.sizes.size(), 8u);
  EXPECT_EQ(std::vector<int64_t>(own.sizes.end() - 8, own.sizes.end()),
            std::vector<int64_t>(8, 32));

  // The tuner's own form (Lightning's Tuner.scale_batch_size(model)).
  SizedOwnData direct;
  const volt::BatchSizeFinderResult found =
      volt::scale_batch_size(direct, quiet(dir.path),
                             volt::BatchSizeFinderOptions().max_memory_bytes(10 * volt_test::kMiB));
  EXPECT_EQ(found.batch_size, 32);
  EXPECT_EQ(direct.batch_size(), c10::optional<int64_t>(32));

  // A module that does not say its batch size.
  OwnData<> unsized;
  const std::string e = volt_test::error_of<volt::ConfigError>([&] {
    volt::Trainer(
        quiet(dir.path).max_epochs(1).callbacks({std::make_shared<volt::BatchSizeFinder>()}))
        .fit(unsized);
  });
  EXPECT_TRUE(volt_test::has(e,
                             "module (whose loaders the run uses) does not say its batch size; "
                             "override Module::batch_size()"))
      << e;
  EXPECT_TRUE(
      volt_test::has(volt_test::error_of<volt::ConfigError>([&] { unsized.set_batch_size(4); }),
                     "[Module] this module's batch size cannot be set"));
}

TEST(ModuleDataloaders, LrFindRunsOnTheModulesTrainingLoader) {
  TempDir dir;
  torch::manual_seed(2);
  OwnData<> own;
  const volt::LrFinderResult a = volt::lr_find(own, quiet(dir.path));
  EXPECT_FALSE(own.train_epochs.empty());
  torch::manual_seed(2);
  volt_test::TinyClassifier given;
  const volt::LrFinderResult b = volt::lr_find(given, train_loader(), quiet(dir.path));
  ASSERT_FALSE(a.losses.empty());
  EXPECT_EQ(a.losses, b.losses);  // the same data, in the same order
}

TEST(ModuleDataloaders, AModuleWithoutLoadersGetsAnErrorNamingTheHook) {
  TempDir dir;
  volt_test::TinyClassifier plain;
  volt::Trainer t(quiet(dir.path).max_epochs(1));
  const std::string fit = volt_test::error_of<volt::ConfigError>([&] { t.fit(plain); });
  EXPECT_TRUE(volt_test::has(fit,
                             "[Trainer] fit() was given no training data and the module "
                             "defines none; override Module::train_dataloader()"))
      << fit;
  const std::string val = volt_test::error_of<volt::ConfigError>([&] { t.validate(plain); });
  EXPECT_TRUE(volt_test::has(val,
                             "[Trainer] validate() was given no data and the module defines "
                             "none; override Module::val_dataloader()"))
      << val;
  const std::string test = volt_test::error_of<volt::ConfigError>([&] { t.test(plain); });
  EXPECT_TRUE(volt_test::has(test, "override Module::test_dataloader()")) << test;
  const std::string pred = volt_test::error_of<volt::ConfigError>([&] { t.predict(plain); });
  EXPECT_TRUE(volt_test::has(pred, "override Module::predict_dataloader()")) << pred;
  // A fit with its training loader but no validation data anywhere trains without validating.
  t.fit(plain, train_loader());
  EXPECT_FALSE(t.callback_metrics().count("val_loss"));
}

}  // namespace
