#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>

#include "error_text.h"
#include "log_capture.h"
#include "manual_module.h"
#include "requires.h"
#include "reread.h"
#include "save_at.h"
#include "tiny.h"

namespace {

using volt_test::SaveAt;

using volt::StochasticWeightAveraging;
using volt::StochasticWeightAveragingOptions;
using volt_test::has;
using volt_test::quiet;
using volt_test::TinyClassifier;

std::shared_ptr<StochasticWeightAveraging> swa(StochasticWeightAveragingOptions o) {
  return std::make_shared<StochasticWeightAveraging>(std::move(o));
}

/// Linear-BatchNorm-ReLU-Dropout-Linear with StepLR(1, 0.5) per epoch.
class BatchNormClassifier : public volt::Module {
 public:
  BatchNormClassifier() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    drop = register_module("drop", torch::nn::Dropout(0.2));
    fc2 = register_module("fc2", torch::nn::Linear(16, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2->forward(drop->forward(torch::relu(bn->forward(fc1->forward(x)))));
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto loss = torch::cross_entropy_loss(forward(b.input), b.target);
    log("train_loss", loss);
    return loss;
  }
  void validation_step(const volt::Batch& b, int64_t) override {
    log("val_loss", torch::cross_entropy_loss(forward(b.input), b.target));
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::SGD>(parameters(),
                                                   torch::optim::SGDOptions(0.1).momentum(0.9));
    volt::OptimizerConfig cfg(opt);
    cfg.scheduler(std::make_shared<volt::StepLR>(*opt, 1, 0.5));
    return {cfg};
  }
  torch::Tensor flat_state() {
    std::vector<torch::Tensor> v;
    for (auto& p : parameters()) v.push_back(p.detach().reshape({-1}).to(torch::kDouble));
    for (auto& b : buffers()) v.push_back(b.detach().reshape({-1}).to(torch::kDouble));
    return torch::cat(v).clone();
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Dropout drop{nullptr};
};

torch::Tensor flat_params(volt::Module& m) {
  std::vector<torch::Tensor> v;
  for (auto& p : m.parameters()) v.push_back(p.detach().reshape({-1}));
  return torch::cat(v).clone();
}

/// The lr each epoch trains with and the parameters after each epoch's last batch, as trained
/// (listed before SWA, which puts the average in after the last batch of the last epoch).
class Recorder : public volt::Callback {
 public:
  std::string state_key() const override { return "Recorder"; }
  void on_train_batch_start(volt::RunContext& run, volt::Module&, const volt::Batch&,
                            int64_t idx) override {
    if (idx == 0) {
      lrs.push_back(
          run.optimizer_configs().front().optimizer()->param_groups()[0].options().get_lr());
    }
  }
  void on_train_batch_end(volt::RunContext& run, volt::Module& m, const volt::Batch&,
                          int64_t idx) override {
    if (idx == run.state().num_training_batches - 1) params.push_back(flat_params(m));
  }
  std::vector<double> lrs;
  std::vector<torch::Tensor> params;
};

// Without max_epochs (max_steps ends the fit) an epoch-number start averages from there until
// training ends, as Lightning's (volt refused it, "needs max_epochs", before session 106).
TEST(StochasticWeightAveraging, WithoutMaxEpochsAveragesUntilTrainingEnds) {
  struct AtTrainEnd : volt::Callback {
    std::string state_key() const override { return "AtTrainEnd"; }
    void on_train_end(volt::RunContext&, volt::Module& m) override { params = flat_params(m); }
    torch::Tensor params;
  };
  volt_test::TempDir dir;
  TinyClassifier model;
  auto rec = std::make_shared<Recorder>();
  auto end = std::make_shared<AtTrainEnd>();
  auto cb = swa(StochasticWeightAveragingOptions({0.02}).swa_epoch_start(3).annealing_epochs(1));
  // 4 batches an epoch: epochs 0-3 and 2 batches of epoch 4.
  volt::Trainer t(quiet(dir.path).max_epochs(-1).max_steps(18).callbacks({rec, end, cb}));
  const auto lines =
      volt_test::capture_logs([&] { t.fit(model, volt_test::loader(volt_test::blobs(64))); });
  EXPECT_EQ(t.state().global_step, 18);
  EXPECT_TRUE(has(lines, "averaging the weights at the end of epochs 2..the end of training"));
  ASSERT_EQ(rec->params.size(), 4u);
  ASSERT_TRUE(end->params.defined());
  // The ends of epochs 2 and 3 and the weights training ended with.
  EXPECT_EQ(cb->n_averaged(), 3);
  const torch::Tensor mean = (rec->params[2] + rec->params[3] + end->params) / 3;
  EXPECT_TRUE(torch::allclose(flat_params(model), mean, 1e-6, 1e-7));
  EXPECT_FALSE(torch::allclose(flat_params(model), end->params, 1e-4, 1e-5));
  // From epoch 2 the rate is SWALR's (annealing_epochs 1: swa_lr from the next epoch).
  ASSERT_EQ(rec->lrs.size(), 5u);
  EXPECT_DOUBLE_EQ(rec->lrs[4], 0.02);
}

TEST(StochasticWeightAveraging, AveragesTheLastEpochsAndAnnealsTheLearningRate) {
  volt_test::TempDir dir;
  TinyClassifier model;
  model.scheduler_step_size = 1;  // StepLR(1, 0.5) per epoch until SWA holds it
  auto rec = std::make_shared<Recorder>();
  auto cb = swa(StochasticWeightAveragingOptions({0.02}).swa_epoch_start(4).annealing_epochs(2));
  volt::Trainer t(quiet(dir.path).max_epochs(6).callbacks({rec, cb}));
  const auto lines =
      volt_test::capture_logs([&] { t.fit(model, volt_test::loader(volt_test::blobs(160))); });
  EXPECT_EQ(cb->swa_start(), 3);
  EXPECT_EQ(cb->n_averaged(), 3);

  // Epochs 0-2 under StepLR; from epoch 3 SWALR's schedule from the lr it found (0.0125).
  torch::optim::SGD ref_opt({torch::zeros({1}, torch::requires_grad())},
                            torch::optim::SGDOptions(0.0125));
  volt::SWALR ref(ref_opt, 0.02, 2, volt::AnnealStrategy::kCos);
  std::vector<double> expect = {0.1, 0.05, 0.025, ref.last_lrs()[0]};
  for (int i = 0; i < 2; ++i) {
    ref.step();
    expect.push_back(ref.last_lrs()[0]);
  }
  ASSERT_EQ(rec->lrs.size(), expect.size());
  for (size_t e = 0; e < expect.size(); ++e) {
    EXPECT_NEAR(rec->lrs[e], expect[e], 1e-15) << "epoch " << e;
  }
  EXPECT_DOUBLE_EQ(rec->lrs[4], 0.5 * 0.02 + 0.5 * 0.0125);  // cos at t = 1/2
  EXPECT_DOUBLE_EQ(rec->lrs[5], 0.02);

  // The module holds the mean of the weights at the end of epochs 3, 4 and 5.
  ASSERT_EQ(rec->params.size(), 6u);
  const torch::Tensor mean = (rec->params[3] + rec->params[4] + rec->params[5]) / 3;
  EXPECT_TRUE(torch::allclose(flat_params(model), mean, 1e-6, 1e-7));
  EXPECT_FALSE(torch::allclose(flat_params(model), rec->params[5], 1e-4, 1e-5));
  const auto avg = cb->averaged_parameters();
  ASSERT_EQ(avg.size(), model.parameters().size());
  EXPECT_EQ(avg[0].first, "fc1.weight");
  EXPECT_EQ(avg[0].second.device().type(), torch::kCPU);
  EXPECT_TRUE(has(lines, "in place of the module's StepLR"));
  EXPECT_TRUE(has(lines,
                  "the module now holds the average of the weights at the "
                  "end of 3 epoch(s) (3..5)"));
}

TEST(StochasticWeightAveraging, FractionStartLinearAnnealingAndACustomAverage) {
  volt_test::TempDir dir;
  TinyClassifier model;
  auto rec = std::make_shared<Recorder>();
  // An exponential moving average instead of the mean.
  auto ema = [](const at::Tensor& avg, const at::Tensor& cur, int64_t) {
    return avg * 0.5 + cur * 0.5;
  };
  auto cb = swa(StochasticWeightAveragingOptions({0.03})
                    .swa_epoch_start(0.5)
                    .annealing_epochs(0)
                    .annealing_strategy(volt::AnnealStrategy::kLinear)
                    .avg_fn(ema));
  volt::Trainer t(quiet(dir.path).max_epochs(5).callbacks({rec, cb}));
  t.fit(model, volt_test::loader(volt_test::blobs(96)));
  EXPECT_EQ(cb->swa_start(), 1);  // int(0.5 * 5) = 2nd epoch
  EXPECT_EQ(rec->lrs, (std::vector<double>{0.1, 0.03, 0.03, 0.03, 0.03}));
  torch::Tensor expect = rec->params[1];
  for (size_t e = 2; e < 5; ++e) expect = expect * 0.5 + rec->params[e] * 0.5;
  EXPECT_TRUE(torch::allclose(flat_params(model), expect, 1e-6, 1e-7));
}

TEST(StochasticWeightAveraging, RecomputesBatchNormStatisticsForTheAverage) {
  volt_test::TempDir dir;
  auto data = volt_test::blobs(160);
  BatchNormClassifier model;
  auto rec = std::make_shared<Recorder>();
  auto cb = swa(StochasticWeightAveragingOptions({0.01}).swa_epoch_start(3));
  auto last = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "ckpt").save_last(true).save_top_k(0));
  volt::Trainer t(quiet(dir.path).max_epochs(4).callbacks({rec, cb, last}));
  auto val = volt_test::loader(volt_test::blobs(64, 8, 5), 16, false);
  const auto lines = volt_test::capture_logs(
      [&] { t.fit(model, volt_test::loader(data, 16, /*shuffle=*/false), val); });
  // The last epoch's validation and checkpoint saw the averaged model.
  const double fit_val = t.callback_metrics().at("val_loss");
  EXPECT_DOUBLE_EQ(t.validate(model, val).at("val_loss"), fit_val);
  BatchNormClassifier from_last;
  volt::Trainer(quiet(dir.path)).validate(from_last, val, dir / "ckpt/last.ckpt");
  EXPECT_TRUE(torch::equal(from_last.flat_state(), model.flat_state()));
  ASSERT_EQ(cb->n_averaged(), 2);
  EXPECT_TRUE(
      torch::allclose(flat_params(model), (rec->params[2] + rec->params[3]) / 2, 1e-6, 1e-7));
  EXPECT_EQ(model.bn->options.momentum(), c10::optional<double>(0.1));  // given back
  EXPECT_EQ(model.bn->num_batches_tracked.item<int64_t>(), 10);
  EXPECT_TRUE(has(lines, "the running statistics of 1 BatchNorm layer(s)"));

