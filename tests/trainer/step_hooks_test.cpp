// The overridable steps of automatic optimization (Module::backward, optimizer_step,
// optimizer_zero_grad, configure_gradient_clipping, lr_scheduler_step) and Module::clip_gradients,
// each checked against a run that gets the same numbers another way (a scheduler, a Trainer
// option, manual optimization, a scaled learning rate) on the same data, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "core/detail/default_steps.h"
#include "error_text.h"
#include "log_capture.h"
#include "lr_at_end.h"
#include "requires.h"
#include "tiny.h"

namespace {

using volt_test::error_of;
using volt_test::LrAtEnd;
using volt_test::quiet;
using volt_test::TempDir;
using volt_test::TinyClassifier;

// 8 batches of 16 per epoch, unshuffled.
volt::DataLoader data() {
  return volt_test::loader(volt_test::blobs(128), 16, /*shuffle=*/false);
}

// The same weights for every module of one architecture: the runs compared start alike.
void reset(volt::Module& m) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(42);
  for (auto& p : m.parameters()) p.uniform_(-0.3, 0.3, gen);
}

struct Fitted {
  int64_t global_step = 0;
  double lr = -1;  // at the end
};

// Fits `m` with `o` from reset() weights.
Fitted fit(volt::Module& m, volt::TrainerOptions o) {
  reset(m);
  auto lr = std::make_shared<LrAtEnd>();
  auto callbacks = o.callbacks();
  callbacks.push_back(lr);
  volt::Trainer trainer(o.callbacks(callbacks));
  trainer.fit(m, data());
  return {trainer.state().global_step, lr->lr};
}

// Lightning's documented warm-up: the learning rate set in optimizer_step before the step.
class WarmUp : public TinyClassifier {
 public:
  void optimizer_step(int64_t, int64_t, torch::optim::Optimizer& opt,
                      const std::function<bool()>& step) override {
    const double factor = std::min(1.0, static_cast<double>(global_step() + 1) / 5.0);
    for (auto& g : opt.param_groups()) g.options().set_lr(0.1 * factor);
    EXPECT_TRUE(step());
  }
};

// The same schedule as a LambdaLR stepped after every optimizer step.
class LambdaWarmUp : public TinyClassifier {
 public:
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::SGD>(parameters(),
                                                   torch::optim::SGDOptions(0.1).momentum(0.9));
    auto warm = std::make_shared<volt::LambdaLR>(
        *opt, [](int64_t k) { return std::min(1.0, static_cast<double>(k + 1) / 5.0); });
    return {volt::OptimizerConfig(opt).scheduler(warm).interval(volt::Interval::kStep)};
  }
};

TEST(StepHooks, AWarmUpInOptimizerStepEqualsTheSameScheduleAsALambdaLR) {
  TempDir dir;
  WarmUp warm;
  LambdaWarmUp lambda;
  EXPECT_EQ(fit(warm, quiet(dir.path).max_epochs(2)).global_step, 16);
  EXPECT_EQ(fit(lambda, quiet(dir.path).max_epochs(2)).global_step, 16);
  EXPECT_TRUE(torch::equal(warm.flat_params(), lambda.flat_params()));
  // Not a run that trained nothing: the weights moved from where they started.
  TinyClassifier start;
  reset(start);
  EXPECT_FALSE(torch::equal(warm.flat_params(), start.flat_params()));
}

// Steps on even batches only; the odd ones' gradients are zeroed without a step.
class EveryOther : public TinyClassifier {
 public:
  EveryOther() {
    scheduler_step_size = 1;
    scheduler_interval = volt::Interval::kStep;
  }
  void optimizer_step(int64_t, int64_t i, torch::optim::Optimizer&,
                      const std::function<bool()>& step) override {
    if (i % 2 == 0) step();
  }
  void on_before_zero_grad(torch::optim::Optimizer&) override { ++zero_grads; }
  int zero_grads = 0;
};

// The same with manual optimization.
class ManualEveryOther : public TinyClassifier {
 public:
  ManualEveryOther() {
    set_automatic_optimization(false);
    scheduler_step_size = 1;
    scheduler_interval = volt::Interval::kStep;
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    auto opt = optimizers().front();
    manual_backward(torch::cross_entropy_loss(forward(b.input), b.target));
    if (i % 2 == 0) opt.step();
    opt.zero_grad();
    return {};
  }
};

