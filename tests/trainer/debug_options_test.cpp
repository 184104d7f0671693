// Lightning's debugging and stopping flags: min_steps, overfit_batches, detect_anomaly.
#include <gtest/gtest.h>

#include <torch/csrc/autograd/anomaly_mode.h>

#include <algorithm>

#include "error_text.h"
#include "log_capture.h"
#include "tiny.h"

namespace {

using volt_test::quiet;
using volt_test::TinyClassifier;

/// Asks to stop after every training batch (as an EarlyStopping that always fires).
class StopAlways : public volt::Callback {
 public:
  std::string state_key() const override { return "StopAlways"; }
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t) override {
    run.request_stop();
  }
};

/// Asks to stop at every epoch start (as a BaseFinetuning or user callback deciding there).
class StopAtEpochStart : public volt::Callback {
 public:
  std::string state_key() const override { return "StopAtEpochStart"; }
  void on_train_epoch_start(volt::RunContext& run, volt::Module&) override { run.request_stop(); }
};

/// Keeps the inputs of every training batch, per epoch.
class BatchRecorder : public volt::Callback {
 public:
  std::string state_key() const override { return "BatchRecorder"; }
  void on_train_epoch_start(volt::RunContext&, volt::Module&) override { epochs.emplace_back(); }
  void on_train_batch_start(volt::RunContext&, volt::Module&, const volt::Batch& b,
                            int64_t) override {
    epochs.back().push_back(b.input.clone());
  }
  std::vector<std::vector<torch::Tensor>> epochs;
};

class CountingClassifier : public TinyClassifier {
 public:
  void validation_step(const volt::Batch& b, int64_t i) override {
    ++val_batches;
    TinyClassifier::validation_step(b, i);
  }
  int64_t val_batches = 0;
};

TEST(MinSteps, AStopRequestWaitsUntilMinStepsAndIsLoggedOnce) {
  volt_test::TempDir dir;
  {  // control: the request stops the first batch
    TinyClassifier model;
    volt::Trainer t(quiet(dir.path).max_epochs(5).callbacks({std::make_shared<StopAlways>()}));
    t.fit(model, volt_test::loader(volt_test::blobs(160)));
    EXPECT_EQ(t.state().global_step, 1);
  }
  TinyClassifier model;
  volt::Trainer t(
      quiet(dir.path).max_epochs(5).min_steps(13).callbacks({std::make_shared<StopAlways>()}));
  const auto lines = volt_test::capture_logs(
      [&] { t.fit(model, volt_test::loader(volt_test::blobs(160))); });  // 10 batches an epoch
  EXPECT_EQ(t.state().global_step, 13);
  EXPECT_EQ(t.state().epoch, 1);
  const auto deferred = std::count_if(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("min_steps=13 are not met yet") != std::string::npos;
  });
  EXPECT_EQ(deferred, 1);
}

TEST(MinSteps, MaxStepsStillEndsTheRunAndBothMinimaMustBeMet) {
  volt_test::TempDir dir;
  {
    TinyClassifier model;
    volt::Trainer t(
        quiet(dir.path).max_steps(7).min_steps(7).callbacks({std::make_shared<StopAlways>()}));
    t.fit(model, volt_test::loader(volt_test::blobs(160)));
    EXPECT_EQ(t.state().global_step, 7);
  }
  {  // min_epochs=2 outlasts min_steps=3: the stop waits for the second epoch's end, as
     // Lightning's _can_stop_early counts processed epochs (it stopped at the second epoch's
     // first batch, 11 steps: 1.1 epochs trained for min_epochs=2)
    TinyClassifier model;
    volt::Trainer t(quiet(dir.path).max_epochs(5).min_epochs(2).min_steps(3).callbacks(
        {std::make_shared<StopAlways>()}));
    t.fit(model, volt_test::loader(volt_test::blobs(160)));
    EXPECT_EQ(t.state().epoch, 1);
    EXPECT_EQ(t.state().global_step, 20);
  }
  EXPECT_NE(volt_test::error_of<volt::ConfigError>([] {
              volt::TrainerOptions().min_steps(-1).validate();
            }).find("min_steps=-1 is negative"),
            std::string::npos);
  EXPECT_NE(volt_test::error_of<volt::ConfigError>([] {
              volt::TrainerOptions().min_steps(10).max_steps(5).validate();
            }).find("min_steps=10 exceeds max_steps=5"),
            std::string::npos);
}