  // Reference (torch.optim.swa_utils.update_bn): with the averaged weights, reset the running
  // statistics and take their cumulative average over one pass of the training data.
  BatchNormClassifier ref;
  {
    torch::NoGradGuard g;
    for (size_t i = 0; i < ref.parameters().size(); ++i) {
      ref.parameters()[i].copy_(model.parameters()[i]);
    }
    ref.bn->reset_running_stats();
    ref.bn->options.momentum(c10::nullopt);
    ref.train();
    for (int64_t b = 0; b < 10; ++b) ref.forward(data->inputs().narrow(0, b * 16, 16));
  }
  EXPECT_TRUE(torch::equal(model.bn->running_mean, ref.bn->running_mean));
  EXPECT_TRUE(torch::equal(model.bn->running_var, ref.bn->running_var));
}

// A BatchNorm layer registered twice is one layer in the statistics pass: its momentum was saved
// a second time after the pass had cleared it, and the layer ended with none.
TEST(StochasticWeightAveraging, ABatchNormLayerRegisteredTwiceGetsItsMomentumBack) {
  struct SharedBn : BatchNormClassifier {
    SharedBn() { register_module("bn_again", bn); }
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      return {volt::OptimizerConfig(std::make_shared<torch::optim::SGD>(
          volt::distinct_parameters(*this), torch::optim::SGDOptions(0.1)))};
    }
  };
  volt_test::TempDir dir;
  SharedBn model;
  auto cb = swa(StochasticWeightAveragingOptions({0.01}).swa_epoch_start(2));
  volt::Trainer t(quiet(dir.path).max_epochs(2).callbacks({cb}));
  const auto lines = volt_test::capture_logs(
      [&] { t.fit(model, volt_test::loader(volt_test::blobs(64), 16, /*shuffle=*/false)); });
  ASSERT_EQ(cb->n_averaged(), 1);
  EXPECT_EQ(model.bn->options.momentum(), c10::optional<double>(0.1));
  EXPECT_TRUE(has(lines, "the running statistics of 1 BatchNorm layer(s)"));
}