TEST(StepHooks, AnOptimizerStepThatSkipsTakesNoStepAndCountsNone) {
  TempDir dir;
  EveryOther skipping;
  ManualEveryOther manual;
  const Fitted skipped = fit(skipping, quiet(dir.path).max_epochs(2));
  EXPECT_EQ(skipped.global_step, 8);
  EXPECT_EQ(fit(manual, quiet(dir.path).max_epochs(2)).global_step, 8);
  EXPECT_EQ(skipping.zero_grads, 16);  // every batch's gradients went, stepped or not
  EXPECT_TRUE(torch::equal(skipping.flat_params(), manual.flat_params()));
  // The step-interval StepLR(1, 0.5) advanced once per step taken.
  EXPECT_DOUBLE_EQ(skipped.lr, 0.1 * std::pow(0.5, 8));
}

TEST(StepHooks, CallingStepTwiceIsAValueError) {
  class Twice : public TinyClassifier {
   public:
    void optimizer_step(int64_t, int64_t, torch::optim::Optimizer&,
                        const std::function<bool()>& step) override {
      step();
      step();
    }
  };
  TempDir dir;
  Twice m;
  const std::string what =
      error_of<volt::ValueError>([&] { fit(m, quiet(dir.path).max_epochs(1)); });
  EXPECT_NE(what.find("called step() twice at global step 0"), std::string::npos) << what;
}

// Clips in configure_gradient_clipping what the Trainer's option would clip.
class ClipsItself : public TinyClassifier {
 public:
  void configure_gradient_clipping(torch::optim::Optimizer& opt, c10::optional<double> value,
                                   volt::ClipAlgorithm) override {
    seen_values.push_back(value);
    const at::Tensor norm = clip_gradients(opt, 0.05, volt::ClipAlgorithm::kNorm);
    EXPECT_TRUE(norm.defined() && norm.item<double>() > 0.05);  // it had something to clip
  }
  std::vector<c10::optional<double>> seen_values;
};

TEST(StepHooks, ClipGradientsInTheHookEqualsTheTrainersGradientClipVal) {
  TempDir dir;
  ClipsItself own;
  TinyClassifier by_option;
  TinyClassifier unclipped;
  fit(own, quiet(dir.path).max_epochs(1));
  fit(by_option, quiet(dir.path).max_epochs(1).gradient_clip_val(0.05));
  fit(unclipped, quiet(dir.path).max_epochs(1));
  EXPECT_TRUE(torch::equal(own.flat_params(), by_option.flat_params()));
  EXPECT_FALSE(torch::equal(own.flat_params(), unclipped.flat_params()));
  ASSERT_EQ(own.seen_values.size(), 8u);
  EXPECT_FALSE(own.seen_values.front().has_value());  // the Trainer has no clip value
}

// Clips fc1 only, in the hook (automatic) or in training_step (manual).
void clip_fc1(TinyClassifier& m) {
  torch::nn::utils::clip_grad_norm_(m.fc1->parameters(), 0.05);
}

class ClipsFc1 : public TinyClassifier {
 public:
  void configure_gradient_clipping(torch::optim::Optimizer&, c10::optional<double>,
                                   volt::ClipAlgorithm) override {
    clip_fc1(*this);
  }
};

class ManualClipsFc1 : public TinyClassifier {
 public:
  ManualClipsFc1() { set_automatic_optimization(false); }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto opt = optimizers().front();
    manual_backward(torch::cross_entropy_loss(forward(b.input), b.target));
    clip_fc1(*this);
    opt.step();
    opt.zero_grad();
    return {};
  }
};

TEST(StepHooks, AConfigureGradientClippingOverrideClipsBetweenBackwardAndStep) {
  TempDir dir;
  ClipsFc1 hooked;
  ManualClipsFc1 manual;
  TinyClassifier unclipped;
  fit(hooked, quiet(dir.path).max_epochs(1));
  fit(manual, quiet(dir.path).max_epochs(1));
  fit(unclipped, quiet(dir.path).max_epochs(1));
  EXPECT_TRUE(torch::equal(hooked.flat_params(), manual.flat_params()));
  EXPECT_FALSE(torch::equal(hooked.flat_params(), unclipped.flat_params()));
}

