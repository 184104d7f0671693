// The predict hooks (Lightning's order, batch indices), TrainerOptions::return_predictions,
// PredictionWriter and SafetensorsPredictionWriter in one process. Several processes:
// tests/cli/cli_test.cpp (CliBinary.PredictionWriterMergesTheRanksInDataSetOrder).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "error_text.h"
#include "requires.h"
#include "tiny.h"

namespace {

namespace fs = std::filesystem;

constexpr int64_t kRows = 37;  // 5 batches of 8, the last one of 5

/// Row i holds the value i, so a prediction says which sample it came from.
std::shared_ptr<volt::TensorDataset> numbered_rows() {
  auto x = torch::arange(kRows, torch::kFloat).unsqueeze(1);
  return std::make_shared<volt::TensorDataset>(x, torch::zeros({kRows}, torch::kLong));
}

volt::DataLoader shuffled() {
  return volt::DataLoader(numbered_rows(), volt::DataLoaderOptions(8).shuffle(true).seed(11));
}

/// predict_step returns 10 × the row's value (a row per sample) or, with `per_batch`, the sum of
/// the batch (one number per batch: not rows).
class Echo : public volt_test::TinyClassifier {
 public:
  explicit Echo(bool per_batch = false) : TinyClassifier(1), per_batch_(per_batch) {}
  torch::Tensor predict_step(const volt::Batch& b, int64_t) override {
    auto rows = b.input.select(1, 0) * 10;
    return per_batch_ ? rows.sum() : rows;
  }

 private:
  bool per_batch_;
};

/// Records the predict hooks and what they were given.
class Recorder : public volt::Callback {
 public:
  std::string state_key() const override { return "Recorder"; }
  void on_predict_start(volt::RunContext& run, volt::Module&) override {
    events.push_back("start");
    EXPECT_TRUE(run.predict_batch_indices().empty());
  }
  void on_predict_epoch_start(volt::RunContext&, volt::Module&) override {
    events.push_back("epoch_start");
  }
  void on_predict_batch_start(volt::RunContext& run, volt::Module&, const volt::Batch& batch,
                              int64_t idx) override {
    events.push_back("batch_start " + std::to_string(idx));
    // The indices name the batch's samples: row i holds i.
    const auto& ind = run.predict_batch_indices();
    EXPECT_TRUE(
        torch::equal(batch.input.select(1, 0).to(torch::kLong), torch::tensor(ind, torch::kLong)));
    indices.push_back(ind);
  }
  void on_predict_batch_end(volt::RunContext& run, volt::Module&, const at::Tensor& prediction,
                            const volt::Batch&, int64_t idx) override {
    events.push_back("batch_end " + std::to_string(idx));
    EXPECT_EQ(run.predict_batch_indices(), indices.back());
    predictions.push_back(prediction);
  }
  void on_predict_epoch_end(volt::RunContext& run, volt::Module&) override {
    events.push_back("epoch_end");
    EXPECT_TRUE(run.predict_batch_indices().empty());
  }
  void on_predict_end(volt::RunContext&, volt::Module&) override { events.push_back("end"); }

  std::vector<std::string> events;
  std::vector<std::vector<int64_t>> indices;
  std::vector<at::Tensor> predictions;
};

TEST(PredictHooks, RunInLightningsOrderWithEachBatchsDataSetIndices) {
  volt_test::TempDir dir;
  Echo model;
  auto rec = std::make_shared<Recorder>();
  volt::Trainer trainer(volt_test::quiet(dir.path).callbacks({rec}));
  const auto out = trainer.predict(model, shuffled());
  std::vector<std::string> expected = {"start", "epoch_start"};
  for (int i = 0; i < 5; ++i) {
    expected.push_back("batch_start " + std::to_string(i));
    expected.push_back("batch_end " + std::to_string(i));
  }
  expected.insert(expected.end(), {"epoch_end", "end"});
  EXPECT_EQ(rec->events, expected);
  // The indices are the sampler's shuffled order, batch by batch.
  const auto order = volt::Sampler(kRows, true, 11).indices(0);
  std::vector<int64_t> seen;
  for (const auto& b : rec->indices) seen.insert(seen.end(), b.begin(), b.end());
  EXPECT_EQ(seen, order);
  EXPECT_EQ(rec->indices.back().size(), 5u);
  // The hook saw the very tensors predict() returns.
  ASSERT_EQ(out.size(), rec->predictions.size());
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_TRUE(out[i].is_same(rec->predictions[i]));
  }
}

