// LearningRateFinder and BatchSizeFinder: the tuners run inside real fits (and validate), and
// each fit is compared with the one it stands for: a module configured at the rate found, a
// DataModule set to the size found; resumed fits end bit for bit as the uninterrupted ones.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>

#include "error_text.h"
#include "log_capture.h"
#include "requires.h"
#include "reread.h"
#include "save_at.h"
#include "tiny.h"
#include "tuner_models.h"

namespace {

using volt::BatchSizeFinderOptions;
using volt::LrFinderOptions;
using volt_test::kMiB;
using volt_test::quiet;
using volt_test::SaveAt;
using volt_test::TempDir;
using volt_test::TinyClassifier;

/// The first param group's rate at every training batch.
class Rates : public volt::Callback {
 public:
  std::string state_key() const override { return "Rates"; }
  void on_train_batch_start(volt::RunContext& run, volt::Module&, const volt::Batch&,
                            int64_t) override {
    seen.push_back(
        run.optimizer_configs().front().optimizer()->param_groups()[0].options().get_lr());
  }
  std::vector<double> seen;
};

/// TinyClassifier with AdamW at `lr` warmed up by a LinearLR (a quarter of the rate at first,
/// all of it after 8 steps): the warm-up scales the rate configure_optimizers gave, so only a
/// scheduler started again from the suggestion gives the fit of a module configured with it.
class WarmedUp : public TinyClassifier {
 public:
  explicit WarmedUp(double lr) : TinyClassifier(8, lr, /*adam=*/true), lr_(lr) {}
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(lr_));
    auto warmup = std::make_shared<volt::LinearLR>(
        *opt, volt::LinearLROptions().start_factor(0.25).end_factor(1.0).total_iters(8));
    return {volt::OptimizerConfig(opt).scheduler(warmup).interval(volt::Interval::kStep)};
  }

 private:
  double lr_;
};

/// The same initial weights for every lr.
std::unique_ptr<WarmedUp> scheduled(double lr) {
  torch::manual_seed(11);
  return std::make_unique<WarmedUp>(lr);
}

LrFinderOptions finder() {
  return LrFinderOptions().num_training(40).max_lr(1.0);
}

volt::DataLoader data() {
  return volt_test::loader(volt_test::blobs(256), 16);
}

/// TinyClassifier that records the dtype its logits have at each training step.
class DtypeProbe : public TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    const torch::Tensor logits = forward(b.input);
    dtypes.push_back(logits.scalar_type());
    return torch::cross_entropy_loss(logits.to(torch::kFloat), b.target);
  }
  std::vector<at::ScalarType> dtypes;
};

// A Precision object in TrainerOptions is used by the tuners' trial Trainers too: their teardown
// dropped the fit's op lists and CPU size rule, so the fit went on under libtorch's own autocast
// (every linear in bf16), not its policy (every linear here in fp32: linear_min_macs 1e9). The
// fit's precision is set up again after the trials.
TEST(LearningRateFinder, TheFitKeepsItsPrecisionObjectsPolicyAfterTheTrials) {
  TempDir dir;
  const auto opts =
      volt::MixedPrecisionOptions().read_env_lists(false).linear_min_macs(int64_t{1000000000});
  for (const bool batch_size_finder : {false, true}) {
    SCOPED_TRACE(batch_size_finder ? "BatchSizeFinder" : "LearningRateFinder");
    std::shared_ptr<volt::Callback> tuner =
        batch_size_finder ? std::shared_ptr<volt::Callback>(std::make_shared<volt::BatchSizeFinder>(
                                BatchSizeFinderOptions().init_val(8).max_trials(2)))
                          : std::make_shared<volt::LearningRateFinder>(finder().num_training(8));
    DtypeProbe m;
    volt::Trainer t(quiet(dir.path)
                        .max_epochs(1)
                        .precision(std::make_shared<volt::MixedPrecision>(opts))
                        .callbacks({tuner}));
    if (batch_size_finder) {
      volt_test::SizedData sized(64, 8);
      t.fit(m, sized);
    } else {
      t.fit(m, data());
    }
    ASSERT_FALSE(m.dtypes.empty());
    EXPECT_EQ(m.dtypes.back(), at::kFloat);  // the fit's last step
  }
}