// Lightning's epoch loop checks `done` before its first batch: a stop asked for in
// on_train_epoch_start trains nothing (volt trained one batch, and validated on a validation
// epoch); with a minimum to meet, training goes on until it is.
TEST(MinSteps, AStopAskedAtTheEpochStartTrainsNoBatchUnlessAMinimumWaits) {
  volt_test::TempDir dir;
  {
    CountingClassifier model;
    volt::Trainer t(
        quiet(dir.path).max_epochs(3).callbacks({std::make_shared<StopAtEpochStart>()}));
    t.fit(model, volt_test::loader(volt_test::blobs(160)), volt_test::loader(volt_test::blobs(32)));
    EXPECT_EQ(t.state().global_step, 0);
    EXPECT_EQ(t.state().epoch, 0);
    EXPECT_EQ(model.val_batches, 0) << "no batch trained, so no stop validation either";
  }
  {  // min_steps without min_epochs: min_epochs 1, as Lightning's _parse_loop_limits, so the
     // first epoch trains whole (10 batches); it stopped after 3 steps before
    TinyClassifier model;
    volt::Trainer t(quiet(dir.path).max_epochs(3).min_steps(3).callbacks(
        {std::make_shared<StopAtEpochStart>()}));
    t.fit(model, volt_test::loader(volt_test::blobs(160)));  // 10 batches an epoch
    EXPECT_EQ(t.state().global_step, 10);
    EXPECT_EQ(t.state().epoch, 0);
  }
  {  // an explicit min_epochs=0 beside it: min_steps alone waits
    TinyClassifier model;
    volt::Trainer t(quiet(dir.path).max_epochs(3).min_epochs(0).min_steps(3).callbacks(
        {std::make_shared<StopAtEpochStart>()}));
    t.fit(model, volt_test::loader(volt_test::blobs(160)));
    EXPECT_EQ(t.state().global_step, 3);
  }
}

// Lightning's docs: "In case max_time is used together with min_steps or min_epochs, the min_*
// requirement always has precedence" (its max_time is a Timer's stop request). volt's max_time
// ended the fit at once.
TEST(MinSteps, MaxTimeWaitsForTheMinima) {
  volt_test::TempDir dir;
  {  // min_steps alone implies min_epochs=1 (Lightning's _parse_loop_limits): the first epoch
     // ends first (10 batches)
    TinyClassifier model;
    volt::Trainer t(quiet(dir.path).max_epochs(1000).max_time(1e-6).min_steps(5));
    t.fit(model, volt_test::loader(volt_test::blobs(160)));
    EXPECT_EQ(t.state().global_step, 10);
  }
  {
    TinyClassifier model;
    volt::Trainer t(quiet(dir.path).max_epochs(1000).max_time(1e-6).min_epochs(0).min_steps(5));
    t.fit(model, volt_test::loader(volt_test::blobs(160)));
    EXPECT_EQ(t.state().global_step, 5);
  }
  TinyClassifier model;
  volt::Trainer t(quiet(dir.path).max_epochs(1000).max_time(1e-6).min_epochs(2));
  const auto lines = volt_test::capture_logs(
      [&] { t.fit(model, volt_test::loader(volt_test::blobs(160))); });  // 10 batches an epoch
  EXPECT_EQ(t.state().global_step, 20);
  EXPECT_EQ(t.state().epoch, 1);
  EXPECT_EQ(std::count_if(lines.begin(), lines.end(),
                          [](const std::string& l) {
                            return l.find("max_time is reached, but min_epochs=2") !=
                                   std::string::npos;
                          }),
            1);
}

