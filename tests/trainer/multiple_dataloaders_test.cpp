// Several validation / test / predict loaders (Lightning's list of loaders): each runs in turn,
// its values are named after it, and each entry point returns one result per loader. The
// PredictionWriter's side: tests/callbacks/prediction_writer_test.cpp.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "error_text.h"
#include "log_capture.h"
#include "tiny.h"

namespace {

using volt_test::has;

// Two data sets of different sizes: 3 batches of 16 (the last of 8) and 2 batches of 16.
volt::DataLoader first_loader() {
  return volt_test::loader(volt_test::blobs(40, 8, 1), 16, /*shuffle=*/false);
}
volt::DataLoader second_loader() {
  return volt_test::loader(volt_test::blobs(32, 8, 2), 16, /*shuffle=*/false);
}

/// Logs in every evaluation step and hook that may, and records which loader each batch came
/// from as the step and the batch hooks see it.
class Multi : public volt_test::TinyClassifier {
 public:
  void validation_step(const volt::Batch& b, int64_t idx) override {
    TinyClassifier::validation_step(b, idx);
    steps.push_back({dataloader_idx(), idx});
  }
  void test_step(const volt::Batch& b, int64_t idx) override {
    TinyClassifier::test_step(b, idx);
    steps.push_back({dataloader_idx(), idx});
  }
  torch::Tensor predict_step(const volt::Batch& b, int64_t idx) override {
    steps.push_back({dataloader_idx(), idx});
    return TinyClassifier::predict_step(b, idx);
  }
  void on_validation_batch_start(const volt::Batch&, int64_t idx) override {
    events.push_back("batch " + std::to_string(dataloader_idx()) + "." + std::to_string(idx));
  }
  void on_validation_epoch_start() override { events.push_back("epoch_start"); }
  void on_validation_epoch_end() override {
    events.push_back("epoch_end");
    log("val_epoch_value", 7.0);  // belongs to no loader: in every loader's result
  }
  std::vector<std::pair<int64_t, int64_t>> steps;
  std::vector<std::string> events;
};

TEST(MultipleDataloaders, ValidateRunsEachLoaderInTurnAndNamesItsValuesAfterIt) {
  volt_test::TempDir dir;
  Multi model;
  volt::Trainer trainer(volt_test::quiet(dir.path));
  const std::vector<volt::Metrics> results =
      trainer.validate(model, {first_loader(), second_loader()});
  ASSERT_EQ(results.size(), 2u);
  // One loader after the other, each from batch 0; the epoch hooks once around both.
  EXPECT_EQ(model.events,
            (std::vector<std::string>{"epoch_start", "batch 0.0", "batch 0.1", "batch 0.2",
                                      "batch 1.0", "batch 1.1", "epoch_end"}));
  EXPECT_EQ(model.steps,
            (std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}}));
  EXPECT_EQ(model.dataloader_idx(), 0);  // outside a run
  // Each loader's values are what a pass over that loader alone gives (the weights are the same:
  // validation changes nothing).
  for (int d = 0; d < 2; ++d) {
    const volt::Metrics one = volt::Trainer(volt_test::quiet(dir.path))
                                  .validate(model, d == 0 ? first_loader() : second_loader());
    const std::string suffix = "/dataloader_idx_" + std::to_string(d);
    const std::string other = "/dataloader_idx_" + std::to_string(1 - d);
    const volt::Metrics& r = results[d];
    EXPECT_EQ(r.size(), 3u) << d;  // val_loss, val_acc of its loader and the epoch's value
    EXPECT_DOUBLE_EQ(r.at("val_loss" + suffix), one.at("val_loss")) << d;
    EXPECT_DOUBLE_EQ(r.at("val_acc" + suffix), one.at("val_acc")) << d;
    EXPECT_EQ(r.count("val_loss" + other), 0u) << d;
    EXPECT_EQ(r.count("val_loss"), 0u) << d;
    EXPECT_DOUBLE_EQ(r.at("val_epoch_value"), 7.0) << d;
    // Monitors see every loader's value.
    EXPECT_DOUBLE_EQ(trainer.callback_metrics().at("val_loss" + suffix), one.at("val_loss"));
  }
  EXPECT_NE(results[0].at("val_loss/dataloader_idx_0"), results[1].at("val_loss/dataloader_idx_1"));
}