TEST(LearningRateFinder, TheFitTrainsAsIfConfiguredAtTheSuggestedRate) {
  TempDir dir;
  auto lr_finder = std::make_shared<volt::LearningRateFinder>(finder());
  auto rates = std::make_shared<Rates>();
  auto tuned = scheduled(0.1);
  std::vector<std::string> lines = volt_test::capture_logs([&] {
    volt::Trainer(quiet(dir.path).max_epochs(2).callbacks({lr_finder, rates})).fit(*tuned, data());
  });
  ASSERT_TRUE(lr_finder->optimal_lr().has_value());
  const double x = *lr_finder->optimal_lr();
  EXPECT_NE(x, 0.1);
  EXPECT_TRUE(volt_test::has(lines, "[LearningRateFinder] Learning rate set to "));
  // The range test is lr_find's on the same module and loader with the Trainer's options.
  auto probe = scheduled(0.1);
  const auto ref = volt::lr_find(*probe, data(), quiet(dir.path), finder());
  EXPECT_EQ(lr_finder->result().lrs, ref.lrs);
  EXPECT_EQ(lr_finder->result().losses, ref.losses);
  EXPECT_EQ(ref.suggestion(), c10::optional<double>(x));
  // The fit is the fit of a module configured at x: the warm-up starts from x / 4 and reaches x
  // after 8 steps; the weights of the trial steps and the random state are put back.
  auto plain = scheduled(x);
  auto plain_rates = std::make_shared<Rates>();
  volt::Trainer(quiet(dir.path).max_epochs(2).callbacks({plain_rates})).fit(*plain, data());
  ASSERT_EQ(rates->seen.size(), 32u);
  EXPECT_EQ(rates->seen, plain_rates->seen);
  EXPECT_EQ(rates->seen[0], x * 0.25);
  EXPECT_DOUBLE_EQ(rates->seen[8], x);
  EXPECT_TRUE(torch::equal(tuned->flat_params(), plain->flat_params()));

  // update_attr false: the same test, reported only; the fit is the one without the callback.
  auto report = std::make_shared<volt::LearningRateFinder>(finder(), /*update_attr=*/false);
  auto reported = scheduled(0.1);
  volt::Trainer(quiet(dir.path).max_epochs(1).callbacks({report})).fit(*reported, data());
  EXPECT_EQ(report->optimal_lr(), c10::optional<double>(x));
  auto untouched = scheduled(0.1);
  volt::Trainer(quiet(dir.path).max_epochs(1)).fit(*untouched, data());
  EXPECT_TRUE(torch::equal(reported->flat_params(), untouched->flat_params()));
}

// On a GPU: the trials draw dropout masks from the GPU's generator, which is put back with the
// weights, so the fit is still the fit of a module configured at the suggested rate.
TEST(LearningRateFinderCuda, TheFitTrainsAsIfConfiguredAtTheSuggestedRate) {
  VOLT_REQUIRE_CUDA();
  TempDir dir;
  auto lr_finder = std::make_shared<volt::LearningRateFinder>(finder());
  auto rates = std::make_shared<Rates>();
  auto tuned = scheduled(0.1);
  const auto cuda = quiet(dir.path).accelerator("cuda").max_epochs(2);
  torch::cuda::manual_seed_all(5);
  volt::Trainer(volt::TrainerOptions(cuda).callbacks({lr_finder, rates})).fit(*tuned, data());
  ASSERT_TRUE(lr_finder->optimal_lr().has_value());
  const double x = *lr_finder->optimal_lr();
  auto plain = scheduled(x);
  auto plain_rates = std::make_shared<Rates>();
  torch::cuda::manual_seed_all(5);
  volt::Trainer(volt::TrainerOptions(cuda).callbacks({plain_rates})).fit(*plain, data());
  ASSERT_EQ(rates->seen.size(), 32u);
  EXPECT_EQ(rates->seen, plain_rates->seen);
  EXPECT_TRUE(torch::equal(tuned->flat_params(), plain->flat_params()))
      << (tuned->flat_params() - plain->flat_params()).abs().max().item<double>();
}

// A resumed fit takes the rate from its optimizer state and the test's result from the
// checkpoint: no second range test, and the end is the uninterrupted fit's.
TEST(LearningRateFinder, AResumedFitDoesNotSearchAgainAndIsExact) {
  TempDir dir;
  auto whole = scheduled(0.1);
  auto first = std::make_shared<volt::LearningRateFinder>(finder());
  volt::Trainer(quiet(dir.path).max_epochs(2).callbacks(
                    {first, std::make_shared<SaveAt>(0, 9, dir / "mid.ckpt")}))
      .fit(*whole, data());
  auto resumed = scheduled(0.1);
  auto again = std::make_shared<volt::LearningRateFinder>(finder());
  const auto lines = volt_test::capture_logs([&] {
    volt::Trainer(quiet(dir.path).max_epochs(2).callbacks({again}))
        .fit(*resumed, data(), c10::nullopt, dir / "mid.ckpt");
  });
  EXPECT_FALSE(volt_test::has(lines, "[lr_find]"));
  EXPECT_TRUE(volt_test::has(lines, "the range test ran before this checkpoint"));
  EXPECT_EQ(again->optimal_lr(), first->optimal_lr());
  EXPECT_EQ(again->result().losses, first->result().losses);
  EXPECT_TRUE(torch::equal(resumed->flat_params(), whole->flat_params()));
}

