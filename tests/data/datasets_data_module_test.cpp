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

}  // namespace