// Under loss scaling the hook sees true-scale gradients: their norm is the backward's / scale.
class NormWatcher : public TinyClassifier {
 public:
  void on_after_backward() override { after_backward.push_back(grad_norm()); }
  void configure_gradient_clipping(torch::optim::Optimizer& opt, c10::optional<double> v,
                                   volt::ClipAlgorithm a) override {
    at_clipping.push_back(grad_norm());
    TinyClassifier::configure_gradient_clipping(opt, v, a);
  }
  double grad_norm() {
    double sq = 0;
    for (auto& p : parameters()) sq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
    return std::sqrt(sq);
  }
  std::vector<double> after_backward, at_clipping;
};

TEST(StepHooks, ConfigureGradientClippingSeesUnscaledGradients) {
  TempDir dir;
  NormWatcher m;
  auto precision = std::make_shared<volt::MixedPrecision>(
      volt::MixedPrecisionOptions().loss_scaling(true).scaler(
          volt::GradScalerOptions().init_scale(1024.0)));
  fit(m, quiet(dir.path).max_epochs(1).precision(precision));
  ASSERT_EQ(m.after_backward.size(), 8u);
  ASSERT_EQ(m.at_clipping.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_NEAR(m.after_backward[i] / m.at_clipping[i], 1024.0, 1e-6 * 1024) << "step " << i;
  }
}

TEST(StepHooks, ClipGradientsRefusesAValueOrAlgorithmTheTrainerContradicts) {
  class Clips : public TinyClassifier {
   public:
    Clips(c10::optional<double> value, c10::optional<volt::ClipAlgorithm> algorithm)
        : value_(value), algorithm_(algorithm) {}
    void configure_gradient_clipping(torch::optim::Optimizer& opt, c10::optional<double>,
                                     volt::ClipAlgorithm) override {
      clip_gradients(opt, value_, algorithm_);
    }

   private:
    c10::optional<double> value_;
    c10::optional<volt::ClipAlgorithm> algorithm_;
  };
  TempDir dir;
  {
    Clips m(1.0, c10::nullopt);
    const std::string what = error_of<volt::ConfigError>(
        [&] { fit(m, quiet(dir.path).max_epochs(1).gradient_clip_val(0.5)); });
    EXPECT_NE(what.find("clip_gradients(gradient_clip_val=1) while the Trainer has "
                        "gradient_clip_val=0.5; set only one of them"),
              std::string::npos)
        << what;
  }
  {
    Clips m(c10::nullopt, volt::ClipAlgorithm::kValue);
    const std::string what = error_of<volt::ConfigError>(
        [&] { fit(m, quiet(dir.path).max_epochs(1).gradient_clip_val(0.5)); });
    EXPECT_NE(what.find("gradient_clip_algorithm=value) while the Trainer clips with "
                        "gradient_clip_algorithm=norm"),
              std::string::npos)
        << what;
  }
  {
    Clips m(std::nan(""), c10::nullopt);
    const std::string what =
        error_of<volt::ValueError>([&] { fit(m, quiet(dir.path).max_epochs(1)); });
    EXPECT_NE(what.find("is not a finite number"), std::string::npos) << what;
  }
  {
    // The Trainer's own value, passed again, is not a conflict.
    Clips m(0.5, volt::ClipAlgorithm::kNorm);
    EXPECT_EQ(fit(m, quiet(dir.path).max_epochs(1).gradient_clip_val(0.5)).global_step, 8);
  }
}

// Manual optimization clips with clip_gradients between manual_backward and step(); with loss
// scaling it unscales first, so it equals automatic optimization's gradient_clip_val.
class ManualClip : public TinyClassifier {
 public:
  ManualClip() { set_automatic_optimization(false); }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto opt = optimizers().front();
    manual_backward(torch::cross_entropy_loss(forward(b.input), b.target));
    clip_gradients(opt.optimizer(), 0.05);
    opt.step();
    opt.zero_grad();
    return {};
  }
};

TEST(StepHooks, ManualOptimizationClipsWithClipGradientsAsTheTrainerWould) {
  TempDir dir;
  const auto scaled = [] {
    return std::make_shared<volt::MixedPrecision>(
        volt::MixedPrecisionOptions().loss_scaling(true).linear_min_macs(0).scaler(
            volt::GradScalerOptions().init_scale(1024.0)));
  };
  for (bool scaling : {false, true}) {
    ManualClip manual;
    TinyClassifier automatic;
    volt::TrainerOptions o = quiet(dir.path).max_epochs(1);
    if (scaling) o.precision(scaled());
    fit(manual, o);
    if (scaling) o.precision(scaled());
    fit(automatic, o.gradient_clip_val(0.05));
    EXPECT_TRUE(torch::equal(manual.flat_params(), automatic.flat_params()))
        << "loss scaling " << scaling;
  }
}