TEST(PredictHooks, ReturnPredictionsFalseReturnsNoneAndTheHooksStillSeeEach) {
  volt_test::TempDir dir;
  Echo model;
  auto rec = std::make_shared<Recorder>();
  volt::Trainer trainer(volt_test::quiet(dir.path).return_predictions(false).callbacks({rec}));
  EXPECT_TRUE(trainer.predict(model, shuffled()).empty());
  EXPECT_EQ(rec->predictions.size(), 5u);
}

/// predict_step returns 512 KiB per batch of 8 rows.
class Wide : public volt_test::TinyClassifier {
 public:
  Wide() : TinyClassifier(1) {}
  torch::Tensor predict_step(const volt::Batch& b, int64_t) override {
    return b.input.expand({b.input.size(0), 16384}).clone();
  }
};

TEST(PredictHooks, WithoutReturnedPredictionsABatchWriterKeepsMemoryFlat) {
  // 64 batches of 512 KiB: returned, they are all held at the end (32 MiB); written per batch
  // with return_predictions(false), the peak stays at a few batches however many there are.
  volt_test::TempDir dir;
  auto x = torch::arange(512, torch::kFloat).unsqueeze(1);
  auto data = std::make_shared<volt::TensorDataset>(x, torch::zeros({512}, torch::kLong));
  volt::install_counting_cpu_allocator();
  auto peak_of = [&](bool keep) {
    Wide model;
    auto writer = std::make_shared<volt::SafetensorsPredictionWriter>(
        volt::SafetensorsPredictionWriterOptions()
            .output_dir(dir / (keep ? "kept" : "written"))
            .write_interval(volt::WriteInterval::kBatch));
    volt::Trainer trainer(volt_test::quiet(dir.path).return_predictions(keep).callbacks({writer}));
    const int64_t before = volt::cpu_memory_stats().in_use;
    volt::reset_cpu_memory_peaks();
    const auto out = trainer.predict(model, volt::DataLoader(data, volt::DataLoaderOptions(8)));
    EXPECT_EQ(out.size(), keep ? 64u : 0u);
    EXPECT_TRUE(fs::exists(dir / (keep ? "kept" : "written") + "/batch_000063.safetensors"));
    return volt::cpu_memory_stats().max_in_use - before;
  };
  const int64_t kept = peak_of(true), written = peak_of(false);
  EXPECT_GE(kept, int64_t{32} << 20) << kept;
  EXPECT_LT(written, int64_t{4} << 20) << written;
}

/// Loads `dir/name`; fails the test when it is missing.
volt::SafetensorsFile load(const std::string& path) {
  EXPECT_TRUE(fs::exists(path)) << path;
  return volt::load_safetensors(path);
}

TEST(SafetensorsPredictionWriter, EpochFileHoldsThePassRowsAndTheirIndices) {
  volt_test::TempDir dir;
  Echo model;
  auto writer = std::make_shared<volt::SafetensorsPredictionWriter>(
      volt::SafetensorsPredictionWriterOptions().output_dir(dir / "out"));
  volt::Trainer trainer(volt_test::quiet(dir.path).return_predictions(false).callbacks({writer}));
  EXPECT_TRUE(trainer.predict(model, shuffled()).empty());
  EXPECT_EQ(writer->output_dir(), dir / "out");
  const auto f = load(dir / "out/predictions.safetensors");
  ASSERT_EQ(f.tensors.size(), 2u);
  const auto order = volt::Sampler(kRows, true, 11).indices(0);
  EXPECT_TRUE(torch::equal(f.tensors.at("indices"), torch::tensor(order, torch::kLong)));
  // Each row is its sample's prediction: 10 × the row's index.
  EXPECT_TRUE(torch::equal(f.tensors.at("predictions"),
                           torch::tensor(order, torch::kLong).to(torch::kFloat) * 10));
  // Nothing but the one file.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir / "out"), fs::directory_iterator()), 1);
}

/// predict_step over a combined batch: 10 x each part's row values, the parts in loader order.
class PartsEcho : public volt_test::TinyClassifier {
 public:
  PartsEcho() : TinyClassifier(1) {}
  torch::Tensor predict_step(const volt::Batch& b, int64_t) override {
    std::vector<at::Tensor> rows;
    for (const auto& name : b.part_names()) rows.push_back(b.part(name).input.select(1, 0) * 10);
    return torch::cat(rows);
  }
};

