#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
