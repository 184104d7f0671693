#include <gtest/gtest.h>

#include <cmath>

#include "log_capture.h"
#include "tiny.h"

namespace {

class Const : public volt_test::TinyClassifier {
 public:
  explicit Const(std::vector<double> seq) : seq_(std::move(seq)) {}
  void validation_step(const volt::Batch&, int64_t) override {
    log("m", seq_[std::min<size_t>(current_epoch(), seq_.size() - 1)]);
  }
  std::vector<double> seq_;
};

int64_t epochs_run(std::vector<double> seq, volt::EarlyStoppingOptions o, int64_t min_epochs = 0) {
  volt_test::TempDir dir;
  Const model(std::move(seq));
  auto es = std::make_shared<volt::EarlyStopping>(o);
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(20).min_epochs(min_epochs).callbacks({es}));
  t.fit(model, volt_test::loader(volt_test::blobs(32)), volt_test::loader(volt_test::blobs(32)));
  return t.state().epoch + 1;
}

TEST(EarlyStopping, PatienceCountsChecksWithoutImprovement) {
  // Improves at epochs 0,1 then flat: stops after 2 more checks (epoch 3).
  EXPECT_EQ(epochs_run({5, 4, 4, 4, 4}, volt::EarlyStoppingOptions("m").patience(2)), 4);
  // min_delta: a 0.05 improvement does not count when min_delta = 0.1.
  EXPECT_EQ(
      epochs_run({5, 4.95, 4.9, 4.85}, volt::EarlyStoppingOptions("m").patience(1).min_delta(0.1)),
      2);
  // Max mode.
  EXPECT_EQ(
      epochs_run({1, 2, 3, 3}, volt::EarlyStoppingOptions("m").mode(volt::Mode::kMax).patience(1)),
      4);
  // min_epochs wins over a stop request.
  EXPECT_EQ(epochs_run({5, 5, 5, 5, 5, 5, 5}, volt::EarlyStoppingOptions("m").patience(1), 6), 6);
}

// A metric the training logs per epoch: by default (one validation per epoch, or none) the
// check is at the train epoch's end, where that epoch's mean exists, as Lightning. Before, it was
// after validation only: without a validation loader it never ran (all 20 epochs), with one the
// metric was missing there (a ConfigError).
class EpochMetric : public volt_test::TinyClassifier {
 public:
  explicit EpochMetric(std::vector<double> seq) : seq_(std::move(seq)) {}
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    log("m", seq_[std::min<size_t>(current_epoch(), seq_.size() - 1)],
        volt::LogOptions().on_step(false).on_epoch(true));
    return volt_test::TinyClassifier::training_step(b, i);
  }
  std::vector<double> seq_;
};

TEST(EarlyStopping, ByDefaultAMetricOfTheTrainingEpochIsCheckedAtItsEnd) {
  for (bool with_validation : {false, true}) {
    volt_test::TempDir dir;
    EpochMetric model({5, 4, 4, 4, 4});
    auto es = std::make_shared<volt::EarlyStopping>(volt::EarlyStoppingOptions("m").patience(1));
    EXPECT_EQ(es->stopped_epoch(), 0);  // Lightning's value before a stop
    volt::Trainer t(volt_test::quiet(dir.path).max_epochs(20).callbacks({es}));
    if (with_validation) {
      t.fit(model, volt_test::loader(volt_test::blobs(32)),
            volt_test::loader(volt_test::blobs(32)));
    } else {
      t.fit(model, volt_test::loader(volt_test::blobs(32)));
    }
    EXPECT_EQ(t.state().epoch + 1, 3) << "with validation: " << with_validation;
    EXPECT_EQ(es->stopped_epoch(), 2);
  }
  // Without validation it checks at each epoch's end whatever check_val_every_n_epoch says
  // (Lightning never would).
  {
    volt_test::TempDir dir;
    EpochMetric model({5, 4, 4, 4, 4});
    auto es = std::make_shared<volt::EarlyStopping>(volt::EarlyStoppingOptions("m").patience(1));
    volt::Trainer t(
        volt_test::quiet(dir.path).max_epochs(20).check_val_every_n_epoch(3).callbacks({es}));
    t.fit(model, volt_test::loader(volt_test::blobs(32)));
    EXPECT_EQ(t.state().epoch + 1, 3);
  }
  // Asked to check after validation, a metric of the training epoch is not there yet.
  volt_test::TempDir dir;
  EpochMetric model({5});
  auto es = std::make_shared<volt::EarlyStopping>(
      volt::EarlyStoppingOptions("m").check_on_train_epoch_end(false));
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(2).callbacks({es}));
  EXPECT_THROW(t.fit(model, volt_test::loader(volt_test::blobs(32)),
                     volt_test::loader(volt_test::blobs(32))),
               volt::ConfigError);
}

