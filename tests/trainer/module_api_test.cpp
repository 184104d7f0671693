// Lightning's LightningModule conveniences: estimated_stepping_batches, log_dict, all_gather,
// toggle_optimizer / untoggle_optimizer, freeze / unfreeze. (all_gather over two real
// processes: tests/strategies/ddp_test.cpp and the collectives of tests/support/dist_worker.cpp.)
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "error_text.h"
#include "log_capture.h"
#include "save_at.h"
#include "tiny.h"
#include "volt/nn/parameters.h"

namespace {

using volt_test::error_of;
using volt_test::quiet;
using volt_test::TinyClassifier;

// Records estimated_stepping_batches() where a schedule would ask for it, and at each epoch.
class Estimating : public TinyClassifier {
 public:
  using TinyClassifier::TinyClassifier;
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    estimates.push_back(estimated_stepping_batches());
    return TinyClassifier::configure_optimizers();
  }
  void on_train_epoch_start() override { estimates.push_back(estimated_stepping_batches()); }
  std::vector<int64_t> estimates;
};

TEST(ModuleApi, EstimatedSteppingBatchesIsTheStepsTheFitTakes) {
  struct Case {
    const char* what;
    volt::TrainerOptions options;
    int64_t expected;
  };
  volt_test::TempDir dir;
  // 100 rows at batch 16: 7 batches an epoch, the last of 4 rows.
  const std::vector<Case> cases = {
      {"accumulating 3 over 7 batches, 2 epochs",
       quiet(dir.path).max_epochs(2).accumulate_grad_batches(3), 6},
      {"5 batches a epoch, accumulating 2, 3 epochs",
       quiet(dir.path).max_epochs(3).limit_train_batches(5).accumulate_grad_batches(2), 9},
      {"half of the batches, 2 epochs", quiet(dir.path).max_epochs(2).limit_train_batches(0.5), 6},
      {"max_steps below the epochs' steps", quiet(dir.path).max_epochs(5).max_steps(4), 4},
      {"max_steps alone (max_epochs -1)", quiet(dir.path).max_epochs(-1).max_steps(10), 10},
      {"fast_dev_run", quiet(dir.path).fast_dev_run(2), 2},
      // Every epoch at its own factor: 3 steps, then 7 and 7.
      {"a GradientAccumulationScheduler of 3 then 1, 3 epochs",
       quiet(dir.path).max_epochs(3).callbacks(
           {std::make_shared<volt::GradientAccumulationScheduler>(
               std::map<int64_t, int64_t>{{0, 3}, {1, 1}})}),
       17},
  };
  for (const auto& c : cases) {
    Estimating model;
    volt::Trainer trainer(c.options);
    trainer.fit(model, volt_test::loader(volt_test::blobs(100)));
    ASSERT_FALSE(model.estimates.empty()) << c.what;
    for (int64_t e : model.estimates) EXPECT_EQ(e, c.expected) << c.what;
    EXPECT_EQ(trainer.state().global_step, c.expected) << c.what;
  }
  // Only a fit has a training loader to count.
  Estimating model;
  volt::Trainer trainer(quiet(dir.path));
  trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
  const std::string err = error_of<volt::ConfigError>([&] { model.estimated_stepping_batches(); });
  EXPECT_NE(err.find("outside a Trainer run"), std::string::npos) << err;
  class ValidateAsks : public TinyClassifier {
   public:
    void on_validation_start() override { estimated_stepping_batches(); }
  } asks;
  const std::string in_validate = error_of<volt::ConfigError>(
      [&] { trainer.validate(asks, volt_test::loader(volt_test::blobs(32), 16, false)); });
  EXPECT_NE(in_validate.find("known during fit only"), std::string::npos) << in_validate;
}

