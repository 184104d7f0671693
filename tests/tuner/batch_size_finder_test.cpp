// scale_batch_size: real trials of real Trainer runs; "out of memory" comes from volt's CPU
// memory limit (an exact budget: the counting allocator's bytes) or from a real failed
// allocation, the two ways a CPU run meets the end of its memory.
#include <gtest/gtest.h>

#include <stdexcept>

#include "error_text.h"
#include "log_capture.h"
#include "tiny.h"
#include "tuner_models.h"

namespace {

using volt::BatchSizeFinderOptions;
using volt::BatchSizeScaling;
using volt_test::quiet;

using volt_test::Hungry;
using volt_test::kMiB;
using volt_test::kScratchPerSample;
using volt_test::SizedData;

std::vector<int64_t> sizes_of(const volt::BatchSizeFinderResult& r) {
  std::vector<int64_t> v;
  for (const auto& t : r.trials) v.push_back(t.batch_size);
  return v;
}
std::vector<bool> fits_of(const volt::BatchSizeFinderResult& r) {
  std::vector<bool> v;
  for (const auto& t : r.trials) v.push_back(t.fits);
  return v;
}

TEST(BatchSizeFinder, PowerModeKeepsTheLargestPowerOfTwoWithinTheMemoryBudget) {
  volt_test::TempDir dir;
  Hungry model;
  SizedData data(4096, 7);
  const torch::Tensor before = model.flat_params();
  const torch::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  volt::BatchSizeFinderResult r;
  // 10 MiB on top of what lives before a trial: 32 samples' scratch (8 MiB) fit, 64 (16) not.
  const auto lines = volt_test::capture_logs([&] {
    r = volt::scale_batch_size(model, data, quiet(dir.path),
                               BatchSizeFinderOptions().max_memory_bytes(10 * kMiB));
  });
  EXPECT_EQ(r.batch_size, 32);
  EXPECT_EQ(data.batch_size(), c10::optional<int64_t>(32));  // the size found is set
  EXPECT_EQ(sizes_of(r), (std::vector<int64_t>{2, 4, 8, 16, 32, 64}));
  EXPECT_EQ(fits_of(r), (std::vector<bool>{true, true, true, true, true, false}));
  // Each trial's peak holds its scratch: at least batch x 256 KiB, within the budget when fits.
  for (const auto& t : r.trials) {
    if (!t.fits) continue;
    EXPECT_GE(t.peak_bytes, t.batch_size * kScratchPerSample * 4) << t.batch_size;
    EXPECT_LE(t.peak_bytes, 10 * kMiB) << t.batch_size;
  }
  // Three optimizer steps per trial, at the trial's size.
  EXPECT_EQ(std::count(model.sizes.begin(), model.sizes.end(), 16), 3);
  EXPECT_TRUE(volt_test::has(lines, "batch size 64 ran out of memory")) << lines.size();
  EXPECT_TRUE(volt_test::has(lines, "batch size 32: the largest that fitted"));
  // The failed trial's error line (the Trainer names the failing step) is not shown: running out
  // of memory is the answer the trial was for.
  EXPECT_FALSE(volt_test::has(lines, "error:"));
  // The module and the random state are as before; the memory cap is lifted again.
  EXPECT_TRUE(torch::equal(model.flat_params(), before));
  EXPECT_TRUE(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), rng));
  EXPECT_EQ(volt::cpu_memory_limit(), 0);
  for (const auto& p : model.parameters()) EXPECT_FALSE(p.grad().defined());
  // A fit at the size found runs within the budget.
  volt::set_cpu_memory_limit(volt::cpu_memory_stats().in_use + 10 * kMiB);
  EXPECT_NO_THROW(volt::Trainer(quiet(dir.path).max_steps(2)).fit(model, data));
  volt::set_cpu_memory_limit(0);
}