// A fit interrupted anywhere (before SWA, at the end of its first epoch with the checkpoint
// written before SWA's hooks run, mid-epoch during SWA) resumes to the same final weights and
// BatchNorm statistics, bit for bit.
TEST(StochasticWeightAveraging, ResumesExactly) {
  volt_test::TempDir dir;
  auto data = volt_test::blobs(160);
  const auto opts = [&](const std::string& sub) { return quiet(dir / sub).max_epochs(6); };
  const auto swa_cb = [] {
    return swa(StochasticWeightAveragingOptions({0.02}).swa_epoch_start(3).annealing_epochs(2));
  };
  BatchNormClassifier whole;
  volt::Trainer tw(opts("w").callbacks({std::make_shared<SaveAt>(0, -1, dir / "e0.ckpt"),
                                        std::make_shared<SaveAt>(2, -1, dir / "e2.ckpt"),
                                        std::make_shared<SaveAt>(3, -1, dir / "e3.ckpt"), swa_cb(),
                                        std::make_shared<SaveAt>(4, 6, dir / "mid4.ckpt")}));
  tw.fit(whole, volt_test::loader(data));
  for (const char* ckpt : {"e0.ckpt", "e2.ckpt", "e3.ckpt", "mid4.ckpt"}) {
    SCOPED_TRACE(ckpt);
    BatchNormClassifier resumed;
    auto cb = swa_cb();
    volt::Trainer tr(opts("r").callbacks({cb}));
    tr.fit(resumed, volt_test::loader(data), c10::nullopt, dir / ckpt);
    EXPECT_EQ(cb->n_averaged(), 4);
    EXPECT_TRUE(torch::equal(whole.flat_state(), resumed.flat_state()));
  }
}