// Lightning leaves max_epochs -1 (no limit) when max_time or a Timer callback bounds the fit; it
// was 1000 here, so a fit given only max_time stopped after 1000 epochs of a small dataset.
// Nothing then bounds the steps to estimate, which is an error rather than a guess.
TEST(ModuleApi, OnlyTimeBoundsAFitGivenMaxTimeOrATimer) {
  class StopsAtOnce : public volt::Callback {
   public:
    std::string state_key() const override { return "StopsAtOnce"; }
    void on_train_start(volt::RunContext& run, volt::Module&) override {
      max_epochs = run.max_epochs();
    }
    void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                            int64_t) override {
      run.request_stop();
    }
    int64_t max_epochs = 0;
  };
  volt_test::TempDir dir;
  const std::vector<std::pair<const char*, volt::TrainerOptions>> cases = {
      {"max_time", quiet(dir.path).max_time(3600.0)},
      {"a Timer", quiet(dir.path).callbacks(
                      {std::make_shared<volt::Timer>(volt::TimerOptions().duration_s(3600.0))})},
  };
  for (const auto& c : cases) {
    class Asks : public TinyClassifier {
     public:
      std::vector<volt::OptimizerConfig> configure_optimizers() override {
        error = error_of<volt::ConfigError>([&] { estimated_stepping_batches(); });
        return TinyClassifier::configure_optimizers();
      }
      std::string error;
    } model;
    auto stops = std::make_shared<StopsAtOnce>();
    volt::TrainerOptions options = c.second;
    auto callbacks = options.callbacks();
    callbacks.push_back(stops);
    volt::Trainer trainer(options.callbacks(callbacks));
    trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
    EXPECT_EQ(stops->max_epochs, -1) << c.first;
    EXPECT_EQ(trainer.state().global_step, 1) << c.first;
    EXPECT_NE(model.error.find("set max_epochs or max_steps"), std::string::npos)
        << c.first << ": " << model.error;
  }
  // Nothing set: Lightning's 1000, with its warning.
  auto stops = std::make_shared<StopsAtOnce>();
  TinyClassifier model;
  volt::Trainer trainer(quiet(dir.path).callbacks({stops}));
  const auto logs =
      volt_test::capture_logs([&] { trainer.fit(model, volt_test::loader(volt_test::blobs(32))); });
  EXPECT_EQ(stops->max_epochs, 1000);
  EXPECT_TRUE(volt_test::has(logs, "max_epochs was not set; training for at most 1000 epochs"))
      << logs.size();
  // Bounded by max_steps or max_time, or no limit asked for: no warning.
  for (auto options : {quiet(dir.path).max_steps(5), quiet(dir.path).max_time(3600.0),
                       quiet(dir.path).max_epochs(-1)}) {
    TinyClassifier bounded;
    volt::Trainer t(options.callbacks({std::make_shared<StopsAtOnce>()}));
    const auto quiet_logs =
        volt_test::capture_logs([&] { t.fit(bounded, volt_test::loader(volt_test::blobs(32))); });
    EXPECT_FALSE(volt_test::has(quiet_logs, "max_epochs was not set")) << options;
  }
}

// max_epochs=-1 is Lightning's "no epoch limit": the fit runs until something stops it (here the
// module after 1003 epochs). Before session 108 an explicit -1 meant "unset", and the fit ended
// after 1000 epochs.
TEST(ModuleApi, MaxEpochsMinusOneTrainsUntilStopped) {
  class StopsAfter : public TinyClassifier {
   public:
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      error = error_of<volt::ConfigError>([&] { estimated_stepping_batches(); });
      return TinyClassifier::configure_optimizers();
    }
    void on_train_epoch_end() override {
      if (++epochs == 1003) run()->request_stop();
    }
    int64_t epochs = 0;
    std::string error;
  } model;
  volt_test::TempDir dir;
  volt::Trainer trainer(quiet(dir.path).max_epochs(-1).limit_train_batches(int64_t{1}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(8), 8));
  EXPECT_EQ(model.epochs, 1003);
  EXPECT_EQ(trainer.state().global_step, 1003);
  EXPECT_NE(model.error.find("max_epochs=-1"), std::string::npos) << model.error;
  EXPECT_THROW(volt::Trainer(quiet(dir.path).max_epochs(-2)), volt::ConfigError);
}

