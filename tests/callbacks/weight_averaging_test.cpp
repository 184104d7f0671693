#include <gtest/gtest.h>

#include "error_text.h"
#include "log_capture.h"
#include "requires.h"
#include "reread.h"
#include "save_at.h"
#include "tiny.h"

namespace {

using volt_test::SaveAt;

using volt::EMAWeightAveraging;
using volt::EMAWeightAveragingOptions;
using volt_test::has;
using volt_test::quiet;
using volt_test::TinyClassifier;

/// The trained weights after every optimizer step, and what the module holds during each
/// validation epoch (listed after the averaging callback, so it sees what validation runs on).
class Watch : public volt::Callback {
 public:
  std::string state_key() const override { return "Watch"; }
  void on_train_batch_end(volt::RunContext&, volt::Module& m, const volt::Batch&,
                          int64_t) override {
    steps.push_back(static_cast<TinyClassifier&>(m).flat_params());
  }
  void on_validation_epoch_start(volt::RunContext& run, volt::Module& m) override {
    in_validation.push_back(static_cast<TinyClassifier&>(m).flat_params());
    steps_before_validation.push_back(run.state().global_step);
  }
  void on_validation_end(volt::RunContext&, volt::Module& m) override {
    after_validation.push_back(static_cast<TinyClassifier&>(m).flat_params());
  }
  std::vector<torch::Tensor> steps, in_validation, after_validation;
  std::vector<int64_t> steps_before_validation;
};

/// The EMA of steps[first], steps[first + every], ... up to (not including) `end`.
torch::Tensor ema_of(const std::vector<torch::Tensor>& steps, double decay, size_t first,
                     size_t every, size_t end) {
  torch::Tensor ema = steps.at(first);
  for (size_t i = first + every; i < end; i += every) ema = decay * ema + (1 - decay) * steps[i];
  return ema;
}

TEST(WeightAveraging, EmaAfterEveryStepValidatesAndEndsOnTheAverage) {
  volt_test::TempDir dir;
  TinyClassifier model;
  auto ema = std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions().decay(0.9));
  auto watch = std::make_shared<Watch>();
  volt::Trainer t(quiet(dir.path).max_epochs(2).callbacks({ema, watch}));
  auto val = volt_test::loader(volt_test::blobs(32, 8, 4), 16, false);
  const auto lines =
      volt_test::capture_logs([&] { t.fit(model, volt_test::loader(volt_test::blobs(96)), val); });
  ASSERT_EQ(watch->steps.size(), 12u);
  EXPECT_EQ(ema->n_averaged(), 12);
  const torch::Tensor expect = ema_of(watch->steps, 0.9, 0, 1, 12);
  EXPECT_TRUE(torch::allclose(model.flat_params(), expect, 1e-6, 1e-7));
  EXPECT_FALSE(torch::allclose(model.flat_params(), watch->steps.back(), 1e-4, 1e-5));
  // Each epoch's validation ran on the average so far; training went on from its own weights.
  ASSERT_EQ(watch->in_validation.size(), 2u);
  EXPECT_EQ(watch->steps_before_validation, (std::vector<int64_t>{6, 12}));
  EXPECT_TRUE(
      torch::allclose(watch->in_validation[0], ema_of(watch->steps, 0.9, 0, 1, 6), 1e-6, 1e-7));
  EXPECT_TRUE(torch::equal(watch->after_validation[0], watch->steps[5]));
  EXPECT_TRUE(has(lines, "the module now holds the average of 12"));
}

// A layer registered under two names (a tied or shared weight) is one tensor: averaged once and
// swapped once. Swapped twice (once per name), validation left the average in the module and
// training went on from it.
TEST(WeightAveraging, ASharedLayerIsAveragedOnceAndTrainingGoesOnFromItsOwnWeights) {
  struct Aliased : TinyClassifier {
    Aliased() { register_module("fc1_again", fc1); }
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      return {volt::OptimizerConfig(std::make_shared<torch::optim::SGD>(
          volt::distinct_parameters(*this), torch::optim::SGDOptions(0.1).momentum(0.9)))};
    }
  };
  volt_test::TempDir dir;
  Aliased model;
  auto ema = std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions().decay(0.5));
  auto watch = std::make_shared<Watch>();
  volt::Trainer t(quiet(dir.path).max_epochs(2).callbacks({ema, watch}));
  auto val = volt_test::loader(volt_test::blobs(32, 8, 4), 16, false);
  t.fit(model, volt_test::loader(volt_test::blobs(96)), val);
  ASSERT_EQ(watch->steps.size(), 12u);
  ASSERT_EQ(watch->after_validation.size(), 2u);
  EXPECT_TRUE(torch::equal(watch->after_validation[0], watch->steps[5]));
  EXPECT_TRUE(
      torch::allclose(watch->in_validation[0], ema_of(watch->steps, 0.5, 0, 1, 6), 1e-6, 1e-7));
  EXPECT_TRUE(
      torch::allclose(model.flat_params(), ema_of(watch->steps, 0.5, 0, 1, 12), 1e-6, 1e-7));
}