TEST(StepHooks, ManualBackwardRunsOutOfAutocastAsAutomaticOptimizationsBackward) {
  // manual_backward runs inside training_step, under the forward's autocast. With every linear
  // kept in fp32 by the size rule (which covers linear, addmm and matmul, not the backward's mm),
  // a backward under autocast would differentiate them in bf16; out of it, manual optimization
  // equals automatic optimization bit for bit, whatever this CPU's bf16 probe measured.
  TempDir dir;
  const auto fp32_linears = [] {
    return std::make_shared<volt::MixedPrecision>(
        volt::MixedPrecisionOptions()
            .linear_min_macs(std::numeric_limits<int64_t>::max())
            .loss_scaling(true)
            .scaler(volt::GradScalerOptions().init_scale(1024.0)));
  };
  ManualClip manual;
  TinyClassifier automatic;
  fit(manual, quiet(dir.path).max_epochs(1).precision(fp32_linears()));
  fit(automatic, quiet(dir.path).max_epochs(1).precision(fp32_linears()).gradient_clip_val(0.05));
  EXPECT_TRUE(torch::equal(manual.flat_params(), automatic.flat_params()));
}

TEST(StepHooks, UnderZeroTheHooksClipGradientsIsTheStrategysShardedClip) {
  VOLT_REQUIRE_GLOO();  // a one-process DeepSpeed fit on the CPU makes a Gloo group
  // Automatic: ClipsItself's clip_gradients(0.05) equals gradient_clip_val 0.05 under ZeRO-2
  // (the norm over the engine's shards). Manual: refused, the engine unscales inside its step.
  TempDir dir;
  ClipsItself own;
  TinyClassifier by_option;
  fit(own, quiet(dir.path).max_epochs(1).strategy("deepspeed_stage_2"));
  fit(by_option,
      quiet(dir.path).max_epochs(1).strategy("deepspeed_stage_2").gradient_clip_val(0.05));
  EXPECT_TRUE(torch::equal(own.flat_params(), by_option.flat_params()));
  ManualClip manual;
  const std::string what = error_of<volt::NotAvailable>(
      [&] { fit(manual, quiet(dir.path).max_epochs(1).strategy("deepspeed_stage_2")); });
  EXPECT_NE(what.find("clip_gradients under manual optimization with the deepspeed strategy"),
            std::string::npos)
      << what;
}

// Doubling the loss in backward doubles every gradient exactly: SGD then moves as with twice the
// learning rate, bit for bit.
class DoubledBackward : public TinyClassifier {
 public:
  void backward(const at::Tensor& loss) override {
    ++calls;
    (loss * 2).backward();
  }
  int calls = 0;
};

TEST(StepHooks, ABackwardOverrideBackpropagatesTheStepsLoss) {
  TempDir dir;
  DoubledBackward doubled;
  TinyClassifier twice_the_lr(8, 0.2);
  fit(doubled, quiet(dir.path).max_epochs(1));
  fit(twice_the_lr, quiet(dir.path).max_epochs(1));
  EXPECT_EQ(doubled.calls, 8);
  EXPECT_TRUE(torch::equal(doubled.flat_params(), twice_the_lr.flat_params()));
}

TEST(StepHooks, ManualBackwardRunsTheBackwardOverride) {
  class Manual : public DoubledBackward {
   public:
    Manual() { set_automatic_optimization(false); }
    torch::Tensor training_step(const volt::Batch& b, int64_t) override {
      auto opt = optimizers().front();
      manual_backward(torch::cross_entropy_loss(forward(b.input), b.target));
      opt.step();
      opt.zero_grad();
      return {};
    }
  };
  TempDir dir;
  Manual manual;
  TinyClassifier twice_the_lr(8, 0.2);
  fit(manual, quiet(dir.path).max_epochs(1));
  fit(twice_the_lr, quiet(dir.path).max_epochs(1));
  EXPECT_EQ(manual.calls, 8);
  EXPECT_TRUE(torch::equal(manual.flat_params(), twice_the_lr.flat_params()));
}