TEST(BatchSizeFinder, BinsearchConvergesBetweenWhatFittedAndWhatDidNotLessTheMargin) {
  volt_test::TempDir dir;
  Hungry model;
  SizedData data(4096, 2);
  const auto r = volt::scale_batch_size(
      model, data, quiet(dir.path),
      BatchSizeFinderOptions().mode(BatchSizeScaling::kBinsearch).max_memory_bytes(10 * kMiB));
  // Doubling to 64 (out of memory), then bisecting: the largest size that fitted is one below
  // the smallest that did not.
  int64_t low = 0, high = 1 << 30;
  for (const auto& t : r.trials) {
    if (t.fits) low = std::max(low, t.batch_size);
    if (!t.fits) high = std::min(high, t.batch_size);
  }
  EXPECT_EQ(high, low + 1) << ::testing::PrintToString(sizes_of(r));
  EXPECT_GT(low, 32);  // 10 MiB hold more than 32 samples' 8 MiB
  EXPECT_LT(low, 40);  // and fewer than 40 (10 MiB of scratch alone)
  EXPECT_EQ(r.trials[5].batch_size, 64);
  EXPECT_FALSE(r.trials[5].fits);
  EXPECT_EQ(r.trials[6].batch_size, 48);  // (32 + 64) / 2
  // The default margin of 5%: int(low * 0.95).
  EXPECT_EQ(r.batch_size, static_cast<int64_t>(low * 0.95));
  EXPECT_EQ(data.batch_size(), c10::optional<int64_t>(r.batch_size));
  // Without a margin the size is the largest that fitted.
  SizedData again(4096, 2);
  const auto exact = volt::scale_batch_size(model, again, quiet(dir.path),
                                            BatchSizeFinderOptions()
                                                .mode(BatchSizeScaling::kBinsearch)
                                                .margin(0)
                                                .max_memory_bytes(10 * kMiB));
  EXPECT_EQ(exact.batch_size, low);
  // max_trials counts the trials that fitted (Lightning's _run_binsearch_scaling): the failures
  // past 32 do not use up the six, and the search goes on to a size above 32 that fits. It
  // stopped at 32 after 64 failed.
  SizedData six(4096, 2);
  const auto counted = volt::scale_batch_size(model, six, quiet(dir.path),
                                              BatchSizeFinderOptions()
                                                  .mode(BatchSizeScaling::kBinsearch)
                                                  .margin(0)
                                                  .max_trials(6)
                                                  .max_memory_bytes(10 * kMiB));
  EXPECT_GT(counted.batch_size, 32) << ::testing::PrintToString(sizes_of(counted));
  const auto fits = fits_of(counted);
  EXPECT_EQ(std::count(fits.begin(), fits.end(), true), 6)
      << ::testing::PrintToString(sizes_of(counted));
}

TEST(BatchSizeFinder, ARealAllocationFailureEndsTheSearchLikeABudget) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan treats a 1 PiB request as a fatal allocation-size-too-big report.";
#endif
  volt_test::TempDir dir;
  Hungry model;
  model.fail_from = 16;
  model.how = Hungry::How::kHugeAllocation;
  const auto make = [](int64_t bs) { return volt_test::loader(volt_test::blobs(512), bs); };
  volt::BatchSizeFinderResult r;
  const auto lines = volt_test::capture_logs(
      [&] { r = volt::scale_batch_size(model, make, quiet(dir.path), BatchSizeFinderOptions()); });
  EXPECT_EQ(r.batch_size, 8);
  EXPECT_EQ(sizes_of(r), (std::vector<int64_t>{2, 4, 8, 16}));
  EXPECT_TRUE(volt_test::has(lines, "can't allocate memory")) << lines.size();
  EXPECT_FALSE(volt_test::has(lines, "error:"));
}

/// The sum of the classification losses of a combined batch's parts.
class PartsClassifier : public volt_test::TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    torch::Tensor loss = torch::zeros({});
    for (const auto& name : b.part_names()) {
      const volt::Batch part = b.part(name);
      loss = loss + torch::cross_entropy_loss(forward(part.input), part.target);
    }
    return loss;
  }
};

TEST(BatchSizeFinder, ACombinedLoaderIsCappedByItsLargestDataSet) {
  // Two named training sets (40 and 100 rows): sizes double up to the larger set's rows, past
  // the first loader's 40 (a batch of 100 still changes the larger loader's batches).
  volt_test::TempDir dir;
  PartsClassifier model;
  volt::DatasetsDataModule data(volt::StageDatasets()
                                    .train("small", volt_test::blobs(40))
                                    .train("large", volt_test::blobs(100, 8, 2)),
                                volt::DataLoaderOptions(2));
  const auto r = volt::scale_batch_size(model, data, quiet(dir.path));
  EXPECT_EQ(sizes_of(r), (std::vector<int64_t>{2, 4, 8, 16, 32, 64, 100}));
  EXPECT_EQ(r.batch_size, 100);
  EXPECT_EQ(data.batch_size(), c10::optional<int64_t>(100));
}