// Several validations per epoch: the default checks after each (patience counts validations).
TEST(EarlyStopping, ByDefaultSeveralValidationsPerEpochAreEachChecked) {
  volt_test::TempDir dir;
  Const model({5});  // the same value at every validation: no improvement after the first
  auto es = std::make_shared<volt::EarlyStopping>(volt::EarlyStoppingOptions("m").patience(1));
  volt::Trainer t(
      volt_test::quiet(dir.path).max_epochs(20).val_check_interval(0.5).callbacks({es}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(t.state().epoch, 0);  // the second validation of epoch 0 stops it
  EXPECT_EQ(t.state().global_step, 4);
}

TEST(EarlyStopping, ThresholdsAndFiniteCheck) {
  EXPECT_EQ(epochs_run({5, 4, 0.5, 0.1}, volt::EarlyStoppingOptions("m").stopping_threshold(1.0)),
            3);
  EXPECT_EQ(epochs_run({5, 4, 50, 1}, volt::EarlyStoppingOptions("m").divergence_threshold(10.0)),
            3);
  EXPECT_EQ(epochs_run({5, std::nan(""), 1}, volt::EarlyStoppingOptions("m")), 2);
}

TEST(EarlyStopping, MissingMetricIsAConfigErrorWhenStrict) {
  volt_test::TempDir dir;
  Const model({1});
  auto es = std::make_shared<volt::EarlyStopping>(volt::EarlyStoppingOptions("nope"));
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(2).callbacks({es}));
  try {
    t.fit(model, volt_test::loader(volt_test::blobs(32)), volt_test::loader(volt_test::blobs(32)));
    FAIL();
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"nope\" was not logged"), std::string::npos) << e.what();
  }
  EXPECT_THROW(volt::EarlyStopping(volt::EarlyStoppingOptions("")), volt::ConfigError);
  // strict(false): the run goes on; with verbose it says so once (Lightning's RuntimeWarning),
  // quietly otherwise.
  for (const bool verbose : {true, false}) {
    const auto logs = volt_test::capture_logs([&] {
      EXPECT_EQ(epochs_run({1}, volt::EarlyStoppingOptions("nope_" + std::to_string(verbose))
                                    .strict(false)
                                    .verbose(verbose)),
                20);
    });
    int warned = 0;
    for (const auto& l : logs)
      warned += l.find("is not available, so it does not stop") != std::string::npos;
    EXPECT_EQ(warned, verbose ? 1 : 0) << verbose;
  }
}

// As Lightning: off under fast_dev_run, where a smoke run's monitor may not be logged (it was a
// ConfigError, exit 2 from the CLI) and a stop would cut the smoke run short.
TEST(EarlyStopping, IsOffUnderFastDevRun) {
  volt_test::TempDir dir;
  Const model({1});
  auto es = std::make_shared<volt::EarlyStopping>(volt::EarlyStoppingOptions("nope"));
  volt::Trainer t(volt_test::quiet(dir.path).fast_dev_run(1).callbacks({es}));
  EXPECT_NO_THROW(t.fit(model, volt_test::loader(volt_test::blobs(32)),
                        volt_test::loader(volt_test::blobs(32))));
  EXPECT_EQ(es->wait_count(), 0);
  EXPECT_FALSE(t.state().should_stop);
}

// verbose: each improvement and the stop, in Lightning's words (one process: no rank prefix).
TEST(EarlyStopping, VerboseLogsImprovementsAndTheStop) {
  const auto logs = volt_test::capture_logs([] {
    epochs_run({5, 4, 4, 4},
               volt::EarlyStoppingOptions("m").patience(2).min_delta(0.5).verbose(true));
  });
  const auto has = [&](const std::string& text) {
    int n = 0;
    for (const auto& l : logs) n += l.find(text) != std::string::npos;
    return n;
  };
  EXPECT_EQ(has("Metric m improved. New best score: 5.000"), 1);
  EXPECT_EQ(has("Metric m improved by 1.000 >= min_delta = 0.5. New best score: 4.000"), 1);
  EXPECT_EQ(has("Monitored metric m did not improve in the last 2 records. Best score: 4.000. "
                "Signaling Trainer to stop."),
            1);
  EXPECT_EQ(has("[rank:"), 0);
  // Quiet by default.
  const auto quiet = volt_test::capture_logs([] {
    epochs_run({5, 4, 4, 4}, volt::EarlyStoppingOptions("m").patience(2));
  });
  for (const auto& l : quiet) EXPECT_EQ(l.find("improved"), std::string::npos) << l;
}