TEST(StochasticWeightAveraging, RefusesWhatCannotWork) {
  using volt_test::error_of;
  const auto make_error = [](StochasticWeightAveragingOptions o) {
    return error_of<volt::ConfigError>([&] { StochasticWeightAveraging cb(o); });
  };
  EXPECT_TRUE(has(make_error({std::vector<double>{}}), "swa_lrs is empty"));
  EXPECT_TRUE(has(make_error({{0.1, -1.0}}), "swa_lrs holds -1"));
  EXPECT_TRUE(has(make_error({{NAN}}), "positive finite"));
  EXPECT_TRUE(has(make_error(StochasticWeightAveragingOptions({0.1}).swa_epoch_start(0)),
                  "swa_epoch_start=0 must be an epoch number >= 1"));
  EXPECT_TRUE(has(make_error(StochasticWeightAveragingOptions({0.1}).swa_epoch_start(1.5)),
                  "swa_epoch_start=1.5 is a fraction outside [0, 1]"));
  EXPECT_TRUE(has(make_error(StochasticWeightAveragingOptions({0.1}).annealing_epochs(-1)),
                  "annealing_epochs=-1 must be >= 0"));

  volt_test::TempDir dir;
  auto data = volt_test::loader(volt_test::blobs(64));
  const auto fit_error = [&](volt::TrainerOptions o, StochasticWeightAveragingOptions so,
                             volt::Module& m) {
    return error_of<volt::Error>([&] { volt::Trainer(o.callbacks({swa(so)})).fit(m, data); });
  };
  TinyClassifier model;
  const auto before = model.flat_params();
  EXPECT_TRUE(has(fit_error(quiet(dir.path).max_epochs(-1).max_steps(10), {{0.1}}, model),
                  "swa_epoch_start as a fraction (0.8) is not supported when max_epochs=-1; "
                  "provide swa_epoch_start as an integer"));
  EXPECT_TRUE(has(fit_error(quiet(dir.path).max_epochs(3),
                            StochasticWeightAveragingOptions({0.1}).swa_epoch_start(5), model),
                  "swa_epoch_start=5 is past the last of max_epochs=3 epochs"));
  if (volt_test::gloo()) {  // a one-process DeepSpeed fit on the CPU makes a Gloo group
    EXPECT_TRUE(
        has(fit_error(quiet(dir.path).max_epochs(3).strategy("deepspeed_stage_2"), {{0.1}}, model),
            "does not work with the deepspeed strategy"));
  }
  EXPECT_TRUE(torch::equal(before, model.flat_params()));  // refused before training
  // A list longer than the groups may name one BackboneFinetuning adds before SWA starts: it is
  // checked when SWA starts.
  TinyClassifier two_rates;
  EXPECT_TRUE(has(fit_error(quiet(dir.path).max_epochs(3), {{0.1, 0.2}}, two_rates),
                  "got 2 swa_lrs for the 1 param groups the optimizer has when SWA starts"));

  // A param group added once SWA runs has no rate to anneal from: a ConfigError saying so (a
  // CheckpointError about "the checkpoint" before session 81, with no checkpoint involved).
  struct AddsAGroupAt : volt::Callback {
    int64_t epoch;
    at::Tensor extra = torch::zeros({1}, torch::requires_grad());
    explicit AddsAGroupAt(int64_t e) : epoch(e) {}
    std::string state_key() const override { return "AddsAGroupAt"; }
    void on_train_epoch_start(volt::RunContext& run, volt::Module&) override {
      if (run.state().epoch != epoch) return;
      run.optimizer_configs().front().optimizer()->add_param_group(
          torch::optim::OptimizerParamGroup(
              {extra}, std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.01))));
    }
  };
  TinyClassifier grows;
  const std::string grown = error_of<volt::ConfigError>([&] {
    volt::Trainer(quiet(dir.path).max_epochs(3).callbacks(
                      {std::make_shared<AddsAGroupAt>(2),
                       swa(StochasticWeightAveragingOptions({0.1}).swa_epoch_start(2))}))
        .fit(grows, data);
  });
  EXPECT_TRUE(has(grown, "had 1 param groups when SWA started and has 2 now")) << grown;

  struct ManualWithBatchNorm : volt_test::ManualTinyClassifier {
    ManualWithBatchNorm() { register_module("bn", torch::nn::BatchNorm1d(16)); }
  } manual;
  EXPECT_TRUE(has(fit_error(quiet(dir.path).max_epochs(3), {{0.1}}, manual),
                  "under manual optimization would step the optimizers"));
  // Manual optimization without BatchNorm averages as usual.
  volt_test::ManualTinyClassifier manual_ok;
  auto ok = swa(StochasticWeightAveragingOptions({0.1}).swa_epoch_start(2));
  volt::Trainer(quiet(dir.path).max_epochs(3).callbacks({ok})).fit(manual_ok, data);
  EXPECT_EQ(ok->n_averaged(), 2);
}