TEST(StepHooks, LrSchedulerStepDecidesWhetherAndHowTheSchedulerSteps) {
  class Frozen : public TinyClassifier {
   public:
    Frozen() { scheduler_step_size = 1; }  // StepLR(1, 0.5) at each epoch's end
    void lr_scheduler_step(volt::LRScheduler&, c10::optional<double> metric) override {
      ++calls;
      had_metric = had_metric || metric.has_value();
    }
    int calls = 0;
    bool had_metric = false;
  };
  TempDir dir;
  Frozen frozen;
  TinyClassifier stepping;
  stepping.scheduler_step_size = 1;
  EXPECT_DOUBLE_EQ(fit(frozen, quiet(dir.path).max_epochs(3)).lr, 0.1);
  EXPECT_DOUBLE_EQ(fit(stepping, quiet(dir.path).max_epochs(3)).lr, 0.1 * std::pow(0.5, 3));
  EXPECT_EQ(frozen.calls, 3);
  EXPECT_FALSE(frozen.had_metric);
}

// Lightning tells a scheduler that steps on a metric by its type (ReduceLROnPlateau), not by a
// monitor being named: a StepLR configured with .monitor("val_loss") (as Lightning configs often
// have) steps at each epoch's end without the metric, also in an epoch without validation, where
// volt stopped with a ConfigError for the missing val_loss.
TEST(StepHooks, AMonitorNamedForAnotherSchedulerIsIgnored) {
  class Named : public TinyClassifier {
   public:
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      auto c = TinyClassifier::configure_optimizers();
      c.front().scheduler(std::make_shared<volt::StepLR>(*c.front().optimizer(), 1, 0.5));
      c.front().monitor("val_loss");
      return c;
    }
    void lr_scheduler_step(volt::LRScheduler& s, c10::optional<double> metric) override {
      had_metric = had_metric || metric.has_value();
      TinyClassifier::lr_scheduler_step(s, metric);
    }
    bool had_metric = false;
  };
  TempDir dir;
  Named m;
  volt::Trainer t(quiet(dir.path).max_epochs(2).check_val_every_n_epoch(2));
  reset(m);
  auto lr = std::make_shared<LrAtEnd>();
  volt::Trainer with_lr(quiet(dir.path).max_epochs(2).check_val_every_n_epoch(2).callbacks({lr}));
  with_lr.fit(m, data(), volt_test::loader(volt_test::blobs(32)));
  EXPECT_DOUBLE_EQ(lr->lr, 0.1 * 0.25);
  EXPECT_FALSE(m.had_metric);
}

// ReduceLROnPlateau without a monitor is refused before anything trains (Lightning raises in
// configure_optimizers; volt raised at the first due step, after an epoch of training). A monitor
// not logged when the scheduler is due: strict (the default) stops naming what was logged;
// strict(false) warns and skips that step, as Lightning.
TEST(StepHooks, APlateauSchedulerNeedsAMonitorAndStrictDecidesAboutAMissingOne) {
  class Plateau : public TinyClassifier {
   public:
    Plateau(std::string monitor, bool strict) : monitor_(std::move(monitor)), strict_(strict) {}
    torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
      ++steps;
      return TinyClassifier::training_step(b, i);
    }
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      auto opt = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
      return {volt::OptimizerConfig(opt)
                  .scheduler(std::make_shared<volt::ReduceLROnPlateau>(*opt))
                  .monitor(monitor_)
                  .strict(strict_)};
    }
    void lr_scheduler_step(volt::LRScheduler& s, c10::optional<double> metric) override {
      ++scheduler_steps;
      TinyClassifier::lr_scheduler_step(s, metric);
    }
    int steps = 0, scheduler_steps = 0;

   private:
    std::string monitor_;
    bool strict_;
  };
  TempDir dir;
  Plateau none("", true);
  const std::string e = error_of<volt::ConfigError>(
      [&] { volt::Trainer(quiet(dir.path).max_epochs(1)).fit(none, data()); });
  EXPECT_NE(e.find("ReduceLROnPlateau scheduler without a monitor"), std::string::npos) << e;
  EXPECT_EQ(none.steps, 0);
  Plateau strict("val_los", true);
  const std::string m = error_of<volt::ConfigError>(
      [&] { volt::Trainer(quiet(dir.path).max_epochs(1)).fit(strict, data()); });
  EXPECT_NE(m.find("monitors \"val_los\", which was not logged"), std::string::npos) << m;
  EXPECT_NE(m.find("train_loss"), std::string::npos) << m;  // what was logged
  Plateau lenient("val_los", false);
  const auto lines = volt_test::capture_logs(
      [&] { volt::Trainer(quiet(dir.path).max_epochs(2)).fit(lenient, data()); });
  EXPECT_EQ(lenient.steps, 16);
  EXPECT_EQ(lenient.scheduler_steps, 0);
  EXPECT_TRUE(volt_test::has(lines, "this step of the scheduler is skipped")) << lines.size();
}