/// Logs "acc" per loader without the loader's index: under its own name per loader, or (with
/// `same_name`) under one name from both.
class Unsuffixed : public volt_test::TinyClassifier {
 public:
  explicit Unsuffixed(bool same_name) : same_name_(same_name) {}
  void validation_step(const volt::Batch& b, int64_t) override {
    const std::string name = same_name_ ? "acc" : "acc_" + std::to_string(dataloader_idx());
    log(name, forward(b.input).argmax(1).eq(b.target).to(torch::kFloat).mean(),
        volt::LogOptions().add_dataloader_idx(false));
  }

 private:
  bool same_name_;
};

TEST(MultipleDataloaders, AddDataloaderIdxFalseKeepsTheNameAndRefusesOneNameFromTwoLoaders) {
  volt_test::TempDir dir;
  Unsuffixed own(/*same_name=*/false);
  const auto results =
      volt::Trainer(volt_test::quiet(dir.path)).validate(own, {first_loader(), second_loader()});
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].size(), 1u);
  EXPECT_EQ(results[0].count("acc_0"), 1u);
  EXPECT_EQ(results[1].size(), 1u);
  EXPECT_EQ(results[1].count("acc_1"), 1u);

  Unsuffixed same(/*same_name=*/true);
  const std::string e = volt_test::error_of<volt::ConfigError>([&] {
    volt::Trainer(volt_test::quiet(dir.path)).validate(same, {first_loader(), second_loader()});
  });
  EXPECT_TRUE(has(e,
                  "log(\"acc\") with add_dataloader_idx=false from dataloader 1 after "
                  "dataloader 0 logged it"))
      << e;
  EXPECT_TRUE(has(e, "give each loader its own name")) << e;
  // With one loader there is nothing to mix: the name stays as it is.
  const auto one = volt::Trainer(volt_test::quiet(dir.path)).validate(same, first_loader());
  EXPECT_EQ(one.count("acc"), 1u);
}

TEST(MultipleDataloaders, LimitsAndTheSanityCheckCountPerLoader) {
  volt_test::TempDir dir;
  Multi model;
  volt::Trainer(volt_test::quiet(dir.path).limit_val_batches(volt::Limit(2)))
      .validate(model, {first_loader(), second_loader()});
  EXPECT_EQ(model.steps,
            (std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {0, 1}, {1, 0}, {1, 1}}));

  // fit: the sanity check runs num_sanity_val_steps batches of each loader; the validation at the
  // epoch's end runs every loader whole.
  Multi fitted;
  volt::Trainer(volt_test::quiet(dir.path).max_epochs(1).num_sanity_val_steps(1))
      .fit(fitted, volt_test::loader(volt_test::blobs(32)),
           std::vector<volt::DataLoader>{first_loader(), second_loader()});
  EXPECT_EQ(fitted.steps, (std::vector<std::pair<int64_t, int64_t>>{
                              {0, 0}, {1, 0}, {0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}}));
}

TEST(MultipleDataloaders, FitValidatesOnEveryLoaderAndACallbackMonitorsOne) {
  volt_test::TempDir dir;
  Multi model;
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                          .dirpath(dir / "ckpt")
                                                          .monitor("val_loss/dataloader_idx_1")
                                                          .save_top_k(1));
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(2).callbacks({ckpt}).loggers({logger}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(32)),
              std::vector<volt::DataLoader>{first_loader(), second_loader()});
  for (const char* key : {"val_loss/dataloader_idx_0", "val_loss/dataloader_idx_1",
                          "val_acc/dataloader_idx_0", "val_acc/dataloader_idx_1"}) {
    EXPECT_EQ(logger->with(key).size(), 2u) << key;  // once per epoch
    EXPECT_EQ(trainer.callback_metrics().count(key), 1u) << key;
  }
  EXPECT_EQ(logger->with("val_loss").size(), 0u);
  EXPECT_FALSE(ckpt->best_model_path().empty());
  EXPECT_DOUBLE_EQ(
      *ckpt->best_model_score(),
      std::min(
          logger->with("val_loss/dataloader_idx_1")[0].second.at("val_loss/dataloader_idx_1"),
          logger->with("val_loss/dataloader_idx_1")[1].second.at("val_loss/dataloader_idx_1")));
}