TEST(EarlyStopping, RejectsOptionsThatCouldNeverStopOrAreMeaningless) {
  const auto error_of = [](const volt::EarlyStoppingOptions& o) -> std::string {
    try {
      volt::EarlyStopping es(o);
    } catch (const volt::ConfigError& e) {
      return e.what();
    }
    return "no error";
  };
  const double nan = std::nan("");
  EXPECT_EQ(error_of(volt::EarlyStoppingOptions("m").stopping_threshold(nan)),
            "[EarlyStopping] stopping_threshold=nan can never be crossed; give a number or leave "
            "it unset.");
  EXPECT_NE(error_of(volt::EarlyStoppingOptions("m").divergence_threshold(nan))
                .find("divergence_threshold=nan can never be crossed"),
            std::string::npos);
  EXPECT_NE(error_of(volt::EarlyStoppingOptions("m").patience(-1)).find("patience=-1 is negative"),
            std::string::npos);
  EXPECT_NE(error_of(volt::EarlyStoppingOptions("m").min_delta(nan)).find("is not finite"),
            std::string::npos);
  // Infinite thresholds are numbers: accepted (divergence at +inf never triggers by design).
  EXPECT_EQ(error_of(volt::EarlyStoppingOptions("m").divergence_threshold(INFINITY)), "no error");
}

// Lightning's EarlyStoppingReason: why the fit stopped, kept in checkpoints (with the message),
// so a callback restored from one knows it too.
TEST(EarlyStopping, StoppingReasonSaysWhyAndIsCheckpointed) {
  using R = volt::EarlyStoppingReason;
  const auto reason_of = [](std::vector<double> seq, volt::EarlyStoppingOptions o) {
    volt_test::TempDir dir;
    Const model(std::move(seq));
    auto es = std::make_shared<volt::EarlyStopping>(o);
    EXPECT_EQ(es->stopping_reason(), R::kNotStopped);
    volt::Trainer t(volt_test::quiet(dir.path).max_epochs(5).callbacks({es}));
    t.fit(model, volt_test::loader(volt_test::blobs(32)), volt_test::loader(volt_test::blobs(32)));
    return std::make_pair(es->stopping_reason(), es->stop_reason());
  };
  EXPECT_EQ(reason_of({5, 4, 4, 4}, volt::EarlyStoppingOptions("m").patience(1)).first,
            R::kPatienceExhausted);
  EXPECT_EQ(reason_of({5, 0.5}, volt::EarlyStoppingOptions("m").stopping_threshold(1)).first,
            R::kStoppingThreshold);
  EXPECT_EQ(reason_of({5, 50}, volt::EarlyStoppingOptions("m").divergence_threshold(10)).first,
            R::kDivergenceThreshold);
  EXPECT_EQ(reason_of({5, NAN}, volt::EarlyStoppingOptions("m")).first, R::kNonFiniteMetric);
  EXPECT_EQ(reason_of({5, 4, 3, 2, 1}, volt::EarlyStoppingOptions("m")).first, R::kNotStopped);

  // Saved and restored with the message.
  volt_test::TempDir dir;
  Const model({5, 0.5});
  auto es =
      std::make_shared<volt::EarlyStopping>(volt::EarlyStoppingOptions("m").stopping_threshold(1));
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(5).callbacks({es}));
  t.fit(model, volt_test::loader(volt_test::blobs(32)), volt_test::loader(volt_test::blobs(32)));
  ASSERT_EQ(es->stopping_reason(), R::kStoppingThreshold);
  t.save_checkpoint(dir / "stopped.ckpt");
  auto restored =
      std::make_shared<volt::EarlyStopping>(volt::EarlyStoppingOptions("m").stopping_threshold(1));
  Const again({5, 0.5});
  volt::Trainer r(volt_test::quiet(dir.path).max_epochs(2).callbacks({restored}));
  r.fit(again, volt_test::loader(volt_test::blobs(32)), volt_test::loader(volt_test::blobs(32)),
        dir / "stopped.ckpt");
  EXPECT_EQ(restored->stopping_reason(), R::kStoppingThreshold);
  EXPECT_EQ(restored->stop_reason(), es->stop_reason());
  EXPECT_NE(restored->stop_reason().find("Stopping threshold reached"), std::string::npos)
      << restored->stop_reason();
}

}  // namespace