TEST(ModuleApi, LogDictLogsEveryEntryWithTheOptions) {
  class LogsTwo : public TinyClassifier {
   public:
    void validation_step(const volt::Batch& b, int64_t) override {
      auto logits = forward(b.input);
      log_dict({{"val_loss", torch::cross_entropy_loss(logits, b.target)},
                {"val_acc", logits.argmax(1).eq(b.target).to(torch::kFloat).mean()}},
               volt::LogOptions().prog_bar(true));
    }
  } model;
  volt_test::TempDir dir;
  volt::Trainer trainer(quiet(dir.path));
  const auto metrics = trainer.validate(model, volt_test::loader(volt_test::blobs(64), 16, false));
  EXPECT_EQ(metrics.count("val_loss"), 1u);
  EXPECT_EQ(metrics.count("val_acc"), 1u);
}

TEST(ModuleApi, AllGatherInOneProcessStacksAndPassesGradientsThrough) {
  class Gathers : public TinyClassifier {
   public:
    at::Tensor training_step(const volt::Batch& b, int64_t) override {
      auto logits = forward(b.input);
      auto all = all_gather(logits, /*sync_grads=*/true);  // [1, rows, 2]
      EXPECT_EQ(all.sizes(), (std::vector<int64_t>{1, logits.size(0), 2}));
      EXPECT_TRUE(all.requires_grad());
      EXPECT_FALSE(all_gather(logits).requires_grad());
      return torch::cross_entropy_loss(all[0], b.target);
    }
  };
  // The same fit as without the gather, bit for bit.
  volt_test::TempDir dir;
  auto fit = [&](TinyClassifier& model) {
    volt::Trainer trainer(quiet(dir.path).max_epochs(2));
    trainer.fit(model, volt_test::loader(volt_test::blobs(64)));
    return torch::cat({model.fc1->weight.flatten(), model.fc2->weight.flatten()});
  };
  torch::manual_seed(4);
  TinyClassifier plain;
  torch::manual_seed(4);
  Gathers gathers;
  EXPECT_TRUE(torch::equal(fit(plain), fit(gathers)));
  const std::string err = error_of<volt::ConfigError>([&] { plain.all_gather(torch::ones({2})); });
  EXPECT_NE(err.find("all_gather() was called outside a Trainer run"), std::string::npos) << err;
}

// A generator and a discriminator, each with its optimizer (manual optimization).
class Gan : public volt::Module {
 public:
  Gan() {
    set_automatic_optimization(false);
    gen = register_module("gen", torch::nn::Linear(4, 8));
    disc = register_module("disc", torch::nn::Linear(8, 1));
    frozen = register_parameter("frozen", torch::ones({8}), /*requires_grad=*/false);
  }
  at::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto opts = optimizers();
    // The generator's turn: the discriminator's parameters stop requiring gradients.
    toggle_optimizer(0);
    seen_in_toggle.push_back(gen->weight.requires_grad() && !disc->weight.requires_grad() &&
                             !disc->bias.requires_grad() && !frozen.requires_grad());
    opts[0].zero_grad();
    auto loss = disc(torch::relu(gen(b.input)) * frozen).mean();
    manual_backward(loss);
    disc_grad_in_toggle.push_back(disc->weight.grad().defined());
    opts[0].step();
    untoggle_optimizer(0);
    seen_after.push_back(disc->weight.requires_grad() && gen->weight.requires_grad() &&
                         !frozen.requires_grad());
    return {};
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    std::vector<at::Tensor> g = gen->parameters();
    g.push_back(frozen);  // in an optimizer, frozen on purpose: it stays frozen
    return {volt::OptimizerConfig(std::make_shared<torch::optim::SGD>(g, 0.1)),
            volt::OptimizerConfig(std::make_shared<torch::optim::SGD>(disc->parameters(), 0.1))};
  }
  torch::nn::Linear gen{nullptr}, disc{nullptr};
  at::Tensor frozen;
  std::vector<bool> seen_in_toggle, disc_grad_in_toggle, seen_after;
};