// A fit resumed from a checkpoint written without the callback is past its start: the test is
// skipped (warned) and the fit ends as the uninterrupted one without the callback. A damaged
// state is refused.
TEST(LearningRateFinder, AResumeWithoutItsStateSkipsTheTestAndADamagedStateIsRefused) {
  TempDir dir;
  auto whole = scheduled(0.1);
  volt::Trainer(
      quiet(dir.path).max_epochs(2).callbacks({std::make_shared<SaveAt>(0, 9, dir / "plain.ckpt")}))
      .fit(*whole, data());
  auto resumed = scheduled(0.1);
  auto late = std::make_shared<volt::LearningRateFinder>(finder());
  const auto lines = volt_test::capture_logs([&] {
    volt::Trainer(quiet(dir.path).max_epochs(2).callbacks({late}))
        .fit(*resumed, data(), c10::nullopt, dir / "plain.ckpt");
  });
  EXPECT_TRUE(volt_test::has(lines, "[LearningRateFinder] skipped: the fit resumes at step 10"));
  EXPECT_FALSE(volt_test::has(lines, "[lr_find]"));
  EXPECT_FALSE(late->optimal_lr().has_value());
  EXPECT_TRUE(torch::equal(resumed->flat_params(), whole->flat_params()));

  torch::serialize::OutputArchive out;
  out.write("done", c10::IValue(true));
  out.write("mode", c10::IValue(int64_t{0}));
  out.write("lrs", c10::IValue(c10::List<double>({1e-3, 1e-2})));
  out.write("losses", c10::IValue(c10::List<double>({0.5})));
  out.write("optimal_lr", c10::IValue());
  auto in = volt_test::reread(out);
  const std::string e = volt_test::error_of<volt::CheckpointError>([&] { late->load_state(in); });
  EXPECT_TRUE(volt_test::has(e, "[LearningRateFinder] the checkpoint holds 2 rates and 1 losses"))
      << e;
}

// Under strategy "ddp" the trial runs on the fit's process group (a strategy sharing it, with a
// precision of its own): in one process it records the same test as under single_device and the
// fit ends with the same weights; the fit's own DDP buckets still average its gradients after.
// (Two ranks: Ddp.LearningRateFinderTwoRanksEqualOneProcess.)
TEST(LearningRateFinder, AOneProcessDdpFitFindsWhatASingleDeviceFitFinds) {
  VOLT_REQUIRE_GLOO();
  TempDir dir;
  auto single = std::make_shared<volt::LearningRateFinder>(finder());
  auto a = scheduled(0.1);
  volt::Trainer(quiet(dir.path).max_epochs(1).callbacks({single})).fit(*a, data());
  auto ddp = std::make_shared<volt::LearningRateFinder>(finder());
  auto b = scheduled(0.1);
  volt::Trainer t(quiet(dir.path).strategy("ddp").max_epochs(1).callbacks({ddp}));
  t.fit(*b, data());
  ASSERT_TRUE(single->optimal_lr().has_value());
  EXPECT_EQ(ddp->result().lrs, single->result().lrs);
  EXPECT_EQ(ddp->result().losses, single->result().losses);
  EXPECT_EQ(ddp->optimal_lr(), single->optimal_lr());
  EXPECT_TRUE(torch::allclose(b->flat_params(), a->flat_params(), 1e-6, 1e-7));
  // The same Trainer fits again (the trial's strategy is gone, the run's group stays) and ends
  // where the first fit ended (the generator seeded as the Trainer's constructor seeded it).
  auto c = scheduled(0.1);
  torch::manual_seed(123);  // quiet()'s seed
  t.fit(*c, data());
  EXPECT_EQ(ddp->result().losses, single->result().losses);
  EXPECT_TRUE(torch::equal(c->flat_params(), b->flat_params()));
}