TEST(SafetensorsPredictionWriter, ACombinedLoadersRowsKeepTheirPlaceInItsDataSetsLaidEndToEnd) {
  // {"a": rows 0..36 shuffled, batches of 8; "b": 20 rows holding 100..119, batches of 6} in
  // max_size mode: 5 batches, the last without b. Each row's index is its place in a and b laid
  // end to end (b's row k is 37 + k), so every row of both data sets is there once with its
  // prediction.
  volt_test::TempDir dir;
  PartsEcho model;
  auto x = torch::arange(100, 120, torch::kFloat).unsqueeze(1);
  auto b = std::make_shared<volt::TensorDataset>(x, torch::zeros({20}, torch::kLong));
  const auto loader = volt::combined_loader(
      {{"a", shuffled()},
       {"b", volt::DataLoader(b, volt::DataLoaderOptions(6).shuffle(true).seed(3))}},
      volt::CombineMode::kMaxSize);
  auto writer = std::make_shared<volt::SafetensorsPredictionWriter>(
      volt::SafetensorsPredictionWriterOptions().output_dir(dir / "out"));
  volt::Trainer trainer(volt_test::quiet(dir.path).return_predictions(false).callbacks({writer}));
  trainer.predict(model, loader);
  const auto f = load(dir / "out/predictions.safetensors");
  const at::Tensor indices = f.tensors.at("indices"), predictions = f.tensors.at("predictions");
  ASSERT_EQ(indices.numel(), kRows + 20);
  EXPECT_TRUE(torch::equal(std::get<0>(indices.sort()), torch::arange(kRows + 20)));
  const at::Tensor value = torch::where(indices < kRows, indices, indices - kRows + 100);
  EXPECT_TRUE(torch::equal(predictions, value.to(torch::kFloat) * 10));
}

TEST(SafetensorsPredictionWriter, BatchFilesEachHoldTheirBatchAndTheDefaultFolderIsTheRuns) {
  volt_test::TempDir dir;
  Echo model;
  auto writer = std::make_shared<volt::SafetensorsPredictionWriter>(
      volt::SafetensorsPredictionWriterOptions().write_interval(volt::WriteInterval::kBatch));
  auto opts = volt_test::quiet(dir.path).logger(true).callbacks({writer});
  volt::Trainer trainer(opts);
  const auto out = trainer.predict(model, shuffled());
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(writer->output_dir(), trainer.log_dir() + "/predictions");
  const auto order = volt::Sampler(kRows, true, 11).indices(0);
  for (int64_t i = 0; i < 5; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "/batch_%06lld.safetensors", static_cast<long long>(i));
    const auto f = load(writer->output_dir() + name);
    EXPECT_TRUE(torch::equal(f.tensors.at("predictions"), out[i])) << name;
    const std::vector<int64_t> expected(order.begin() + 8 * i,
                                        order.begin() + std::min<int64_t>(8 * i + 8, kRows));
    EXPECT_TRUE(torch::equal(f.tensors.at("indices"), torch::tensor(expected, torch::kLong)));
  }
  EXPECT_FALSE(fs::exists(writer->output_dir() + "/predictions.safetensors"));
}

TEST(SafetensorsPredictionWriter, BatchAndEpochWritesBothAndPerBatchOutputsKeepTheirBatches) {
  volt_test::TempDir dir;
  Echo model(/*per_batch=*/true);
  auto writer = std::make_shared<volt::SafetensorsPredictionWriter>(
      volt::SafetensorsPredictionWriterOptions()
          .output_dir(dir / "out")
          .write_interval(volt::WriteInterval::kBatchAndEpoch));
  volt::Trainer trainer(volt_test::quiet(dir.path).callbacks({writer}));
  const auto out = trainer.predict(model, shuffled());
  ASSERT_EQ(out.size(), 5u);
  EXPECT_TRUE(fs::exists(dir / "out/batch_000004.safetensors"));
  // A number per batch is not a row per sample: the epoch file keeps them batch by batch.
  const auto f = load(dir / "out/predictions.safetensors");
  EXPECT_EQ(f.tensors.size(), 10u);
  EXPECT_EQ(f.tensors.count("predictions"), 0u);
  EXPECT_TRUE(torch::equal(f.tensors.at("batch_000003"), out[3]));
  EXPECT_EQ(f.tensors.at("indices_000004").numel(), 5);
}