// Manual optimization with two optimizers, each with a step-interval StepLR halving its rate:
// the discriminator's every third step of its own, the generator's every step.
class TwoSchedules : public volt::Module {
 public:
  TwoSchedules() {
    set_automatic_optimization(false);
    gen = register_module("gen", torch::nn::Linear(4, 4));
    disc = register_module("disc", torch::nn::Linear(4, 1));
  }
  at::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto opts = optimizers();
    for (size_t i : {1, 0}) {  // the discriminator first, as a GAN's step
      opts[i].zero_grad();
      const auto loss = disc(gen(b.input)).pow(2).mean();
      manual_backward(loss);
      opts[i].step();
      log(i == 0 ? "g_loss" : "d_loss", loss.detach());
    }
    return {};
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    auto g = std::make_shared<torch::optim::SGD>(gen->parameters(), 0.1);
    auto d = std::make_shared<torch::optim::SGD>(disc->parameters(), 0.1);
    made = {g, d};
    return {volt::OptimizerConfig(g)
                .scheduler(std::make_shared<volt::StepLR>(*g, 1, 0.5))
                .interval(volt::Interval::kStep),
            volt::OptimizerConfig(d)
                .scheduler(std::make_shared<volt::StepLR>(*d, 1, 0.5))
                .interval(volt::Interval::kStep)
                .frequency(3)};
  }
  double lr(size_t i) { return made.at(i)->param_groups()[0].options().get_lr(); }
  torch::nn::Linear gen{nullptr}, disc{nullptr};
  std::vector<std::shared_ptr<torch::optim::Optimizer>> made;
};

TEST(ModuleApi, EachManualStepMovesOnlyItsOptimizersScheduler) {
  // 6 batches, two steps each: the generator's rate halves 6 times, the discriminator's twice
  // (its steps 3 and 6). Each step() advanced every optimizer's scheduler: 12 and 4 halvings
  // (the frequency counted the global step, which both optimizers advance).
  volt_test::TempDir dir;
  auto x = torch::randn({24, 4});
  const auto data = [&] {
    return volt::DataLoader(std::make_shared<volt::TensorDataset>(x, torch::zeros({24})),
                            volt::DataLoaderOptions(4));
  };
  torch::manual_seed(1);
  TwoSchedules whole;
  volt::Trainer whole_run(quiet(dir.path).max_epochs(1));
  whole_run.fit(whole, data());
  EXPECT_EQ(whole_run.state().global_step, 12);
  EXPECT_DOUBLE_EQ(whole.lr(0), 0.1 * std::pow(0.5, 6));
  EXPECT_DOUBLE_EQ(whole.lr(1), 0.1 * std::pow(0.5, 2));
  // Resumed after batch 2 (the discriminator's count 2 is in the checkpoint: counted from 0
  // again, it would halve at batch 5 only).
  torch::manual_seed(1);
  TwoSchedules first;
  volt::Trainer(
      quiet(dir.path).max_epochs(1).max_steps(4).callbacks({std::make_shared<volt::ModelCheckpoint>(
          volt::ModelCheckpointOptions().dirpath(dir / "c").every_n_train_steps(4).save_last(
              true))}))
      .fit(first, data());
  TwoSchedules resumed;
  volt::Trainer resumed_run(quiet(dir.path).max_epochs(1));
  resumed_run.fit(resumed, data(), c10::nullopt, dir / "c/last.ckpt");
  EXPECT_EQ(resumed_run.state().global_step, 12);
  EXPECT_DOUBLE_EQ(resumed.lr(0), whole.lr(0));
  EXPECT_DOUBLE_EQ(resumed.lr(1), whole.lr(1));
  EXPECT_TRUE(torch::equal(resumed.gen->weight, whole.gen->weight));
}