TEST(LearningRateFinder, RefusesOtherStrategiesAndBadOptions) {
  TempDir dir;
  auto m = scheduled(0.1);
  if (volt_test::gloo()) {
    // lr_find's own Trainer would launch processes of its own.
    const std::string e = volt_test::error_of<volt::ConfigError>(
        [&] { volt::lr_find(*m, data(), quiet(dir.path).devices(2), finder()); });
    EXPECT_TRUE(volt_test::has(e,
                               "[lr_find] the options make a run with strategy \"ddp\"; "
                               "lr_find runs one process on one device. Over several processes "
                               "add LearningRateFinder to the run's callbacks"))
        << e;
  }
  if (volt_test::gloo()) {  // a one-process DeepSpeed fit on the CPU makes a Gloo group
    const std::string e = volt_test::error_of<volt::ConfigError>([&] {
      volt::Trainer(quiet(dir.path)
                        .strategy("deepspeed_stage_2")
                        .max_epochs(1)
                        .callbacks({std::make_shared<volt::LearningRateFinder>(finder())}))
          .fit(*m, data());
    });
    EXPECT_TRUE(volt_test::has(e, "[LearningRateFinder] the run uses strategy \"deepspeed\"")) << e;
  }
  {
    const std::string e = volt_test::error_of<volt::ConfigError>(
        [] { volt::LearningRateFinder f(LrFinderOptions().num_training(1)); });
    EXPECT_TRUE(volt_test::has(e, "[lr_find] num_training=1 must be at least 2")) << e;
  }
}

// BatchSizeFinder in fit: 10 MiB over what lives before a trial hold 32 samples' scratch of
// Hungry (8 MiB) but not 64; the fit then runs on loaders of 32 and is the fit of a DataModule
// built at 32.
TEST(BatchSizeFinder, TheFitRunsAtTheSizeFoundAndAResumeKeepsIt) {
  TempDir dir;
  const auto search = BatchSizeFinderOptions().max_memory_bytes(10 * kMiB);
  torch::manual_seed(5);
  volt_test::Hungry tuned;
  volt_test::SizedData data(512, 7);
  auto bs_finder = std::make_shared<volt::BatchSizeFinder>(search);
  const auto lines = volt_test::capture_logs([&] {
    volt::Trainer(quiet(dir.path).max_epochs(2).callbacks(
                      {bs_finder, std::make_shared<SaveAt>(0, 5, dir / "mid.ckpt")}))
        .fit(tuned, data);
  });
  EXPECT_EQ(bs_finder->optimal_batch_size(), c10::optional<int64_t>(32));
  EXPECT_EQ(data.batch_size(), c10::optional<int64_t>(32));
  EXPECT_TRUE(volt_test::has(lines, "batch: 32 samples per process per optimizer step"));
  // The last 32 steps (2 epochs of 512 / 32) ran at 32; the trials before them at 2..64.
  ASSERT_GE(tuned.sizes.size(), 32u);
  EXPECT_EQ(std::vector<int64_t>(tuned.sizes.end() - 32, tuned.sizes.end()),
            std::vector<int64_t>(32, 32));
  torch::manual_seed(5);
  volt_test::Hungry plain;
  volt_test::SizedData plain_data(512, 32);
  volt::Trainer(quiet(dir.path).max_epochs(2)).fit(plain, plain_data);
  EXPECT_TRUE(torch::equal(tuned.flat_params(), plain.flat_params()));

  // Resumed from inside the first epoch, with a budget that would now find 8: the checkpoint's
  // size, no search, and the uninterrupted end.
  torch::manual_seed(5);
  volt_test::Hungry resumed;
  volt_test::SizedData resumed_data(512, 7);
  auto again =
      std::make_shared<volt::BatchSizeFinder>(BatchSizeFinderOptions().max_memory_bytes(3 * kMiB));
  const auto resumed_lines = volt_test::capture_logs([&] {
    volt::Trainer(quiet(dir.path).max_epochs(2).callbacks({again}))
        .fit(resumed, resumed_data, dir / "mid.ckpt");
  });
  EXPECT_FALSE(volt_test::has(resumed_lines, "[scale_batch_size]"));
  EXPECT_TRUE(volt_test::has(resumed_lines, "batch size 32 from the checkpoint"));
  EXPECT_EQ(resumed_data.batch_size(), c10::optional<int64_t>(32));
  EXPECT_TRUE(torch::equal(resumed.flat_params(), tuned.flat_params()));
}