TEST(OverfitBatches, EveryEpochTrainsOnTheSameFirstBatchesUnshuffled) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(160);  // 10 batches of 16
  CountingClassifier model;
  auto rec = std::make_shared<BatchRecorder>();
  volt::Trainer t(
      quiet(dir.path).max_epochs(3).overfit_batches(3).limit_val_batches(0).callbacks({rec}));
  const auto lines = volt_test::capture_logs([&] {
    t.fit(model, volt_test::loader(train, 16, /*shuffle=*/true),
          volt_test::loader(volt_test::blobs(160, 8, 1), 16, false));
  });
  ASSERT_EQ(rec->epochs.size(), 3u);
  for (const auto& epoch : rec->epochs) {
    ASSERT_EQ(epoch.size(), 3u);
    for (int64_t b = 0; b < 3; ++b) {  // the dataset's first rows, in order
      EXPECT_TRUE(torch::equal(epoch[b], train->inputs().slice(0, b * 16, (b + 1) * 16)))
          << "batch " << b;
    }
  }
  // limit_val_batches=0 is replaced too: 3 validation batches per epoch.
  EXPECT_EQ(model.val_batches, 3 * 3);
  const auto has = [&](const std::string& phrase) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.find(phrase) != std::string::npos; });
  };
  EXPECT_TRUE(has("turning its shuffling off")) << "no shuffle warning";
  EXPECT_TRUE(
      has("overfit_batches=3: every epoch trains on the same 3 batch(es) and validates "
          "on 3"));
  // validate() takes the same limit; test() does not.
  model.val_batches = 0;
  t.validate(model, volt_test::loader(volt_test::blobs(160, 8, 1), 16, false));
  EXPECT_EQ(model.val_batches, 3);

  // A shuffled validation loader validates on its first batches in order too (Lightning's
  // _resolve_overfit_batches turns its shuffling off in fit, with a warning); it shuffled.
  struct FirstValRows : volt::Callback {
    std::string state_key() const override { return "FirstValRows"; }
    void on_validation_batch_start(volt::RunContext&, volt::Module&, const volt::Batch& b,
                                   int64_t) override {
      rows.push_back(b.input.clone());
    }
    std::vector<torch::Tensor> rows;
  };
  auto val_rows = std::make_shared<FirstValRows>();
  const auto val = volt_test::blobs(160, 8, 1);
  CountingClassifier again;
  volt::Trainer shuffled(quiet(dir.path).max_epochs(2).overfit_batches(2).callbacks({val_rows}));
  const auto shuffled_lines = volt_test::capture_logs([&] {
    shuffled.fit(again, volt_test::loader(train, 16, false), volt_test::loader(val, 16, true));
  });
  ASSERT_EQ(val_rows->rows.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(
        torch::equal(val_rows->rows[i], val->inputs().slice(0, (i % 2) * 16, (i % 2 + 1) * 16)))
        << "validation batch " << i;
  }
  EXPECT_TRUE(volt_test::has(shuffled_lines,
                             "the validation DataLoader shuffles; turning its shuffling off"));
}

TEST(OverfitBatches, AFractionOfTheLoaderAndTheModelFitsThoseBatches) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(128);  // 8 batches of 16
  TinyClassifier model(8, 0.05, /*adam=*/true);
  model.drop->options.p(0.0);
  auto rec = std::make_shared<BatchRecorder>();
  volt::Trainer t(quiet(dir.path).max_epochs(150).overfit_batches(0.25).callbacks({rec}));
  t.fit(model, volt_test::loader(train, 16, false));
  ASSERT_EQ(rec->epochs.front().size(), 2u);  // floor(0.25 * 8)
  // Memorised: the loss on those 32 rows is near zero (a model that cannot get there has a bug).
  torch::NoGradGuard g;
  const double loss = torch::cross_entropy_loss(model.forward(train->inputs().slice(0, 0, 32)),
                                                train->targets().slice(0, 0, 32))
                          .item<double>();
  EXPECT_LT(loss, 0.05);
  EXPECT_NE(volt_test::error_of<volt::ConfigError>([] {
              volt::TrainerOptions().overfit_batches(1.5).validate();
            }).find("overfit_batches=1.5"),
            std::string::npos);
  EXPECT_NE(volt_test::error_of<volt::ConfigError>([] {
              volt::TrainerOptions().overfit_batches(-2).validate();
            }).find("overfit_batches=-2"),
            std::string::npos);
}