// A param group added before SWA starts (BackboneFinetuning's unfreeze, which SWA's error tells
// users to do) takes its SWA lr: one value is for every group SWA finds, a list names them all.
// The single value was expanded to the groups at fit start and the added group's lr was read
// past the end of the list (undefined behaviour); a list for both groups was refused.
TEST(StochasticWeightAveraging, AGroupAddedBeforeSwaStartsTakesItsSwaLr) {
  struct AddsAGroupAtEpoch1 : volt::Callback {
    at::Tensor extra = torch::zeros({1}, torch::requires_grad());
    std::vector<double> last_lrs;
    std::string state_key() const override { return "AddsAGroupAtEpoch1"; }
    void on_train_epoch_start(volt::RunContext& run, volt::Module&) override {
      if (run.state().epoch != 1) return;
      run.optimizer_configs().front().optimizer()->add_param_group(
          torch::optim::OptimizerParamGroup(
              {extra}, std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.01))));
    }
    void on_train_batch_start(volt::RunContext& run, volt::Module&, const volt::Batch&,
                              int64_t) override {
      last_lrs.clear();
      for (auto& g : run.optimizer_configs().front().optimizer()->param_groups()) {
        last_lrs.push_back(g.options().get_lr());
      }
    }
  };
  volt_test::TempDir dir;
  auto data = volt_test::loader(volt_test::blobs(64));
  for (const auto& rates : {std::vector<double>{0.05}, std::vector<double>{0.05, 0.02}}) {
    TinyClassifier model;
    auto adds = std::make_shared<AddsAGroupAtEpoch1>();
    volt::Trainer(
        quiet(dir.path).max_epochs(4).callbacks(
            {adds,
             swa(StochasticWeightAveragingOptions(rates).swa_epoch_start(3).annealing_epochs(0))}))
        .fit(model, data);
    const std::vector<double> want =
        rates.size() == 1 ? std::vector<double>{0.05, 0.05} : std::vector<double>{0.05, 0.02};
    EXPECT_EQ(adds->last_lrs, want);
  }
}