TEST(StepHooks, LrSchedulerStepGetsTheMonitoredValue) {
  class Plateau : public TinyClassifier {
   public:
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      auto opt = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
      auto plateau = std::make_shared<volt::ReduceLROnPlateau>(*opt);
      return {volt::OptimizerConfig(opt).scheduler(plateau).monitor("train_loss")};
    }
    void lr_scheduler_step(volt::LRScheduler& s, c10::optional<double> metric) override {
      ASSERT_TRUE(metric.has_value());
      metrics.push_back(*metric);
      expected.push_back(run()->callback_metrics().at("train_loss"));
      TinyClassifier::lr_scheduler_step(s, metric);
      best = dynamic_cast<volt::ReduceLROnPlateau&>(s).best();
    }
    std::vector<double> metrics, expected;
    double best = 0;
  };
  TempDir dir;
  Plateau m;
  fit(m, quiet(dir.path).max_epochs(2));
  ASSERT_EQ(m.metrics.size(), 2u);
  EXPECT_EQ(m.metrics, m.expected);
  EXPECT_DOUBLE_EQ(m.best, std::min(m.metrics[0], m.metrics[1]));  // the default stepped it
}

// A scheduler that monitors a metric steps when its value exists and is current (Lightning's
// update_plateau_schedulers): per step after that step's validation (before, the first due step
// came before the first validation: a ConfigError; later ones read the validation before), per
// epoch after the epoch's metrics are reduced (before, a metric the training logs per epoch was
// missing at the first epoch's end).
TEST(StepHooks, AMonitoringSchedulerStepsOnTheValueOfItsOwnStepOrEpoch) {
  class Plateau : public TinyClassifier {
   public:
    Plateau(std::string monitor, volt::Interval interval, int64_t frequency)
        : monitor_(std::move(monitor)), interval_(interval), frequency_(frequency) {}
    torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
      auto loss = TinyClassifier::training_step(b, i);
      log("epoch_loss", loss, volt::LogOptions().on_step(false).on_epoch(true));
      return loss;
    }
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      auto opt = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1));
      auto plateau = std::make_shared<volt::ReduceLROnPlateau>(*opt);
      return {volt::OptimizerConfig(opt)
                  .scheduler(plateau)
                  .monitor(monitor_)
                  .interval(interval_)
                  .frequency(frequency_)};
    }
    void lr_scheduler_step(volt::LRScheduler& s, c10::optional<double> metric) override {
      ASSERT_TRUE(metric.has_value());
      metrics.push_back(*metric);
      steps.push_back(global_step());
      TinyClassifier::lr_scheduler_step(s, metric);
    }
    void on_validation_end() override {
      validated.push_back(run()->callback_metrics().at("val_loss"));
    }
    std::vector<double> metrics, validated;
    std::vector<int64_t> steps;

   private:
    std::string monitor_;
    volt::Interval interval_;
    int64_t frequency_;
  };
  TempDir dir;
  // Validation every 4 of the 8 batches, the scheduler every 4 steps: each reads its own.
  Plateau per_step("val_loss", volt::Interval::kStep, 4);
  volt::Trainer t(quiet(dir.path).max_epochs(2).val_check_interval(int64_t{4}));
  reset(per_step);
  t.fit(per_step, data(), volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(per_step.steps, (std::vector<int64_t>{4, 8, 12, 16}));
  EXPECT_EQ(per_step.metrics, per_step.validated);
  // A checkpoint written at step 4's batch end (before its validation, which the resume runs
  // first) owes the scheduler that step: the resumed fit takes it as the uninterrupted one did.
  Plateau saving("val_loss", volt::Interval::kStep, 4);
  auto every4 = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "c").every_n_train_steps(4).save_top_k(-1));
  volt::Trainer first(
      quiet(dir.path).max_steps(4).val_check_interval(int64_t{4}).callbacks({every4}));
  reset(saving);
  first.fit(saving, data(), volt_test::loader(volt_test::blobs(32)));
  Plateau resumed("val_loss", volt::Interval::kStep, 4);
  volt::Trainer again(quiet(dir.path).max_epochs(2).val_check_interval(int64_t{4}));
  again.fit(resumed, data(), volt_test::loader(volt_test::blobs(32)),
            dir / "c/epoch=0-step=4.ckpt");
  EXPECT_EQ(resumed.steps, (std::vector<int64_t>{4, 8, 12, 16}));
  EXPECT_EQ(resumed.metrics, per_step.metrics);
  // Per epoch, on the epoch's mean of a value the training logs.
  class EpochEnd : public volt::Callback {
   public:
    std::string state_key() const override { return "EpochEnd"; }
    void on_train_epoch_end(volt::RunContext& run, volt::Module&) override {
      values.push_back(run.callback_metrics().at("epoch_loss"));
    }
    std::vector<double> values;
  };
  auto seen = std::make_shared<EpochEnd>();
  Plateau per_epoch("epoch_loss", volt::Interval::kEpoch, 1);
  volt::Trainer t2(quiet(dir.path).max_epochs(2).callbacks({seen}));
  t2.fit(per_epoch, data());
  EXPECT_EQ(per_epoch.metrics, seen->values);
  EXPECT_EQ(per_epoch.metrics.size(), 2u);
}