// On a GPU the predictions are CUDA tensors: the files hold them, copied to the host, with
// their indices, batch by batch and for the whole pass.
TEST(SafetensorsPredictionWriterCuda, WritesTheGpusPredictionsBatchByBatchAndForThePass) {
  VOLT_REQUIRE_CUDA();
  volt_test::TempDir dir;
  Echo model;
  auto writer = std::make_shared<volt::SafetensorsPredictionWriter>(
      volt::SafetensorsPredictionWriterOptions()
          .output_dir(dir / "out")
          .write_interval(volt::WriteInterval::kBatchAndEpoch));
  volt::Trainer trainer(volt_test::quiet(dir.path).accelerator("cuda").callbacks({writer}));
  const auto out = trainer.predict(model, shuffled());
  ASSERT_EQ(out.size(), 5u);
  const auto order = volt::Sampler(kRows, true, 11).indices(0);
  for (int64_t i = 0; i < 5; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "/batch_%06lld.safetensors", static_cast<long long>(i));
    const auto f = load(dir / ("out" + std::string(name)));
    EXPECT_TRUE(torch::equal(f.tensors.at("predictions"), out[i].cpu())) << name;
  }
  const auto f = load(dir / "out/predictions.safetensors");
  EXPECT_TRUE(torch::equal(f.tensors.at("indices"), torch::tensor(order, torch::kLong)));
  EXPECT_TRUE(torch::equal(f.tensors.at("predictions"),
                           torch::tensor(order, torch::kLong).to(torch::kFloat) * 10));
}

/// Writes through its own overrides, to check what a subclass is handed.
class MyWriter : public volt::PredictionWriter {
 public:
  using PredictionWriter::PredictionWriter;
  void write_on_batch_end(volt::RunContext&, volt::Module&, const at::Tensor& prediction,
                          const std::vector<int64_t>& indices, const volt::Batch& batch,
                          int64_t batch_idx, int64_t dataloader_idx) override {
    EXPECT_EQ(prediction.size(0), batch.size());
    EXPECT_EQ(static_cast<int64_t>(indices.size()), batch.size());
    batches.push_back(batch_idx);
    batch_loaders.push_back(dataloader_idx);
  }
  void write_on_epoch_end(volt::RunContext&, volt::Module&,
                          const std::vector<at::Tensor>& predictions,
                          const std::vector<std::vector<int64_t>>& indices,
                          int64_t dataloader_idx) override {
    epoch_predictions = predictions;
    epoch_indices = indices;
    epoch_loaders.push_back(dataloader_idx);
  }
  std::vector<int64_t> batches, batch_loaders, epoch_loaders;
  std::vector<at::Tensor> epoch_predictions;  // the last loader's
  std::vector<std::vector<int64_t>> epoch_indices;
};

TEST(PredictionWriter, CallsTheOverridesItsIntervalNames) {
  volt_test::TempDir dir;
  for (auto interval : {volt::WriteInterval::kBatch, volt::WriteInterval::kEpoch,
                        volt::WriteInterval::kBatchAndEpoch}) {
    Echo model;
    auto writer = std::make_shared<MyWriter>(interval);
    // Keyed by its class, as Lightning's default state_key: writers of two classes may coexist.
    EXPECT_NE(writer->state_key().find(std::string("MyWriter{write_interval=") +
                                       volt::to_string(interval) + "}"),
              std::string::npos)
        << writer->state_key();
    volt::Trainer trainer(volt_test::quiet(dir.path).callbacks({writer}));
    const auto out = trainer.predict(model, shuffled());
    const bool batch = interval != volt::WriteInterval::kEpoch;
    const bool epoch = interval != volt::WriteInterval::kBatch;
    EXPECT_EQ(writer->batches,
              batch ? std::vector<int64_t>({0, 1, 2, 3, 4}) : std::vector<int64_t>{})
        << volt::to_string(interval);
    ASSERT_EQ(writer->epoch_predictions.size(), epoch ? 5u : 0u) << volt::to_string(interval);
    if (epoch) {
      EXPECT_TRUE(writer->epoch_predictions[2].is_same(out[2]));
      EXPECT_EQ(writer->epoch_indices[4].size(), 5u);
    }
  }
}

