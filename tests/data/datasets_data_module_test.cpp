// DatasetsDataModule (Lightning's LightningDataModule.from_datasets): loaders over data sets
// already built, the training one shuffled.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "error_text.h"
#include "tiny.h"

namespace {

using volt_test::error_of;

// The first column of every row the loader gives, in order.
std::vector<float> order_of(const volt::DataLoader& loader, int64_t epoch = 0) {
  std::vector<float> out;
  auto stream = loader.stream(epoch);
  volt::Batch b;
  while (stream.next(b)) {
    for (int64_t i = 0; i < b.input.size(0); ++i) out.push_back(b.input[i][0].item<float>());
  }
  return out;
}

std::shared_ptr<volt::TensorDataset> numbered(int64_t n) {
  auto x = torch::arange(n, torch::kFloat).unsqueeze(1).repeat({1, 8});
  return std::make_shared<volt::TensorDataset>(x, (torch::arange(n) % 2).to(torch::kLong));
}

TEST(DatasetsDataModule, LoadersForTheGivenSetsTheTrainingOneShuffled) {
  auto train = numbered(40), val = numbered(24);
  volt::DatasetsDataModule data(train, val, /*test=*/nullptr, /*predict=*/val,
                                volt::DataLoaderOptions(8).seed(3));
  const auto t = data.train_dataloader();
  EXPECT_EQ(t.options().batch_size(), 8);
  EXPECT_EQ(t.num_batches(), 5);
  auto seen = order_of(t);
  std::vector<float> in_order(40);
  for (int i = 0; i < 40; ++i) in_order[i] = static_cast<float>(i);
  EXPECT_NE(seen, in_order);  // shuffled
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, in_order);  // every row once
  ASSERT_TRUE(data.val_dataloader().has_value());
  std::vector<float> val_order(24);
  for (int i = 0; i < 24; ++i) val_order[i] = static_cast<float>(i);
  EXPECT_EQ(order_of(*data.val_dataloader()), val_order);  // in order
  EXPECT_EQ(order_of(*data.predict_dataloader()), val_order);
  EXPECT_FALSE(data.test_dataloader().has_value());

  // The batch size is tunable (scale_batch_size sets it).
  EXPECT_EQ(data.batch_size(), c10::optional<int64_t>(8));
  data.set_batch_size(16);
  EXPECT_EQ(data.train_dataloader().options().batch_size(), 16);
  EXPECT_EQ(data.val_dataloader()->num_batches(), 2);
}

// drop_last is for training: the evaluation loaders read every sample (before, the last partial
// batch of validation, test and predict data was dropped silently).
TEST(DatasetsDataModule, DropLastDropsTrainingSamplesOnly) {
  auto set = numbered(10);
  volt::DatasetsDataModule data(set, set, set, set, volt::DataLoaderOptions(4).drop_last(true));
  EXPECT_EQ(data.train_dataloader().num_batches(), 2);
  for (const auto& loader :
       {*data.val_dataloader(), *data.test_dataloader(), *data.predict_dataloader()}) {
    EXPECT_EQ(loader.num_batches(), 3);
    EXPECT_EQ(order_of(loader).size(), 10u);
  }
}

TEST(DatasetsDataModule, TheTrainerRunsEveryStageFromIt) {
  volt_test::TempDir dir;
  auto data = std::make_shared<volt::DatasetsDataModule>(
      volt_test::blobs(64), volt_test::blobs(32, 8, 2), volt_test::blobs(32, 8, 3),
      volt_test::blobs(20, 8, 4), volt::DataLoaderOptions(16));
  volt_test::TinyClassifier model;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(2));
  trainer.fit(model, *data);
  EXPECT_EQ(trainer.state().global_step, 8);
  EXPECT_EQ(trainer.callback_metrics().count("val_acc"), 1u);
  EXPECT_EQ(trainer.test(model, *data).count("test_acc"), 1u);
  const auto predictions = trainer.predict(model, *data);
  int64_t rows = 0;
  for (const auto& p : predictions) rows += p.size(0);
  EXPECT_EQ(rows, 20);
}

TEST(DatasetsDataModule, MissingSetsAndBadSizesAreConfigErrors) {
  EXPECT_NE(error_of<volt::ConfigError>([] {
              volt::DatasetsDataModule(nullptr);
            }).find("no data set given"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([] {
              volt::DatasetsDataModule(volt_test::blobs(8), nullptr, nullptr, nullptr,
                                       volt::DataLoaderOptions(0));
            }).find("batch_size=0 must be >= 1"),
            std::string::npos);
  volt::DatasetsDataModule only_val(nullptr, volt_test::blobs(16));
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              only_val.set_batch_size(-2);
            }).find("batch_size=-2 must be >= 1"),
            std::string::npos);
  // fit without a training set: said before anything trains.
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  volt::Trainer trainer(volt_test::quiet(dir.path));
  const std::string err = error_of<volt::ConfigError>([&] { trainer.fit(model, only_val); });
  EXPECT_NE(err.find("fit needs a training data set"), std::string::npos) << err;
  // validate works from the same module.
  EXPECT_EQ(trainer.validate(model, only_val).count("val_acc"), 1u);
}