TEST(ModuleApi, ManualOptimizationsStepValuesReachTheLoggers) {
  // Two steps a batch, 6 batches, log_every_n_steps 4: the loggers get the step values when the
  // step count passes 4, 8 and 12 (rows at steps 3, 7, 11, Lightning's step - 1). Under manual
  // optimization none reached a logger (the loop sent them only after its own optimizer step).
  volt_test::TempDir dir;
  TwoSchedules model;
  auto csv = std::make_shared<volt::CSVLogger>(volt::CSVLoggerOptions(dir.path));
  volt::Trainer t(quiet(dir.path).max_epochs(1).log_every_n_steps(4).loggers({csv}));
  t.fit(model, volt::DataLoader(
                   std::make_shared<volt::TensorDataset>(torch::randn({24, 4}), torch::zeros({24})),
                   volt::DataLoaderOptions(4)));
  std::ifstream in(csv->metrics_path());
  std::string header, line;
  ASSERT_TRUE(std::getline(in, header));
  EXPECT_NE(header.find("d_loss"), std::string::npos) << header;
  EXPECT_NE(header.find("g_loss"), std::string::npos) << header;
  std::vector<std::string> steps;
  while (std::getline(in, line)) steps.push_back(line.substr(0, line.find(',')));
  EXPECT_EQ(steps, (std::vector<std::string>{"3", "7", "11"}));
}

TEST(ModuleApi, ToggleOptimizerFreezesTheOthersParametersUntilUntoggled) {
  volt_test::TempDir dir;
  Gan gan;
  volt::Trainer trainer(quiet(dir.path).max_epochs(1));
  auto x = torch::randn({32, 4});
  trainer.fit(gan, volt::DataLoader(std::make_shared<volt::TensorDataset>(x, torch::zeros({32})),
                                    volt::DataLoaderOptions(8)));
  ASSERT_EQ(gan.seen_in_toggle.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(gan.seen_in_toggle[i]) << i;
    EXPECT_FALSE(gan.disc_grad_in_toggle[i]) << i;  // only the generator's gradients computed
    EXPECT_TRUE(gan.seen_after[i]) << i;
  }

  class Misuses : public Gan {
   public:
    std::string mode;
    at::Tensor training_step(const volt::Batch&, int64_t) override {
      if (mode == "range") toggle_optimizer(2);
      toggle_optimizer(0);
      toggle_optimizer(1);  // without untoggling
      return {};
    }
  };
  for (const std::string mode : {"range", "twice"}) {
    Misuses m;
    m.mode = mode;
    volt::Trainer t(quiet(dir.path).max_epochs(1));
    const std::string err = error_of<volt::ConfigError>([&] {
      t.fit(m, volt::DataLoader(std::make_shared<volt::TensorDataset>(x, torch::zeros({32})),
                                volt::DataLoaderOptions(8)));
    });
    EXPECT_NE(err.find(mode == "range" ? "toggle_optimizer(2): configure_optimizers returned 2"
                                       : "while another is toggled; call untoggle_optimizer"),
              std::string::npos)
        << err;
  }
}

TEST(ModuleApi, DistinctParametersListsATiedLayerOnce) {
  // libtorch's parameters() lists the shared layer's tensors under both names; each once here,
  // in the order of the first name.
  torch::nn::Linear shared(3, 3);
  torch::nn::Sequential model(torch::nn::Linear(2, 3), shared, torch::nn::Tanh(), shared);
  ASSERT_EQ(model->parameters().size(), 6u);
  const std::vector<at::Tensor> once = volt::distinct_parameters(*model);
  ASSERT_EQ(once.size(), 4u);
  auto named = model->named_parameters();
  const std::vector<std::string> order{"0.weight", "0.bias", "1.weight", "1.bias"};
  for (size_t i = 0; i < order.size(); ++i) EXPECT_TRUE(once[i].is_same(named[order[i]])) << i;
  EXPECT_TRUE(volt::distinct_parameters(*model, /*recurse=*/false).empty());
  const at::Tensor a = torch::zeros({2}), b = torch::zeros({2});  // equal values, two tensors
  const std::vector<at::Tensor> tensors = volt::distinct_tensors({a, b, a, b.view({2}), b});
  ASSERT_EQ(tensors.size(), 3u);  // a view is a tensor of its own
  EXPECT_TRUE(tensors[0].is_same(a));
  EXPECT_TRUE(tensors[1].is_same(b));
}