TEST(StepHooks, OptimizerZeroGradDecidesHowGradientsAreCleared) {
  class InPlace : public TinyClassifier {
   public:
    void optimizer_zero_grad(int64_t, int64_t, torch::optim::Optimizer& opt) override {
      ++calls;
      for (auto& g : opt.param_groups()) {
        for (auto& p : g.params()) {
          if (p.grad().defined()) p.mutable_grad().zero_();
        }
      }
    }
    int calls = 0;
  };
  TempDir dir;
  InPlace in_place;
  TinyClassifier by_default;
  fit(in_place, quiet(dir.path).max_epochs(1));
  fit(by_default, quiet(dir.path).max_epochs(1));
  EXPECT_EQ(in_place.calls, 8);
  // Zeroed in place: the same training, the gradients kept as zeros instead of set to none.
  EXPECT_TRUE(torch::equal(in_place.flat_params(), by_default.flat_params()));
  ASSERT_TRUE(in_place.fc1->weight.grad().defined());
  EXPECT_EQ(in_place.fc1->weight.grad().abs().sum().item<float>(), 0.0f);
  EXPECT_FALSE(by_default.fc1->weight.grad().defined());
}

// Which defaults ran in each training step: what a graphed step checks before it replays one.
class DefaultsSeen : public volt::Callback {
 public:
  std::string state_key() const override { return "DefaultsSeen"; }
  void on_train_batch_start(volt::RunContext&, volt::Module& m, const volt::Batch&,
                            int64_t) override {
    volt::detail::DefaultSteps::clear(m);
  }
  void on_train_batch_end(volt::RunContext&, volt::Module& m, const volt::Batch&,
                          int64_t) override {
    overridden.insert(volt::detail::DefaultSteps::overridden(m));
  }
  std::set<std::string> overridden;
};

TEST(StepHooks, TheTrainerTellsAnOverriddenStepFromItsDefault) {
  const auto overridden_in = [](volt::Module& m) {
    TempDir dir;
    auto seen = std::make_shared<DefaultsSeen>();
    fit(m, quiet(dir.path).max_epochs(1).callbacks({seen}));
    return seen->overridden;
  };
  TinyClassifier plain;
  WarmUp warm;
  DoubledBackward doubled;
  ClipsFc1 clips;
  EXPECT_EQ(overridden_in(plain), std::set<std::string>{""});
  EXPECT_EQ(overridden_in(warm), std::set<std::string>{"optimizer_step"});
  EXPECT_EQ(overridden_in(doubled), std::set<std::string>{"backward"});
  EXPECT_EQ(overridden_in(clips), std::set<std::string>{"configure_gradient_clipping"});
}

}  // namespace