/// The callback's state as a checkpoint would hold it, with the given average and lrs.
torch::serialize::InputArchive swa_state(int64_t n, const std::map<std::string, at::Tensor>& avg,
                                         std::vector<double> lr0 = {}) {
  torch::serialize::OutputArchive out, averaged;
  out.write("n_averaged", c10::IValue(n));
  out.write("latest_update_epoch", c10::IValue(int64_t{0}));
  out.write("finished_epoch", c10::IValue(int64_t{-1}));
  out.write("lr0", c10::IValue(c10::List<double>(lr0)));
  for (const auto& kv : avg) averaged.write(kv.first, kv.second);
  out.write("averaged", averaged);
  return volt_test::reread(out);
}

TEST(StochasticWeightAveraging, RefusesAStateThatDoesNotFitTheModule) {
  volt_test::TempDir dir;
  auto data = volt_test::loader(volt_test::blobs(64));
  const auto opts = StochasticWeightAveragingOptions({0.1}).swa_epoch_start(1);
  const auto fit_error = [&](torch::serialize::InputArchive state) {
    TinyClassifier model;
    auto cb = swa(opts);
    cb->load_state(state);
    return volt_test::error_of<volt::CheckpointError>(
        [&] { volt::Trainer(quiet(dir.path).max_epochs(2).callbacks({cb})).fit(model, data); });
  };
  EXPECT_TRUE(has(volt_test::error_of<volt::CheckpointError>([&] {
                    StochasticWeightAveraging cb(opts);
                    auto state = swa_state(2, {});
                    cb.load_state(state);
                  }),
                  "counts 2 averaged epochs but holds no average; it is damaged"));
  TinyClassifier shapes;
  std::map<std::string, at::Tensor> whole;
  for (const auto& p : shapes.named_parameters()) whole[p.key()] = p.value().detach().clone();
  auto wrong_shape = whole;
  wrong_shape["fc1.weight"] = torch::zeros({3, 3});
  EXPECT_TRUE(has(fit_error(swa_state(1, wrong_shape)),
                  "the checkpoint's average of 'fc1.weight' has shape [3, 3] but the module's "
                  "has [16, 8]"));
  auto missing = whole;
  missing.erase("fc2.bias");
  EXPECT_TRUE(has(fit_error(swa_state(1, missing)), "the checkpoint's average has no 'fc2.bias'"));
  auto extra = whole;
  extra["fc3.weight"] = torch::zeros({2});
  EXPECT_TRUE(has(fit_error(swa_state(1, extra)), "holds 5 tensors but the module has 4"));
  EXPECT_TRUE(has(fit_error(swa_state(0, {}, {0.1, 0.2})),
                  "holds learning rates for 2 param groups but the optimizer has 1"));
}