// Lightning's _parse_num_batches: a fraction that leaves no batch of a non-empty loader is an
// error naming the option and the least fraction that would run one (volt ran 1 batch).
TEST(LimitBatches, AFractionBelowOneBatchIsAConfigErrorNamingTheLeastThatWorks) {
  volt_test::TempDir dir;
  const auto train = [] { return volt_test::loader(volt_test::blobs(128), 16, false); };     // 8
  const auto val = [] { return volt_test::loader(volt_test::blobs(64, 8, 1), 16, false); };  // 4
  struct Case {
    volt::TrainerOptions opts;
    const char* entry;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {quiet(dir.path).limit_train_batches(0.1), "fit",
       "limit_train_batches=0.1 of a loader of 8 batches is less than one batch; raise "
       "limit_train_batches to at least 0.125"},
      {quiet(dir.path).limit_val_batches(0.2), "fit", "limit_val_batches=0.2 of a loader of 4"},
      // The least fraction shown is rounded up: 1/3 printed as 0.333333 would still be refused.
      {quiet(dir.path).limit_val_batches(0.3), "validate3",
       "limit_val_batches=0.3 of a loader of 3 batches is less than one batch; raise "
       "limit_val_batches to at least 0.333334"},
      {quiet(dir.path).overfit_batches(0.1), "fit", "overfit_batches=0.1 of a loader of "},
      {quiet(dir.path).limit_val_batches(0.2), "validate", "limit_val_batches=0.2"},
      {quiet(dir.path).limit_test_batches(0.2), "test", "limit_test_batches=0.2"},
      {quiet(dir.path).limit_predict_batches(0.2), "predict", "limit_predict_batches=0.2"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expected);
    TinyClassifier model;
    volt::Trainer t(volt::TrainerOptions(c.opts).max_epochs(1));
    const std::string entry = c.entry;
    const std::string error = volt_test::error_of<volt::ConfigError>([&] {
      if (entry == "fit") t.fit(model, train(), val());
      if (entry == "validate") t.validate(model, val());
      if (entry == "validate3") {
        t.validate(model, volt_test::loader(volt_test::blobs(48, 8, 1), 16, false));
      }
      if (entry == "test") t.test(model, val());
      if (entry == "predict") t.predict(model, val());
    });
    EXPECT_NE(error.find(c.expected), std::string::npos) << error;
  }
  // The least fraction that works runs its one batch (the one the message shows too); 0.0 runs
  // none, as Lightning.
  TinyClassifier shown;
  volt::Trainer at_least(quiet(dir.path).limit_val_batches(0.333334));
  EXPECT_NO_THROW(
      at_least.validate(shown, volt_test::loader(volt_test::blobs(48, 8, 1), 16, false)));
  TinyClassifier model;
  auto rec = std::make_shared<BatchRecorder>();
  volt::Trainer t(
      quiet(dir.path).max_epochs(1).limit_train_batches(0.125).limit_val_batches(0.0).callbacks(
          {rec}));
  t.fit(model, train(), val());
  ASSERT_EQ(rec->epochs.size(), 1u);
  EXPECT_EQ(rec->epochs.front().size(), 1u);
}

/// Its loss is finite, but backward makes a NaN gradient: sqrt'(0) = inf, times 0.
class NanInBackward : public TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    anomaly_mode_seen = torch::autograd::AnomalyMode::is_enabled();
    return TinyClassifier::training_step(b, i) + (fc1->weight * 0).sqrt().sum();
  }
  bool anomaly_mode_seen = false;
};

TEST(DetectAnomaly, NamesTheBackwardFunctionThatMadeANaN) {
  volt_test::TempDir dir;
  {  // control: without it the step runs and leaves NaN weights
    NanInBackward model;
    volt::Trainer t(quiet(dir.path).max_steps(1));
    t.fit(model, volt_test::loader(volt_test::blobs(64)));
    EXPECT_EQ(t.state().global_step, 1);
    EXPECT_FALSE(model.anomaly_mode_seen);
    EXPECT_TRUE(model.fc1->weight.isnan().any().item<bool>());
  }
  NanInBackward model;
  volt::Trainer t(quiet(dir.path).max_steps(1).detect_anomaly(true));
  std::string what;
  const auto lines = volt_test::capture_logs([&] {
    try {
      t.fit(model, volt_test::loader(volt_test::blobs(64)));
    } catch (const std::exception& e) {
      what = e.what();
    }
  });
  // The backward of (fc1->weight * 0) turns sqrt's infinite gradient into NaN (libtorch 1.13
  // names the scalar product MulBackward1).
  EXPECT_NE(what.find("Function 'MulBackward"), std::string::npos) << what;
  EXPECT_NE(what.find("returned nan values in its 0th output"), std::string::npos) << what;
  EXPECT_TRUE(model.anomaly_mode_seen);
  EXPECT_EQ(t.state().global_step, 0);
  EXPECT_FALSE(model.fc1->weight.isnan().any().item<bool>());
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("fit failed in backward at epoch 0, batch 0") != std::string::npos;
  }));
  // Process-wide only while the entry point ran.
  EXPECT_FALSE(torch::autograd::AnomalyMode::is_enabled());
}

}  // namespace