TEST(WeightAveraging, UnderBf16PrecisionsTheAverageFollowsTheTrainedWeights) {
  // bf16-mixed trains float32 weights (autocast computes in bfloat16): the average is theirs.
  // bf16-true trains bfloat16 weights: the average is kept in bfloat16 too, within its rounding
  // of the exact EMA of the weights each step left.
  for (const std::string precision : {"bf16-mixed", "bf16-true"}) {
    volt_test::TempDir dir;
    TinyClassifier model;
    auto ema = std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions().decay(0.9));
    auto watch = std::make_shared<Watch>();
    volt::Trainer t(quiet(dir.path).max_epochs(2).precision(precision).callbacks({ema, watch}));
    volt_test::capture_logs([&] { t.fit(model, volt_test::loader(volt_test::blobs(96))); });
    ASSERT_EQ(watch->steps.size(), 12u) << precision;
    std::vector<torch::Tensor> exact;
    for (const auto& w : watch->steps) exact.push_back(w.to(torch::kDouble));
    const torch::Tensor expect = ema_of(exact, 0.9, 0, 1, 12);
    const torch::Tensor got = model.flat_params();
    const bool bf16_true = precision == "bf16-true";
    EXPECT_EQ(got.scalar_type(), bf16_true ? torch::kBFloat16 : torch::kFloat) << precision;
    const double err = (got.to(torch::kDouble) - expect).abs().max().item<double>();
    const double scale = expect.abs().max().item<double>();
    // bfloat16 rounds each update (2^-9 relative); over the updates that adds up to a few ulps of
    // the largest weight.
    EXPECT_LT(err, (bf16_true ? 2e-2 : 1e-6) * scale) << precision;
    // Far nearer the average than the last weights are: it is the average.
    const double last = (exact.back() - expect).abs().max().item<double>();
    EXPECT_LT(err, 0.25 * last) << precision << ": " << err << " vs " << last;
    EXPECT_EQ(ema->n_averaged(), 12) << precision;
  }
}

TEST(WeightAveraging, StepStartEveryNAndEpochUpdates) {
  volt_test::TempDir dir;
  TinyClassifier model;
  auto ema = std::make_shared<EMAWeightAveraging>(
      EMAWeightAveragingOptions().decay(0.5).update_every_n_steps(2).update_starting_at_step(3));
  auto watch = std::make_shared<Watch>();
  volt::Trainer t(quiet(dir.path).max_epochs(2).callbacks({ema, watch}));
  t.fit(model, volt_test::loader(volt_test::blobs(96)));
  // Steps 0..11: updates after steps 4, 6, 8, 10 (even indices from 3 on).
  EXPECT_EQ(ema->n_averaged(), 4);
  EXPECT_TRUE(
      torch::allclose(model.flat_params(), ema_of(watch->steps, 0.5, 4, 2, 12), 1e-6, 1e-7));
  EXPECT_TRUE(ema->should_update(c10::nullopt, 5) == false);
  EMAWeightAveraging by_epoch(
      EMAWeightAveragingOptions().update_every_n_steps(0).update_starting_at_epoch(1));
  EXPECT_FALSE(by_epoch.should_update(7, c10::nullopt));
  EXPECT_FALSE(by_epoch.should_update(c10::nullopt, 0));
  EXPECT_TRUE(by_epoch.should_update(c10::nullopt, 1));

  // An epoch that max_steps ends early still gets its epoch update (Lightning's
  // on_train_epoch_end): 6 batches an epoch, max_steps 8 ends epoch 1 after its second step.
  TinyClassifier short_model;
  auto per_epoch = std::make_shared<EMAWeightAveraging>(
      EMAWeightAveragingOptions().decay(0.5).update_every_n_steps(0).update_starting_at_epoch(0));
  auto w3 = std::make_shared<Watch>();
  volt::Trainer(quiet(dir.path).max_epochs(3).max_steps(8).callbacks({per_epoch, w3}))
      .fit(short_model, volt_test::loader(volt_test::blobs(96)));
  ASSERT_EQ(w3->steps.size(), 8u);
  EXPECT_EQ(per_epoch->n_averaged(), 2);
  EXPECT_TRUE(torch::allclose(short_model.flat_params(), 0.5 * w3->steps[5] + 0.5 * w3->steps[7],
                              1e-6, 1e-7));

  // The plain callback: the equal-weight mean of every step.
  TinyClassifier plain_model;
  auto mean = std::make_shared<volt::WeightAveraging>();
  auto w2 = std::make_shared<Watch>();
  volt::Trainer(quiet(dir.path).max_epochs(1).callbacks({mean, w2}))
      .fit(plain_model, volt_test::loader(volt_test::blobs(64)));
  const torch::Tensor avg = (w2->steps[0] + w2->steps[1] + w2->steps[2] + w2->steps[3]) / 4;
  EXPECT_TRUE(torch::allclose(plain_model.flat_params(), avg, 1e-6, 1e-7));
}