/// Calls forward_training_data() from its training_step, where it cannot run.
class ForwardInStep : public TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t idx) override {
    if (run_ != nullptr) run_->forward_training_data();
    return TinyClassifier::training_step(b, idx);
  }
  volt::RunContext* run_ = nullptr;
};

/// Calls forward_training_data() from a hook: at the end of each training batch (allowed), and
/// hands the RunContext to the module; and after validation (only allowed inside fit).
class ForwardFromHooks : public volt::Callback {
 public:
  std::string state_key() const override { return "ForwardFromHooks"; }
  void on_train_batch_end(volt::RunContext& run, volt::Module& m, const volt::Batch&,
                          int64_t) override {
    run.forward_training_data();
    ++passes;
    if (auto* f = dynamic_cast<ForwardInStep*>(&m)) f->run_ = &run;
  }
  void on_validation_end(volt::RunContext& run, volt::Module&) override {
    run.forward_training_data();
  }
  int passes = 0;
};

TEST(StochasticWeightAveraging, ForwardTrainingDataRunsOnlyFromHooksOfFit) {
  volt_test::TempDir dir;
  auto data = volt_test::loader(volt_test::blobs(64));
  TinyClassifier model;
  auto hooks = std::make_shared<ForwardFromHooks>();
  volt::Trainer t(quiet(dir.path).max_epochs(1).callbacks({hooks}));
  t.fit(model, data);
  EXPECT_EQ(hooks->passes, 4);
  EXPECT_EQ(t.state().global_step, 4);
  EXPECT_TRUE(has(volt_test::error_of<volt::ValueError>([&] { t.validate(model, data); }),
                  "forward_training_data() runs only inside fit, from a hook"));
  ForwardInStep in_step;
  volt::Trainer ts(quiet(dir.path).max_epochs(1).callbacks({std::make_shared<ForwardFromHooks>()}));
  EXPECT_TRUE(has(volt_test::error_of<volt::ValueError>([&] { ts.fit(in_step, data); }),
                  "not from a step"));
}

/// Keeps its dropout in eval mode from each epoch's start, and checks it stays so in the
/// training steps (forward_training_data's own pass, without gradients, runs all in train mode,
/// as torch's update_bn).
class FrozenDropout : public TinyClassifier {
 public:
  void on_train_epoch_start() override { drop->eval(); }
  torch::Tensor training_step(const volt::Batch& b, int64_t idx) override {
    if (torch::GradMode::is_enabled()) {
      EXPECT_TRUE(is_training());
      EXPECT_FALSE(drop->is_training()) << "batch " << idx;
      ++steps;
    }
    return TinyClassifier::training_step(b, idx);
  }
  int steps = 0;
};

TEST(StochasticWeightAveraging, ForwardTrainingDataPutsEverySubmodulesModeBack) {
  volt_test::TempDir dir;
  FrozenDropout model;
  auto hooks = std::make_shared<ForwardFromHooks>();  // also inside each validation pass
  volt::Trainer t(quiet(dir.path).max_epochs(2).limit_val_batches(int64_t{1}).callbacks({hooks}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(hooks->passes, 8);
  EXPECT_EQ(model.steps, 8);
  EXPECT_FALSE(model.drop->is_training());
  EXPECT_TRUE(model.fc1->is_training());
}

}  // namespace