// A validation that fails in its second loader leaves the Trainer as it found it: a fit after it
// logs its training values under their own names into the training store. Before, the pass's
// store and loader stayed set: "train_loss" went to the evaluation's store as
// "train_loss/dataloader_idx_1" and was lost at the next validation.
TEST(MultipleDataloaders, AValidationThatFailsLeavesNoLoaderOrStoreBehind) {
  class FailsInTheSecond : public volt_test::TinyClassifier {
   public:
    void validation_step(const volt::Batch& b, int64_t idx) override {
      VOLT_CHECK(!fail || dataloader_idx() == 0, volt::ValueError,
                 "[Test] the second loader fails.");
      TinyClassifier::validation_step(b, idx);
    }
    bool fail = true;
  };
  volt_test::TempDir dir;
  FailsInTheSecond model;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1));
  EXPECT_ANY_THROW(trainer.validate(model, {first_loader(), second_loader()}));
  model.fail = false;
  trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(trainer.callback_metrics().count("train_loss"), 1u);
  EXPECT_EQ(trainer.callback_metrics().count("train_loss/dataloader_idx_1"), 0u);
}

TEST(MultipleDataloaders, TestAndPredictRunEachLoader) {
  volt_test::TempDir dir;
  Multi model;
  const auto tested =
      volt::Trainer(volt_test::quiet(dir.path)).test(model, {first_loader(), second_loader()});
  ASSERT_EQ(tested.size(), 2u);
  EXPECT_DOUBLE_EQ(
      tested[1].at("test_acc/dataloader_idx_1"),
      volt::Trainer(volt_test::quiet(dir.path)).test(model, second_loader()).at("test_acc"));
  model.steps.clear();
  const auto predicted =
      volt::Trainer(volt_test::quiet(dir.path)).predict(model, {first_loader(), second_loader()});
  ASSERT_EQ(predicted.size(), 2u);
  EXPECT_EQ(model.steps,
            (std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}}));
  for (int d = 0; d < 2; ++d) {
    const auto one = volt::Trainer(volt_test::quiet(dir.path))
                         .predict(model, d == 0 ? first_loader() : second_loader());
    ASSERT_EQ(predicted[d].size(), one.size()) << d;
    for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(torch::equal(predicted[d][i], one[i]));
  }
  // limit_predict_batches counts per loader.
  const auto limited =
      volt::Trainer(volt_test::quiet(dir.path).limit_predict_batches(volt::Limit(1)))
          .predict(model, {first_loader(), second_loader()});
  EXPECT_EQ(limited[0].size(), 1u);
  EXPECT_EQ(limited[1].size(), 1u);
}

/// Validation, test and predict data in two loaders each (only the plural methods overridden).
class TwoSets : public volt::DataModule {
 public:
  volt::DataLoader train_dataloader() override { return volt_test::loader(volt_test::blobs(32)); }
  std::vector<volt::DataLoader> val_dataloaders() override {
    return {first_loader(), second_loader()};
  }
  std::vector<volt::DataLoader> test_dataloaders() override {
    return {first_loader(), second_loader()};
  }
  std::vector<volt::DataLoader> predict_dataloaders() override {
    return {first_loader(), second_loader()};
  }
};