// The standalone tuners are often a program's first call: they prepare the data (the DataModule's
// and the module's prepare_data, once) as Lightning's Tuner does through trainer.fit. A setup that
// reads what prepare_data wrote failed before session 98. Their trials run the DataModule's batch
// hooks too.
TEST(BatchSizeFinder, TheStandaloneTunersPrepareTheDataFirstAndTheTrialsRunItsBatchHooks) {
  struct Prepared : SizedData {
    Prepared() : SizedData(64, 2) {}
    void prepare_data() override { ++prepared; }
    void setup(volt::Stage) override {
      VOLT_CHECK(prepared > 0, volt::ConfigError, "[Prepared] setup before prepare_data");
    }
    volt::Batch on_after_batch_transfer(volt::Batch b) override {
      ++transferred;
      return b;
    }
    int prepared = 0, transferred = 0;
  };
  struct Counting : Hungry {
    void prepare_data() override { ++prepared; }
    int prepared = 0;
  };
  volt_test::TempDir dir;
  Prepared data;
  Counting model;
  volt::scale_batch_size(model, data, quiet(dir.path), BatchSizeFinderOptions().max_trials(2));
  EXPECT_EQ(data.prepared, 1);
  EXPECT_EQ(model.prepared, 1);
  // The trials transform their batches with the DataModule's hooks, as the run will (they ran
  // on a bare loader: a transform that costs memory, or makes a batch valid, was left out).
  EXPECT_GE(data.transferred, static_cast<int>(model.sizes.size()));
  EXPECT_GT(data.transferred, 0);
  // A DataModule that overrides none of them: the Module's hooks run (they also move the batch
  // to the device), as in the run; forwarded to the default they were skipped.
  struct CountsTransfers : Hungry {
    volt::Batch on_after_batch_transfer(volt::Batch b) override {
      ++transferred;
      return b;
    }
    int transferred = 0;
  } counting;
  SizedData plain(64, 2);
  volt::scale_batch_size(counting, plain, quiet(dir.path), BatchSizeFinderOptions().max_trials(2));
  EXPECT_GE(counting.transferred, static_cast<int>(counting.sizes.size()));
  EXPECT_GT(counting.transferred, 0);
  Prepared data2;
  Counting model2;
  volt::lr_find(model2, data2, quiet(dir.path), volt::LrFinderOptions().num_training(4));
  EXPECT_EQ(data2.prepared, 1);
  EXPECT_EQ(model2.prepared, 1);
}

TEST(BatchSizeFinder, TheDataSetAndMaxValCapTheSizesTried) {
  volt_test::TempDir dir;
  Hungry model;
  SizedData small(100, 2);
  const auto r = volt::scale_batch_size(model, small, quiet(dir.path));
  // Doubling stops at the data set's 100 samples rather than trying 128 (Lightning would).
  EXPECT_EQ(sizes_of(r), (std::vector<int64_t>{2, 4, 8, 16, 32, 64, 100}));
  EXPECT_EQ(r.batch_size, 100);
  SizedData capped(4096, 2);
  const auto c = volt::scale_batch_size(model, capped, quiet(dir.path),
                                        BatchSizeFinderOptions().max_val(24).init_val(3));
  EXPECT_EQ(sizes_of(c), (std::vector<int64_t>{3, 6, 12, 24}));
  EXPECT_EQ(c.batch_size, 24);
  // max_trials ends the search early with the largest size that fitted so far.
  SizedData few(4096, 2);
  EXPECT_EQ(
      volt::scale_batch_size(model, few, quiet(dir.path), BatchSizeFinderOptions().max_trials(3))
          .batch_size,
      8);
}

TEST(BatchSizeFinder, TheValidationStageSizesTheValidationLoader) {
  volt_test::TempDir dir;
  Hungry model;
  SizedData data(4096, 2);
  const auto r = volt::scale_batch_size(model, data, quiet(dir.path),
                                        BatchSizeFinderOptions()
                                            .stage(volt::Stage::kValidate)
                                            .steps_per_trial(2)
                                            .max_memory_bytes(10 * kMiB));
  // Without gradients a validation step holds the scratch alone: 32 fit, 64 did not.
  EXPECT_EQ(r.batch_size, 32);
  EXPECT_EQ(std::count(model.sizes.begin(), model.sizes.end(), 8), 2);        // batches, not steps
  for (const auto& p : model.parameters()) EXPECT_FALSE(p.grad().defined());  // no training
}