// Checkpoints hold the average as the module's state (what validate/test and inference load)
// and the training weights in the callback's state: a fit resumed from one, saved before the
// callback's own update of that step, ends bit for bit as the uninterrupted fit.
TEST(WeightAveraging, CheckpointsHoldTheAverageAndResumeExactly) {
  volt_test::TempDir dir;
  auto data = volt_test::blobs(96);
  auto val = volt_test::loader(volt_test::blobs(32, 8, 4), 16, false);
  const auto make = [] {
    return std::make_shared<EMAWeightAveraging>(EMAWeightAveragingOptions().decay(0.8));
  };
  TinyClassifier whole;
  auto last = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "ckpt").save_last(true).save_top_k(0));
  auto save_mid = std::make_shared<SaveAt>(1, 2, dir / "mid.ckpt");
  auto watch = std::make_shared<Watch>();
  volt::Trainer tw(quiet(dir / "w").max_epochs(3).callbacks({save_mid, make(), watch, last}));
  tw.fit(whole, volt_test::loader(data), val);

  // mid.ckpt: its module state is the average after step 9 (epoch 1, batch 2).
  TinyClassifier loaded;
  volt::Trainer(quiet(dir / "v")).validate(loaded, val, dir / "mid.ckpt");
  EXPECT_TRUE(
      torch::allclose(loaded.flat_params(), ema_of(watch->steps, 0.8, 0, 1, 9), 1e-6, 1e-7));
  TinyClassifier from_last;
  volt::Trainer(quiet(dir / "v")).validate(from_last, val, dir / "ckpt/last.ckpt");
  EXPECT_TRUE(torch::equal(from_last.flat_params(), whole.flat_params()));

  TinyClassifier resumed;
  auto cb = make();
  volt::Trainer tr(quiet(dir / "r").max_epochs(3).callbacks({cb}));
  tr.fit(resumed, volt_test::loader(data), val, dir / "mid.ckpt");
  EXPECT_EQ(cb->n_averaged(), 18);
  EXPECT_TRUE(torch::equal(resumed.flat_params(), whole.flat_params()));
}

TEST(WeightAveraging, RefusesBadOptionsDeepSpeedAndADamagedState) {
  using volt_test::error_of;
  EXPECT_TRUE(has(error_of<volt::ConfigError>(
                      [] { EMAWeightAveraging(EMAWeightAveragingOptions().decay(1.5)); }),
                  "decay=1.5 must be in [0, 1]"));
  EXPECT_TRUE(has(error_of<volt::ConfigError>([] {
                    EMAWeightAveraging(EMAWeightAveragingOptions().update_every_n_steps(-1));
                  }),
                  "update_every_n_steps=-1 must be >= 0"));
  EXPECT_TRUE(has(error_of<volt::ConfigError>([] {
                    EMAWeightAveraging(EMAWeightAveragingOptions().update_starting_at_step(-2));
                  }),
                  "0-based indices; give values >= 0"));
  volt_test::TempDir dir;
  TinyClassifier model;
  if (volt_test::gloo()) {  // a one-process DeepSpeed fit on the CPU makes a Gloo group
    EXPECT_TRUE(has(error_of<volt::ConfigError>([&] {
                      volt::Trainer(quiet(dir.path)
                                        .max_epochs(1)
                                        .strategy("deepspeed_stage_2")
                                        .callbacks({std::make_shared<EMAWeightAveraging>()}))
                          .fit(model, volt_test::loader(volt_test::blobs(64)));
                    }),
                    "[WeightAveraging] does not work with the deepspeed strategy"));
  }
  torch::serialize::OutputArchive out;
  out.write("n_averaged", c10::IValue(int64_t{3}));
  out.write("latest_update_step", c10::IValue(int64_t{3}));
  out.write("latest_update_epoch", c10::IValue(int64_t{-1}));
  auto in = volt_test::reread(out);
  EXPECT_TRUE(has(error_of<volt::CheckpointError>([&] { EMAWeightAveraging().load_state(in); }),
                  "counts 3 averaged updates but holds no weights; it is damaged"));
}

}  // namespace