TEST(MultipleDataloaders, ADataModuleGivesSeveralLoadersAndTheEntryPointsMergeTheirValues) {
  volt_test::TempDir dir;
  Multi model;
  TwoSets data;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1));
  trainer.fit(model, data);
  EXPECT_EQ(trainer.callback_metrics().count("val_loss/dataloader_idx_1"), 1u);
  // validate/test from a DataModule: every loader's values and the epoch's in one map.
  const volt::Metrics all = trainer.validate(model, data);
  EXPECT_EQ(all.size(), 5u);
  const auto each = trainer.validate(model, {first_loader(), second_loader()});
  for (const auto& r : each) {
    for (const auto& kv : r) EXPECT_DOUBLE_EQ(all.at(kv.first), kv.second) << kv.first;
  }
  EXPECT_EQ(trainer.test(model, data).count("test_acc/dataloader_idx_1"), 1u);
  // predict from a DataModule: every loader's outputs, in loader order.
  EXPECT_EQ(trainer.predict(model, data).size(), 5u);

  // The singular methods are what the plural ones default to.
  volt::DatasetsDataModule one(volt_test::blobs(32), volt_test::blobs(40, 8, 1), nullptr, nullptr,
                               volt::DataLoaderOptions(16));
  EXPECT_EQ(one.val_dataloaders().size(), 1u);
  EXPECT_EQ(one.test_dataloaders().size(), 0u);
}

TEST(MultipleDataloaders, NoLoadersIsAConfigError) {
  volt_test::TempDir dir;
  Multi model;
  volt::Trainer trainer(volt_test::quiet(dir.path));
  const std::string v = volt_test::error_of<volt::ConfigError>(
      [&] { trainer.validate(model, std::vector<volt::DataLoader>{}); });
  EXPECT_TRUE(has(v, "validate() was given an empty list of loaders; pass at least one")) << v;
  const std::string p = volt_test::error_of<volt::ConfigError>(
      [&] { trainer.predict(model, std::vector<volt::DataLoader>{}); });
  EXPECT_TRUE(has(p, "predict() was given an empty list of loaders")) << p;
  volt::DataModule none;
  const std::string d = volt_test::error_of<volt::ConfigError>([&] { trainer.test(model, none); });
  EXPECT_TRUE(has(d,
                  "test() needs DataModule::test_dataloader() (or test_dataloaders() for "
                  "several loaders)"))
      << d;
}

/// Fails in validation_step at batch 1 of loader 1.
class FailsOnTheSecondLoader : public volt_test::TinyClassifier {
 public:
  void validation_step(const volt::Batch& b, int64_t idx) override {
    if (dataloader_idx() == 1 && idx == 1) throw std::runtime_error("bad batch");
    TinyClassifier::validation_step(b, idx);
  }
};

TEST(MultipleDataloaders, AFailureNamesTheLoaderAndTheProgressBarOneLinePerLoader) {
  volt_test::TempDir dir;
  FailsOnTheSecondLoader failing;
  const auto lines = volt_test::capture_logs([&] {
    EXPECT_THROW(volt::Trainer(volt_test::quiet(dir.path))
                     .validate(failing, {first_loader(), second_loader()}),
                 std::runtime_error);
  });
  EXPECT_TRUE(has(lines,
                  "validate failed in validation_step at validation batch 1 of "
                  "dataloader 1: "))
      << ::testing::PrintToString(lines);

  // A standalone pass keeps each loader's final line, named after the loader.
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  auto bar = std::make_shared<volt::ProgressBar>(volt::ProgressBarOptions().refresh_s(0), out);
  Multi model;
  volt::Trainer(volt_test::quiet(dir.path).enable_progress_bar(true).callbacks({bar}))
      .validate(model, {first_loader(), second_loader()});
  std::rewind(out);
  std::string text;
  char buf[256];
  while (std::fgets(buf, sizeof buf, out) != nullptr) text += buf;
  std::fclose(out);
  EXPECT_TRUE(has(text, "Validation DataLoader 0: 100%|██████████| 3/3 [")) << text;
  EXPECT_TRUE(has(text, "Validation DataLoader 1: 100%|██████████| 2/2 [")) << text;
}

}  // namespace