// Several predict loaders: the writer is told each batch's loader, and the epoch interval
// writes each loader's predictions, one call (and, for the safetensors writer, one file) per
// loader.
TEST(PredictionWriter, SeveralLoadersAreWrittenEachUnderItsIndex) {
  volt_test::TempDir dir;
  Echo model;
  const auto in_order = [] {
    return volt::DataLoader(numbered_rows(), volt::DataLoaderOptions(10));  // 10, 10, 10, 7
  };
  auto mine = std::make_shared<MyWriter>(volt::WriteInterval::kBatchAndEpoch);
  const auto out = volt::Trainer(volt_test::quiet(dir.path).callbacks({mine}))
                       .predict(model, {shuffled(), in_order()});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(mine->batches, (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3}));
  EXPECT_EQ(mine->batch_loaders, (std::vector<int64_t>{0, 0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(mine->epoch_loaders, (std::vector<int64_t>{0, 1}));
  ASSERT_EQ(mine->epoch_predictions.size(), 4u);  // the last call's: loader 1's
  EXPECT_TRUE(mine->epoch_predictions[3].is_same(out[1][3]));

  auto writer = std::make_shared<volt::SafetensorsPredictionWriter>(
      volt::SafetensorsPredictionWriterOptions()
          .output_dir(dir / "out")
          .write_interval(volt::WriteInterval::kBatchAndEpoch));
  volt::Trainer(volt_test::quiet(dir.path).callbacks({writer}))
      .predict(model, {shuffled(), in_order()});
  EXPECT_TRUE(fs::exists(dir / "out/dataloader0_batch_000004.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "out/dataloader1_batch_000004.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "out/batch_000000.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "out/predictions.safetensors"));
  const auto last = load(dir / "out/dataloader1_batch_000003.safetensors");
  EXPECT_TRUE(torch::equal(last.tensors.at("indices"), torch::arange(30, kRows, torch::kLong)));
  const auto order = volt::Sampler(kRows, true, 11).indices(0);
  const auto first = load(dir / "out/dataloader0_predictions.safetensors");
  EXPECT_TRUE(torch::equal(first.tensors.at("indices"), torch::tensor(order, torch::kLong)));
  const auto second = load(dir / "out/dataloader1_predictions.safetensors");
  EXPECT_TRUE(torch::equal(second.tensors.at("indices"), torch::arange(kRows, torch::kLong)));
  EXPECT_TRUE(
      torch::equal(second.tensors.at("predictions"), torch::arange(kRows, torch::kFloat) * 10));
}

TEST(PredictionWriter, AnIntervalWhoseMethodIsNotOverriddenAsksToOverrideIt) {
  volt_test::TempDir dir;
  Echo model;
  const std::string batch = volt_test::error_of<volt::ConfigError>([&] {
    volt::Trainer(volt_test::quiet(dir.path).callbacks(
                      {std::make_shared<volt::PredictionWriter>(volt::WriteInterval::kBatch)}))
        .predict(model, shuffled());
  });
  EXPECT_NE(batch.find("write_interval=batch calls write_on_batch_end"), std::string::npos)
      << batch;
  EXPECT_NE(batch.find("override it"), std::string::npos) << batch;
  const std::string epoch = volt_test::error_of<volt::ConfigError>([&] {
    volt::Trainer(volt_test::quiet(dir.path).callbacks(
                      {std::make_shared<volt::PredictionWriter>(volt::WriteInterval::kEpoch)}))
        .predict(model, shuffled());
  });
  EXPECT_NE(epoch.find("calls write_on_epoch_end"), std::string::npos) << epoch;
}

TEST(SafetensorsPredictionWriter, RefusesAnOutputDirItCannotCreateAndABadIntervalName) {
  volt_test::TempDir dir;
  std::ofstream(dir / "file") << "x";
  Echo model;
  auto writer = std::make_shared<volt::SafetensorsPredictionWriter>(
      volt::SafetensorsPredictionWriterOptions().output_dir(dir / "file"));
  const std::string e = volt_test::error_of<volt::ConfigError>([&] {
    volt::Trainer(volt_test::quiet(dir.path).callbacks({writer})).predict(model, shuffled());
  });
  EXPECT_NE(e.find("cannot create output_dir '" + (dir / "file") + "'"), std::string::npos) << e;
  const std::string p =
      volt_test::error_of<volt::ConfigError>([] { volt::parse_write_interval("batches"); });
  EXPECT_NE(p.find("not one of batch, epoch, batch_and_epoch"), std::string::npos) << p;
  EXPECT_EQ(volt::parse_write_interval("batch_and_epoch"), volt::WriteInterval::kBatchAndEpoch);
}

}  // namespace