TEST(DatasetsDataModule, SeveralSetsPerStageGiveACombinedTrainingLoaderAndSeveralOthers) {
  // Lightning's from_datasets with a mapping of training sets and sequences of the others.
  const auto opts = volt::DataLoaderOptions(8).seed(3);
  volt::DatasetsDataModule data(volt::StageDatasets()
                                    .train("a", numbered(40))
                                    .train("b", numbered(24))
                                    .val(numbered(16))
                                    .val(numbered(8))
                                    .test(numbered(8)),
                                opts);
  const auto train = data.train_dataloader();
  ASSERT_TRUE(train.is_combined());
  EXPECT_EQ(train.num_batches(), 5);  // max_size_cycle: a's 5 batches, b's 3 started again
  EXPECT_EQ(train.options().batch_size(), 16);
  // Each set shuffled as a loader of its own with seed + its position.
  std::vector<float> a, b;
  auto stream = train.stream(0);
  volt::Batch batch;
  while (stream.next(batch)) {
    for (int64_t i = 0; i < batch.part("a").size(); ++i)
      a.push_back(batch.part("a").input[i][0].item<float>());
    for (int64_t i = 0; i < batch.part("b").size(); ++i)
      b.push_back(batch.part("b").input[i][0].item<float>());
  }
  EXPECT_EQ(a,
            order_of(volt::DataLoader(numbered(40), volt::DataLoaderOptions(opts).shuffle(true))));
  const auto b_alone =
      order_of(volt::DataLoader(numbered(24), volt::DataLoaderOptions(opts).shuffle(true).seed(4)));
  ASSERT_EQ(b.size(), 40u);
  EXPECT_TRUE(std::equal(b_alone.begin(), b_alone.end(), b.begin()));

  const auto vals = data.val_dataloaders();
  ASSERT_EQ(vals.size(), 2u);
  EXPECT_EQ(vals[0].num_batches(), 2);
  EXPECT_EQ(vals[1].num_batches(), 1);
  EXPECT_EQ(order_of(vals[1]), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));  // in order
  EXPECT_EQ(data.val_dataloader()->num_batches(), 2);                          // the first
  EXPECT_EQ(data.test_dataloaders().size(), 1u);
  EXPECT_TRUE(data.predict_dataloaders().empty());
  EXPECT_FALSE(data.predict_dataloader().has_value());
  data.set_batch_size(4);  // every loader's, each part's
  EXPECT_EQ(data.train_dataloader().options().batch_size(), 8);
  EXPECT_EQ(data.val_dataloaders()[1].num_batches(), 2);

  volt::DatasetsDataModule min_size(volt::StageDatasets()
                                        .train("a", numbered(40))
                                        .train("b", numbered(24))
                                        .mode(volt::CombineMode::kMinSize),
                                    opts);
  EXPECT_EQ(min_size.train_dataloader().num_batches(), 3);
  // One named set is still combined (Lightning's dict of one loader); an unnamed one is plain.
  EXPECT_TRUE(volt::DatasetsDataModule(volt::StageDatasets().train("only", numbered(8)))
                  .train_dataloader()
                  .is_combined());
  EXPECT_FALSE(volt::DatasetsDataModule(volt::StageDatasets().train(numbered(8)))
                   .train_dataloader()
                   .is_combined());
}

TEST(DatasetsDataModule, BadSetsPerStageAreConfigErrors) {
  auto error = [](const volt::StageDatasets& sets) {
    return error_of<volt::ConfigError>([&] { volt::DatasetsDataModule data(sets); });
  };
  auto has = [](const std::string& text, const std::string& phrase) {
    return text.find(phrase) != std::string::npos;
  };
  EXPECT_TRUE(has(error(volt::StageDatasets()), "no data set given"));
  EXPECT_TRUE(has(error(volt::StageDatasets().train(numbered(8)).train("b", numbered(8))),
                  "an unnamed training set beside another"));
  EXPECT_TRUE(has(error(volt::StageDatasets().train("a", numbered(8)).train("a", numbered(8))),
                  "two loaders are named 'a'"));
  EXPECT_TRUE(has(error(volt::StageDatasets().train("a", nullptr)), "training set 'a' is null"));
  EXPECT_TRUE(has(error(volt::StageDatasets().val(numbered(8)).val(nullptr)),
                  "a validation, test or predict set is null"));
}

}  // namespace