TEST(BatchSizeFinder, AnotherErrorEndsTheSearchAndPutsEverythingBack) {
  volt_test::TempDir dir;
  Hungry model;
  model.fail_from = 8;
  model.how = Hungry::How::kLogicError;
  SizedData data(4096, 5);
  const torch::Tensor before = model.flat_params();
  const auto shown = volt_test::capture_logs([&] {
    EXPECT_THROW(volt::scale_batch_size(model, data, quiet(dir.path)), std::logic_error);
  });
  EXPECT_EQ(data.batch_size(), c10::optional<int64_t>(5));  // the size it had
  EXPECT_TRUE(torch::equal(model.flat_params(), before));
  EXPECT_EQ(volt::cpu_memory_limit(), 0);
  // Its error line (the Trainer's, naming the step) is shown.
  EXPECT_TRUE(volt_test::has(shown, "a bug in training_step"));
}

TEST(BatchSizeFinder, AModelThatNeverFitsIsNotAvailable) {
  volt_test::TempDir dir;
  Hungry model;
  SizedData data(4096, 2);
  const std::string e = volt_test::error_of<volt::NotAvailable>([&] {
    volt::scale_batch_size(model, data, quiet(dir.path),
                           BatchSizeFinderOptions().max_memory_bytes(128 * 1024));
  });
  EXPECT_TRUE(volt_test::has(e, "even a batch of 1 runs out of memory")) << e;
  EXPECT_EQ(data.batch_size(), c10::optional<int64_t>(2));
  // With too few trials to get down to a size that fits, the error says so.
  const std::string few = volt_test::error_of<volt::NotAvailable>([&] {
    volt::scale_batch_size(
        model, data, quiet(dir.path),
        BatchSizeFinderOptions().init_val(64).max_trials(1).max_memory_bytes(10 * kMiB));
  });
  EXPECT_TRUE(volt_test::has(few, "no batch size fitted in 1 trial(s)")) << few;
}

TEST(BatchSizeFinder, BadOptionsAndDataModulesAreConfigErrors) {
  volt_test::TempDir dir;
  Hungry model;
  SizedData data(64, 2);
  const auto error = [&](BatchSizeFinderOptions o) {
    return volt_test::error_of<volt::ConfigError>(
        [&] { volt::scale_batch_size(model, data, quiet(dir.path), o); });
  };
  EXPECT_TRUE(volt_test::has(error(BatchSizeFinderOptions().steps_per_trial(0)),
                             "steps_per_trial=0 must be >= 1"));
  EXPECT_TRUE(volt_test::has(error(BatchSizeFinderOptions().init_val(0)), "init_val=0"));
  EXPECT_TRUE(volt_test::has(error(BatchSizeFinderOptions().max_trials(0)), "max_trials=0"));
  EXPECT_TRUE(volt_test::has(error(BatchSizeFinderOptions().margin(1)), "margin=1"));
  EXPECT_TRUE(volt_test::has(error(BatchSizeFinderOptions().margin(-0.1)), "margin=-0.1"));
  EXPECT_TRUE(
      volt_test::has(error(BatchSizeFinderOptions().max_val(1)), "max_val=1 is below init_val=2"));
  EXPECT_TRUE(
      volt_test::has(error(BatchSizeFinderOptions().max_memory_bytes(0)), "max_memory_bytes=0"));
  EXPECT_TRUE(volt_test::has(error(BatchSizeFinderOptions().stage(volt::Stage::kSanityCheck)),
                             "is not an entry point"));
  // A DataModule that does not expose its batch size.
  struct Fixed : volt::DataModule {
    volt::DataLoader train_dataloader() override {
      return volt_test::loader(volt_test::blobs(64), 8);
    }
  } fixed;
  EXPECT_TRUE(volt_test::has(volt_test::error_of<volt::ConfigError>(
                                 [&] { volt::scale_batch_size(model, fixed, quiet(dir.path)); }),
                             "override DataModule::batch_size() and set_batch_size"));
  EXPECT_TRUE(volt_test::has(
      volt_test::error_of<volt::ConfigError>([&] { fixed.set_batch_size(4); }), "cannot be set"));
  // The test stage without a test loader.
  EXPECT_TRUE(volt_test::has(error(BatchSizeFinderOptions().stage(volt::Stage::kTest)),
                             "needs the DataModule's test loader"));
  // fast_dev_run: skipped with a warning, nothing changed.
  volt::BatchSizeFinderResult r;
  const auto lines = volt_test::capture_logs(
      [&] { r = volt::scale_batch_size(model, data, quiet(dir.path).fast_dev_run(1)); });
  EXPECT_EQ(r.batch_size, 0);
  EXPECT_TRUE(r.trials.empty());
  EXPECT_EQ(data.batch_size(), c10::optional<int64_t>(2));
  EXPECT_TRUE(volt_test::has(lines, "skipped: fast_dev_run"));
}

}  // namespace