TEST(BatchSizeFinder, AResumeWithoutItsStateKeepsTheSizeAndADamagedStateIsRefused) {
  TempDir dir;
  torch::manual_seed(5);
  volt_test::Hungry whole;
  volt_test::SizedData data(256, 16);
  volt::Trainer(
      quiet(dir.path).max_epochs(2).callbacks({std::make_shared<SaveAt>(0, 5, dir / "plain.ckpt")}))
      .fit(whole, data);
  torch::manual_seed(5);
  volt_test::Hungry resumed;
  volt_test::SizedData resumed_data(256, 16);
  auto late =
      std::make_shared<volt::BatchSizeFinder>(BatchSizeFinderOptions().max_memory_bytes(10 * kMiB));
  const auto lines = volt_test::capture_logs([&] {
    volt::Trainer(quiet(dir.path).max_epochs(2).callbacks({late}))
        .fit(resumed, resumed_data, dir / "plain.ckpt");
  });
  EXPECT_TRUE(volt_test::has(lines, "[BatchSizeFinder] skipped: the fit resumes at step 6"));
  EXPECT_FALSE(volt_test::has(lines, "[scale_batch_size]"));
  EXPECT_EQ(resumed_data.batch_size(), c10::optional<int64_t>(16));
  EXPECT_TRUE(torch::equal(resumed.flat_params(), whole.flat_params()));

  torch::serialize::OutputArchive out;
  out.write("fit_batch_size", c10::IValue(int64_t{0}));
  auto in = volt_test::reread(out);
  const std::string e = volt_test::error_of<volt::CheckpointError>([&] { late->load_state(in); });
  EXPECT_TRUE(volt_test::has(e, "[BatchSizeFinder] the checkpoint's batch size is not a positive"))
      << e;
}

TEST(BatchSizeFinder, ValidateRunsAtTheSizeFoundForItsLoader) {
  TempDir dir;
  volt_test::Hungry model;
  volt_test::SizedData data(256, 7);
  auto bs_finder = std::make_shared<volt::BatchSizeFinder>(
      BatchSizeFinderOptions().max_memory_bytes(10 * kMiB).steps_per_trial(1));
  const volt::Metrics m =
      volt::Trainer(quiet(dir.path).callbacks({bs_finder})).validate(model, data);
  EXPECT_EQ(bs_finder->optimal_batch_size(), c10::optional<int64_t>(32));
  // The validation pass itself: 256 / 32 batches of 32 after the trials.
  EXPECT_EQ(std::vector<int64_t>(model.sizes.end() - 8, model.sizes.end()),
            std::vector<int64_t>(8, 32));
  EXPECT_EQ(model.sizes.size() - 8, bs_finder->result().trials.size());
  EXPECT_TRUE(m.count("val_loss"));
}

TEST(BatchSizeFinder, RefusesLoadersPassedDirectlyAndAnUnsizedDataModule) {
  TempDir dir;
  TinyClassifier m;
  auto bs_finder = std::make_shared<volt::BatchSizeFinder>();
  {
    const std::string e = volt_test::error_of<volt::ConfigError>([&] {
      volt::Trainer(quiet(dir.path).max_epochs(1).callbacks({bs_finder})).fit(m, data());
    });
    EXPECT_TRUE(volt_test::has(e, "[BatchSizeFinder] the fit entry point was given loaders")) << e;
  }
  struct Unsized : volt::DataModule {
    volt::DataLoader train_dataloader() override { return data(); }
  } unsized;
  {
    const std::string e = volt_test::error_of<volt::ConfigError>([&] {
      volt::Trainer(quiet(dir.path).max_epochs(1).callbacks({bs_finder})).fit(m, unsized);
    });
    EXPECT_TRUE(volt_test::has(e, "[BatchSizeFinder] the DataModule does not say its batch size"))
        << e;
  }
  if (volt_test::gloo()) {  // as Lightning's, the search refuses DDP (here a one-process group)
    const std::string e = volt_test::error_of<volt::ConfigError>([&] {
      volt::Trainer(quiet(dir.path).strategy("ddp").max_epochs(1).callbacks({bs_finder}))
          .fit(m, data());
    });
    EXPECT_TRUE(volt_test::has(e,
                               "[BatchSizeFinder] the run uses strategy \"ddp\" (1 process); "
                               "the search runs its trials in Trainers of its own and supports "
                               "strategy single_device (one process on one device"))
        << e;
  }
  {
    const std::string e = volt_test::error_of<volt::ConfigError>(
        [] { volt::BatchSizeFinder f(BatchSizeFinderOptions().margin(1.5)); });
    EXPECT_TRUE(volt_test::has(e, "[scale_batch_size] margin=1.5 must be in [0, 1)")) << e;
  }
}

}  // namespace