TEST(ModuleApi, AnOptimizerListingATensorTwiceIsAConfigError) {
  // A layer two modules share (tied weights): libtorch's parameters() lists its tensors once per
  // name, and torch::optim would step them twice per step.
  class Tied : public TinyClassifier {
   public:
    Tied() { alias = register_module("alias", fc1); }
    torch::nn::Linear alias{nullptr};
  } tied;
  volt_test::TempDir dir;
  const std::string err = error_of<volt::ConfigError>([&] {
    volt::Trainer(quiet(dir.path).max_epochs(1)).fit(tied, volt_test::loader(volt_test::blobs(32)));
  });
  EXPECT_NE(err.find("[Module] configure_optimizers(): optimizer 0 lists the parameter "
                     "fc1.weight = alias.weight more than once and would step it once per "
                     "listing"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("volt::distinct_parameters(*this)"), std::string::npos) << err;
  // The same tensors listed once train.
  class Once : public Tied {
   public:
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      return {volt::OptimizerConfig(std::make_shared<torch::optim::SGD>(
          volt::distinct_parameters(*this), torch::optim::SGDOptions(0.1)))};
    }
  } once;
  volt::Trainer trainer(quiet(dir.path).max_epochs(1));
  trainer.fit(once, volt_test::loader(volt_test::blobs(32)));
  EXPECT_GT(trainer.state().global_step, 0);
}

/// Calls skip_rest_of_epoch() from on_train_batch_start at batch `at` of epoch 0 (Lightning's
/// `return -1`), or from training_step with `from_step`. No dropout: runs that train different
/// batches draw the same random numbers.
class SkipAt : public TinyClassifier {
 public:
  explicit SkipAt(int64_t at, bool from_step = false) : at_(at), from_step_(from_step) {
    drop->options.p(0.0);
  }
  void on_train_batch_start(const volt::Batch&, int64_t i) override {
    if (!from_step_ && current_epoch() == 0 && i == at_) skip_rest_of_epoch();
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    if (from_step_ && i == at_) skip_rest_of_epoch();
    ++steps;
    return TinyClassifier::training_step(b, i);
  }
  void on_train_end() override {
    const auto schedulers = lr_schedulers();
    if (!schedulers.empty()) lr_at_train_end = schedulers.front()->last_lrs().front();
  }
  int64_t steps = 0;            // training_step calls
  double lr_at_train_end = -1;  // the scheduler's rate then

 private:
  int64_t at_;
  bool from_step_;
};

// With accumulate_grad_batches=2, a skip at batch 3 drops batch 2's half-accumulated gradients
// (Lightning zeroes them at the next window's first batch): the fit ends as one skipping at
// batch 2, which accumulated nothing. Kept, they would have joined epoch 1's first step.
TEST(ModuleApi, SkipRestOfEpochDropsAPartAccumulatedStep) {
  volt_test::TempDir dir;
  auto fit = [&](int64_t at) {
    torch::manual_seed(5);  // the same initial weights
    SkipAt model(at);
    volt::Trainer t(quiet(dir.path).max_epochs(2).accumulate_grad_batches(2));
    t.fit(model, volt_test::loader(volt_test::blobs(96)));  // 6 batches an epoch
    EXPECT_EQ(t.state().global_step, 1 + 3);
    return std::make_pair(model.flat_params(), model.steps);
  };
  const auto at3 = fit(3), at2 = fit(2);
  EXPECT_EQ(at3.second, 3 + 6);
  EXPECT_EQ(at2.second, 2 + 6);
  EXPECT_TRUE(torch::equal(at3.first, at2.first));
}

// A checkpoint written in on_train_epoch_end of an epoch a skip ended (its accumulated micro-batch
// dropped, its epoch scheduler stepped) resumes at the next epoch, and the resumed fit ends with
// the weights and learning rate of the uninterrupted one.
TEST(ModuleApi, AFitResumedFromTheEndOfASkippedEpochEqualsTheUninterruptedOne) {
  volt_test::TempDir dir;
  const auto opts = [&](int64_t epochs) {
    return quiet(dir.path).max_epochs(epochs).accumulate_grad_batches(2);
  };
  const auto fit = [&](volt::Trainer& t, SkipAt& model, const std::string& ckpt = "") {
    model.scheduler_step_size = 1;  // StepLR(gamma 0.5) each epoch
    t.fit(model, volt_test::loader(volt_test::blobs(96)), c10::nullopt, ckpt);
  };
  torch::manual_seed(5);  // the same initial weights for both fits
  SkipAt whole(3);
  volt::Trainer t(opts(3));
  fit(t, whole);
  EXPECT_EQ(t.state().global_step, 1 + 3 + 3);  // batch 2 of epoch 0 accumulated, then dropped

  torch::manual_seed(5);
  SkipAt first(3);
  auto save = std::make_shared<volt_test::SaveAt>(0, -1, dir / "skipped_epoch.ckpt");
  volt::Trainer cut(opts(3).callbacks({save}));
  fit(cut, first);
  EXPECT_EQ(save->accumulated_at_save, 0);
  SkipAt resumed(3);
  volt::Trainer rest(opts(3));
  fit(rest, resumed, dir / "skipped_epoch.ckpt");
  EXPECT_EQ(resumed.steps, 6 + 6) << "the resumed fit trains epochs 1 and 2 only";
  EXPECT_EQ(rest.state().global_step, 1 + 3 + 3);
  EXPECT_TRUE(torch::equal(resumed.flat_params(), whole.flat_params()));
  EXPECT_DOUBLE_EQ(resumed.lr_at_train_end, 0.1 * 0.5 * 0.5 * 0.5);
  EXPECT_DOUBLE_EQ(whole.lr_at_train_end, resumed.lr_at_train_end);
}

TEST(ModuleApi, SkipRestOfEpochOutsideOnTrainBatchStartIsAValueError) {
  volt_test::TempDir dir;
  SkipAt model(1, /*from_step=*/true);
  volt::Trainer t(quiet(dir.path).max_epochs(1));
  const std::string e =
      error_of<volt::ValueError>([&] { t.fit(model, volt_test::loader(volt_test::blobs(64))); });
  EXPECT_NE(e.find("skip_rest_of_epoch() was called outside the module's own on_train_batch_start"),
            std::string::npos)
      << e;
  TinyClassifier alone;
  EXPECT_NE(error_of<volt::ValueError>([&] {
              alone.skip_rest_of_epoch();
            }).find("call it from that hook"),
            std::string::npos);
  EXPECT_FALSE(alone.may_skip_rest_of_epoch()) << "the agreement is off by default";
}

TEST(ModuleApi, FreezeAndUnfreeze) {
  TinyClassifier model;
  model.freeze();
  EXPECT_FALSE(model.is_training());
  EXPECT_FALSE(model.drop->is_training());
  for (const auto& p : model.parameters()) EXPECT_FALSE(p.requires_grad());
  model.unfreeze();
  EXPECT_TRUE(model.is_training());
  EXPECT_TRUE(model.drop->is_training());
  for (const auto& p : model.parameters()) EXPECT_TRUE(p.requires_grad());
}

}  // namespace
