// BaseFinetuning / BackboneFinetuning: fits against Lightning's algorithm in PyTorch
// (tools/finetuning_reference.py), the helpers, exact resume across the unfreeze, and errors.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "build_paths.h"
#include "error_text.h"
#include "log_capture.h"
#include "requires.h"
#include "reread.h"
#include "save_at.h"
#include "tiny.h"

namespace {

using json = nlohmann::json;
using volt::BackboneFinetuning;
using volt::BackboneFinetuningOptions;
using volt::BaseFinetuning;
using volt_test::error_of;
using volt_test::has;
using volt_test::quiet;
using volt_test::SaveAt;

/// A backbone (Linear, BatchNorm, ReLU) and a head; SGD with momentum over the parameters that
/// require a gradient when configure_optimizers runs (as Lightning's docs ask), and optionally an
/// epoch StepLR halving every `step_size` epochs.
class FinetuneNet : public volt::Module {
 public:
  explicit FinetuneNet(double lr = 0.1, int64_t step_size = 0) : lr_(lr), step_size_(step_size) {
    backbone = register_module(
        "backbone", torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16),
                                          torch::nn::ReLU()));
    head = register_module("head", torch::nn::Linear(16, 2));
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    return torch::cross_entropy_loss(head->forward(backbone->forward(b.input)), b.target);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    std::vector<torch::Tensor> trainable;
    for (auto& p : parameters()) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    auto opt =
        std::make_shared<torch::optim::SGD>(trainable, torch::optim::SGDOptions(lr_).momentum(0.9));
    volt::OptimizerConfig config(opt);
    if (step_size_ > 0) config.scheduler(std::make_shared<volt::StepLR>(*opt, step_size_, 0.5));
    return {config};
  }
  /// Parameters and buffers by name.
  std::map<std::string, torch::Tensor> state() {
    std::map<std::string, torch::Tensor> out;
    for (const auto& p : named_parameters(true)) out[p.key()] = p.value().detach().clone();
    for (const auto& b : named_buffers(true)) out[b.key()] = b.value().detach().clone();
    return out;
  }
  torch::nn::BatchNormOptions* bn_options() {
    return &backbone[1]->as<torch::nn::BatchNorm1d>()->options;
  }
  torch::nn::Sequential backbone{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  double lr_;
  int64_t step_size_;
};

/// The learning rate of every param group when each training epoch starts (listed after the
/// finetuning callback, so it sees what that epoch trains with).
class Rates : public volt::Callback {
 public:
  std::string state_key() const override { return "Rates"; }
  void on_train_epoch_start(volt::RunContext& run, volt::Module&) override {
    std::vector<double> lrs;
    for (const auto& g : run.optimizer_configs().front().optimizer()->param_groups()) {
      lrs.push_back(g.options().get_lr());
    }
    if (static_cast<int64_t>(epochs.size()) == run.state().epoch) {
      epochs.push_back(lrs);
    } else {
      epochs.at(run.state().epoch) = lrs;  // a resumed epoch starts again
    }
  }
  std::vector<std::vector<double>> epochs;
};

json reference() {
  std::ifstream in(volt_test::source_dir() + "/tests/callbacks/data/finetuning_reference.json");
  EXPECT_TRUE(in.good()) << "run tools/finetuning_reference.py";
  return json::parse(in);
}

BackboneFinetuningOptions options_of(const json& c) {
  const double factor = c["lambda_factor"].get<double>();
  BackboneFinetuningOptions o;
  o.unfreeze_backbone_at_epoch(c["unfreeze_backbone_at_epoch"].get<int64_t>())
      .backbone_initial_ratio_lr(c["backbone_initial_ratio_lr"].get<double>())
      .should_align(c["should_align"].get<bool>())
      .lambda_func([factor](int64_t) { return factor; })
      .train_bn(c["train_bn"].get<bool>());
  if (!c["backbone_initial_lr"].is_null()) {
    o.backbone_initial_lr(c["backbone_initial_lr"].get<double>());
  }
  return o;
}

/// A model of case `c` with the reference's initial state, and the case's data.
struct CaseSetup {
  std::shared_ptr<FinetuneNet> model;
  std::shared_ptr<volt::TensorDataset> data;
};
CaseSetup setup_of(const json& entry) {
  const json& c = entry["case"];
  CaseSetup s;
  s.model = std::make_shared<FinetuneNet>(c["lr"].get<double>(), c["step_size"].get<int64_t>());
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, torch::Tensor& target) {
    const auto values = entry["init"].at(name).get<std::vector<double>>();
    target.copy_(torch::tensor(values, torch::kDouble).reshape(target.sizes()));
  };
  for (auto& p : s.model->named_parameters(true)) load(p.key(), p.value());
  for (auto& b : s.model->named_buffers(true)) load(b.key(), b.value());
  const int64_t n = c["samples"].get<int64_t>();
  auto x = torch::tensor(entry["x"].get<std::vector<double>>(), torch::kDouble)
               .to(torch::kFloat)
               .reshape({n, 8});
  auto y = (x.sum(1) > 0).to(torch::kLong);
  s.data = std::make_shared<volt::TensorDataset>(x, y);
  return s;
}

void expect_state_matches(const std::map<std::string, torch::Tensor>& got, const json& want,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, t] : got) {
    const auto values = want.at(name).get<std::vector<double>>();
    const torch::Tensor w = torch::tensor(values, torch::kDouble).reshape(t.sizes());
    EXPECT_TRUE(torch::allclose(t.to(torch::kDouble), w, 1e-5, 1e-6))
        << what << ": " << name << " max diff "
        << (t.to(torch::kDouble) - w).abs().max().item<double>();
  }
}

TEST(BackboneFinetuning, FitsMatchLightningsAlgorithmInPyTorch) {
  const json ref = reference();
  ASSERT_EQ(ref["cases"].size(), 2u);
  for (const json& entry : ref["cases"]) {
    const json& c = entry["case"];
    const std::string name = c["name"].get<std::string>();
    volt_test::TempDir dir;
    CaseSetup s = setup_of(entry);
    const auto initial = s.model->state();
    auto finetuning = std::make_shared<BackboneFinetuning>(options_of(c));
    auto rates = std::make_shared<Rates>();
    volt::Trainer t(
        quiet(dir.path).max_epochs(c["epochs"].get<int64_t>()).callbacks({finetuning, rates}));
    t.fit(*s.model, volt_test::loader(s.data, c["batch"].get<int64_t>(), /*shuffle=*/false));
    // Every param group's rate in every epoch, exactly (the same double arithmetic).
    const auto want_lrs = entry["lrs"].get<std::vector<std::vector<double>>>();
    ASSERT_EQ(rates->epochs.size(), want_lrs.size()) << name;
    for (size_t e = 0; e < want_lrs.size(); ++e) {
      ASSERT_EQ(rates->epochs[e].size(), want_lrs[e].size()) << name << " epoch " << e;
      for (size_t g = 0; g < want_lrs[e].size(); ++g) {
        EXPECT_DOUBLE_EQ(rates->epochs[e][g], want_lrs[e][g]) << name << " epoch " << e;
      }
    }
    // The weights and BatchNorm statistics PyTorch ended with (a frozen BatchNorm kept its
    // running statistics and batch count while frozen in the second case).
    expect_state_matches(s.model->state(), entry["final"], name);
    EXPECT_FALSE(
        torch::equal(s.model->state()["backbone.0.weight"], initial.at("backbone.0.weight")))
        << name << ": the backbone never trained";
    EXPECT_EQ(finetuning->backbone_lr(), want_lrs.back().back()) << name;
    // The momentum of the backbone's BatchNorm is its own again after the unfreeze.
    EXPECT_EQ(s.model->bn_options()->momentum(), c10::optional<double>(0.1)) << name;
  }
}

TEST(BackboneFinetuning, TheBackboneStaysFrozenUntilTheUnfreezeEpoch) {
  volt_test::TempDir dir;
  torch::manual_seed(0);
  FinetuneNet model(0.1);
  auto finetuning = std::make_shared<BackboneFinetuning>(
      BackboneFinetuningOptions().unfreeze_backbone_at_epoch(2).train_bn(false).verbose(true));
  struct Frozen : volt::Callback {
    std::string state_key() const override { return "Frozen"; }
    void on_train_epoch_end(volt::RunContext&, volt::Module& m) override {
      auto& net = static_cast<FinetuneNet&>(m);
      states.push_back(net.state());
      momenta.push_back(net.bn_options()->momentum());
    }
    std::vector<std::map<std::string, torch::Tensor>> states;
    std::vector<c10::optional<double>> momenta;
  };
  auto frozen = std::make_shared<Frozen>();
  const auto initial = model.state();
  volt::Trainer t(quiet(dir.path).max_epochs(4).callbacks({finetuning, frozen}));
  const auto lines =
      volt_test::capture_logs([&] { t.fit(model, volt_test::loader(volt_test::blobs(64))); });
  ASSERT_EQ(frozen->states.size(), 4u);
  for (const std::string& name : {"backbone.0.weight", "backbone.0.bias", "backbone.1.weight",
                                  "backbone.1.running_mean", "backbone.1.running_var"}) {
    for (int e = 0; e < 2; ++e) {
      EXPECT_TRUE(torch::equal(frozen->states[e].at(name), initial.at(name)))
          << name << " changed in frozen epoch " << e;
    }
  }
  // After the unfreeze the Linear's weight trains and the running statistics move again (not
  // checked: its bias, whose gradient the BatchNorm right after it makes zero up to rounding).
  for (const std::string& name :
       {"backbone.0.weight", "backbone.1.running_mean", "backbone.1.running_var"}) {
    EXPECT_FALSE(torch::equal(frozen->states[3].at(name), initial.at(name))) << name;
  }
  // BatchNorm's affine parameters require a gradient again but stay out of the new group
  // (train_bn=false), as Lightning's.
  for (const std::string& name : {"backbone.1.weight", "backbone.1.bias"}) {
    EXPECT_TRUE(torch::equal(frozen->states[3].at(name), initial.at(name))) << name;
  }
  EXPECT_FALSE(torch::equal(frozen->states[0].at("head.weight"), initial.at("head.weight")));
  EXPECT_EQ(frozen->momenta[1], c10::optional<double>(0.0));
  EXPECT_EQ(frozen->momenta[2], c10::optional<double>(0.1));
  EXPECT_TRUE(has(lines, "[BackboneFinetuning] Current lr: 0.1, Backbone lr: 0.01"));
  EXPECT_TRUE(has(lines, "Current lr: 0.1, Backbone lr: 0.02"));
  EXPECT_TRUE(has(lines,
                  "the parameters that require a gradient changed (2 -> 6 tensors) at "
                  "epoch 2"));
}

// A fit resumed from a checkpoint written before the unfreeze, or inside an epoch after it (the
// optimizer then holds the backbone's group and its momentum), ends bit for bit as the
// uninterrupted one, with the same rates.
TEST(BackboneFinetuning, AResumeBeforeOrAfterTheUnfreezeIsExact) {
  const json ref = reference();
  for (const json& entry : ref["cases"]) {
    const json& c = entry["case"];
    const std::string name = c["name"].get<std::string>();
    const int64_t epochs = c["epochs"].get<int64_t>();
    const int64_t at = c["unfreeze_backbone_at_epoch"].get<int64_t>();
    volt_test::TempDir dir;
    CaseSetup whole = setup_of(entry);
    auto rates = std::make_shared<Rates>();
    volt::Trainer t(quiet(dir.path).max_epochs(epochs).callbacks(
        {std::make_shared<BackboneFinetuning>(options_of(c)), rates,
         std::make_shared<SaveAt>(at - 1, 1, dir / "before.ckpt"),
         std::make_shared<SaveAt>(at + 1, 2, dir / "after.ckpt")}));
    const auto loader = volt_test::loader(whole.data, c["batch"].get<int64_t>(), false);
    t.fit(*whole.model, loader);
    for (const std::string ckpt : {"before.ckpt", "after.ckpt"}) {
      FinetuneNet resumed(c["lr"].get<double>(), c["step_size"].get<int64_t>());
      auto resumed_rates = std::make_shared<Rates>();
      // The rates of the epochs before the resumed one, as the watcher of the whole fit saw.
      const int64_t from = ckpt == "before.ckpt" ? at - 1 : at + 1;
      resumed_rates->epochs.assign(rates->epochs.begin(), rates->epochs.begin() + from);
      volt::Trainer r(quiet(dir.path).max_epochs(epochs).callbacks(
          {std::make_shared<BackboneFinetuning>(options_of(c)), resumed_rates}));
      r.fit(resumed, loader, c10::nullopt, dir / ckpt);
      const auto got = resumed.state();
      for (const auto& [key, value] : whole.model->state()) {
        EXPECT_TRUE(torch::equal(got.at(key), value)) << name << " from " << ckpt << ": " << key;
      }
      EXPECT_EQ(resumed_rates->epochs, rates->epochs) << name << " from " << ckpt;
    }
  }
}

TEST(BackboneFinetuning, AResumeWithoutTheCallbackNamesIt) {
  volt_test::TempDir dir;
  FinetuneNet model(0.1);
  const auto data = volt_test::blobs(64);
  volt::Trainer t(quiet(dir.path).max_epochs(2).callbacks(
      {std::make_shared<BackboneFinetuning>(
           BackboneFinetuningOptions().unfreeze_backbone_at_epoch(0)),
       std::make_shared<SaveAt>(1, 1, dir / "mid.ckpt")}));
  t.fit(model, volt_test::loader(data));
  FinetuneNet again(0.1);
  volt::Trainer r(quiet(dir.path).max_epochs(3));
  EXPECT_TRUE(has(error_of<volt::CheckpointError>([&] {
                    r.fit(again, volt_test::loader(data), c10::nullopt, dir / "mid.ckpt");
                  }),
                  "has 2 param groups but configure_optimizers built 1; resume with the same "
                  "optimizer setup (and with the callbacks that added param groups during the "
                  "run, such as BackboneFinetuning)"));
}

// Several optimizers (manual optimization): as Lightning's, each gets the backbone's group at
// the unfreeze (at its own first group's rate times the ratio) and each call advances the rate,
// so it grows once per optimizer each epoch.
TEST(BackboneFinetuning, SeveralOptimizersEachGetTheBackboneAsLightnings) {
  struct TwoOptimizers : FinetuneNet {
    TwoOptimizers() { set_automatic_optimization(false); }
    torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
      for (auto& o : optimizers()) o.zero_grad();
      manual_backward(FinetuneNet::training_step(b, i));
      for (auto& o : optimizers()) o.step();
      return {};
    }
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      std::vector<volt::OptimizerConfig> out;
      opts.clear();
      for (double lr : {0.1, 0.2}) {
        opts.push_back(std::make_shared<torch::optim::SGD>(
            std::vector<torch::Tensor>{head->weight, head->bias}, torch::optim::SGDOptions(lr)));
        out.emplace_back(opts.back());
      }
      return out;
    }
    std::vector<std::shared_ptr<torch::optim::SGD>> opts;
  } model;
  volt_test::TempDir dir;
  auto finetuning = std::make_shared<BackboneFinetuning>(
      BackboneFinetuningOptions().unfreeze_backbone_at_epoch(1));
  volt::Trainer t(quiet(dir.path).max_epochs(3).callbacks({finetuning}));
  t.fit(model, volt_test::loader(volt_test::blobs(32)));
  std::vector<double> backbone;
  for (const auto& o : model.opts) {
    ASSERT_EQ(o->param_groups().size(), 2u);
    backbone.push_back(o->param_groups()[1].options().get_lr());
  }
  // Epoch 1: 0.01 and 0.02; epoch 2: 2 x 0.02 = 0.04, then 2 x 0.04 = 0.08.
  EXPECT_DOUBLE_EQ(backbone[0], 0.04);
  EXPECT_DOUBLE_EQ(backbone[1], 0.08);
}

// A callback of one's own that changes which parameters train during fit: DDP follows (above),
// ZeRO cannot and says so before the epoch trains.
TEST(BaseFinetuning, DeepSpeedRefusesATrainableSetThatChangesDuringFit) {
  VOLT_REQUIRE_GLOO();  // a one-process DeepSpeed fit on the CPU makes a Gloo group
  struct FreezeFc1AtEpoch1 : volt::Callback {
    std::string state_key() const override { return "FreezeFc1AtEpoch1"; }
    void on_train_epoch_start(volt::RunContext& run, volt::Module& m) override {
      if (run.state().epoch == 1) {
        static_cast<volt_test::TinyClassifier&>(m).fc1->weight.set_requires_grad(false);
      }
    }
  };
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  volt::Trainer t(quiet(dir.path)
                      .max_epochs(2)
                      .strategy("deepspeed_stage_2")
                      .callbacks({std::make_shared<FreezeFc1AtEpoch1>()}));
  EXPECT_TRUE(has(
      error_of<volt::ConfigError>([&] { t.fit(model, volt_test::loader(volt_test::blobs(32))); }),
      "[DeepSpeedStrategy] the parameters that require a gradient changed during fit "
      "(now 3 tensors"));
}

TEST(BaseFinetuning, HelpersFreezeUnfreezeAndAddAGroupAsLightnings) {
  struct Plain : BaseFinetuning {
    std::string state_key() const override { return "Plain"; }
    void freeze_before_training(volt::Module&) override {}
    void finetune_function(volt::Module&, int64_t, torch::optim::Optimizer&) override {}
  } f;
  FinetuneNet net;
  auto& backbone = *net.backbone;
  // Leaves (Linear, BatchNorm, ReLU); the Sequential holding them has no parameters of its own.
  EXPECT_EQ(BaseFinetuning::flatten_modules(backbone).size(), 3u);
  EXPECT_EQ(BaseFinetuning::flatten_modules(net).size(), 4u);

  f.freeze(backbone);  // train_bn: BatchNorm stays trainable
  EXPECT_FALSE(net.backbone[0]->as<torch::nn::Linear>()->weight.requires_grad());
  EXPECT_TRUE(net.backbone[1]->as<torch::nn::BatchNorm1d>()->weight.requires_grad());
  EXPECT_EQ(BaseFinetuning::filter_params(backbone, true, true).size(), 2u);
  EXPECT_EQ(BaseFinetuning::filter_params(backbone, false, true).size(), 0u);
  EXPECT_EQ(BaseFinetuning::filter_params(backbone, true, false).size(), 2u);
  EXPECT_EQ(net.bn_options()->momentum(), c10::optional<double>(0.1));

  f.freeze(backbone, /*train_bn=*/false);
  EXPECT_FALSE(net.backbone[1]->as<torch::nn::BatchNorm1d>()->weight.requires_grad());
  EXPECT_EQ(net.bn_options()->momentum(), c10::optional<double>(0.0));
  // Frozen BatchNorm in training: batch statistics, running ones untouched (PyTorch's
  // track_running_stats=False), though libtorch counts the batch.
  auto& bn = *net.backbone[1]->as<torch::nn::BatchNorm1d>();
  const auto mean = bn.running_mean.clone();
  net.train();
  net.backbone->forward(torch::randn({16, 8}) + 3);
  EXPECT_TRUE(torch::equal(bn.running_mean, mean));
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);
  f.make_trainable(backbone);
  EXPECT_EQ(net.bn_options()->momentum(), c10::optional<double>(0.1));
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 0);  // as when it was frozen
  EXPECT_EQ(BaseFinetuning::filter_params(backbone, true, false).size(), 0u);

  // A new group at the first group's rate / initial_denom_lr, or at the given rate.
  f.freeze(backbone);
  torch::optim::SGD opt(std::vector<torch::Tensor>{net.head->weight, net.head->bias},
                        torch::optim::SGDOptions(0.3).momentum(0.9));
  f.unfreeze_and_add_param_group(backbone, opt, c10::nullopt, 4.0);
  ASSERT_EQ(opt.param_groups().size(), 2u);
  EXPECT_EQ(opt.param_groups()[1].params().size(), 4u);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].options().get_lr(), 0.3 / 4.0);
  EXPECT_DOUBLE_EQ(
      static_cast<torch::optim::SGDOptions&>(opt.param_groups()[1].options()).momentum(), 0.9);
  // A frozen layer the optimizer holds already (configure_optimizers took every parameter):
  // nothing added, and a warning says why. Unfreezing layers that trained all along adds
  // nothing either, silently (BatchNorm layers that freeze kept trainable).
  f.freeze(*net.head);
  const auto lines =
      volt_test::capture_logs([&] { f.unfreeze_and_add_param_group(*net.head, opt, 0.5); });
  EXPECT_EQ(opt.param_groups().size(), 2u);
  EXPECT_TRUE(net.head->weight.requires_grad());
  EXPECT_TRUE(has(lines, "2 of the 2 parameters to unfreeze are already in a param group"));
  const auto quiet_lines =
      volt_test::capture_logs([&] { f.unfreeze_and_add_param_group(*net.head, opt, 0.5); });
  EXPECT_EQ(opt.param_groups().size(), 2u);
  EXPECT_FALSE(has(quiet_lines, "already in a param group"));
  EXPECT_TRUE(
      has(error_of<volt::ConfigError>([&] { f.unfreeze_and_add_param_group(backbone, opt, -1.0); }),
          "[BaseFinetuning] lr=-1 for the unfrozen param group must be >= 0"));
  EXPECT_TRUE(has(error_of<volt::ConfigError>(
                      [&] { f.unfreeze_and_add_param_group(backbone, opt, c10::nullopt, 0.0); }),
                  "initial_denom_lr=0 must be positive and finite"));
}

TEST(BackboneFinetuning, RefusesBadOptionsAMissingBackboneAndDeepSpeed) {
  const auto bad = [](const BackboneFinetuningOptions& o) {
    return error_of<volt::ConfigError>([&] {
      BackboneFinetuning b(o);
      (void)b;
    });
  };
  EXPECT_TRUE(has(bad(BackboneFinetuningOptions().unfreeze_backbone_at_epoch(-1)),
                  "[BackboneFinetuning] unfreeze_backbone_at_epoch=-1 must be >= 0"));
  EXPECT_TRUE(has(bad(BackboneFinetuningOptions().backbone_initial_ratio_lr(-0.1)),
                  "backbone_initial_ratio_lr=-0.1 must be >= 0 and finite"));
  EXPECT_TRUE(has(bad(BackboneFinetuningOptions().backbone_initial_lr(-0.5)),
                  "backbone_initial_lr=-0.5 must be >= 0 and finite"));
  // Zero is a rate (Lightning's checks none): the backbone unfreezes and stays still.
  EXPECT_EQ(bad(BackboneFinetuningOptions().backbone_initial_ratio_lr(0)), "");
  EXPECT_EQ(bad(BackboneFinetuningOptions().backbone_initial_lr(0.0)), "");
  EXPECT_TRUE(has(bad(BackboneFinetuningOptions().initial_denom_lr(0)),
                  "initial_denom_lr=0 must be positive and finite"));
  EXPECT_TRUE(has(bad(BackboneFinetuningOptions().lambda_func(nullptr)), "lambda_func is empty"));
  EXPECT_TRUE(has(bad(BackboneFinetuningOptions().rounding(-1)), "rounding=-1 must be between"));
  EXPECT_TRUE(has(bad(BackboneFinetuningOptions().backbone("")), "backbone is empty"));

  volt_test::TempDir dir;
  volt_test::TinyClassifier tiny;
  EXPECT_TRUE(has(error_of<volt::ConfigError>([&] {
                    volt::Trainer(quiet(dir.path).max_epochs(1).callbacks(
                                      {std::make_shared<BackboneFinetuning>()}))
                        .fit(tiny, volt_test::loader(volt_test::blobs(32)));
                  }),
                  "[BackboneFinetuning] the module has no submodule 'backbone' (its submodules: "
                  "fc1, drop, fc2); register the part to freeze as \"backbone\""));
  // A dotted path reaches a nested submodule.
  struct Outer : volt::Module {
    explicit Outer(std::shared_ptr<FinetuneNet> n) : inner(register_module("inner", n)) {}
    torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
      return inner->training_step(b, i);
    }
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      return inner->configure_optimizers();
    }
    std::shared_ptr<FinetuneNet> inner;
  };
  auto inner = std::make_shared<FinetuneNet>();
  Outer outer(inner);
  BackboneFinetuning nested(BackboneFinetuningOptions().backbone("inner.backbone"));
  nested.freeze_before_training(outer);
  EXPECT_FALSE(inner->backbone[0]->as<torch::nn::Linear>()->weight.requires_grad());
  EXPECT_TRUE(inner->head->weight.requires_grad());

  if (!volt_test::gloo()) return;
  // A one-process DeepSpeed fit on the CPU makes a Gloo group (not in the CUDA wheels).
  FinetuneNet model;
  EXPECT_TRUE(has(error_of<volt::ConfigError>([&] {
                    volt::Trainer(quiet(dir.path)
                                      .max_epochs(1)
                                      .strategy("deepspeed_stage_2")
                                      .callbacks({std::make_shared<BackboneFinetuning>()}))
                        .fit(model, volt_test::loader(volt_test::blobs(32)));
                  }),
                  "[BackboneFinetuning] does not work with the deepspeed strategy"));
}

// Lightning's BackboneFinetuning does nothing for a fit that starts past
// unfreeze_backbone_at_epoch without its state (its `==` never matches); volt unfreezes at the
// first epoch of that fit. When the optimizer already holds the backbone (configure_optimizers
// gave it every parameter) no group is added, and the head's rate is left alone where Lightning
// would set the last group's (the head's) to the backbone's. A damaged state is refused.
TEST(BackboneFinetuning, LateStartsUnfreezeAndAHeldBackboneLeavesTheHeadsRate) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;  // its optimizer takes every parameter
  const auto data = volt_test::blobs(64);
  volt::Trainer t(
      quiet(dir.path).max_epochs(1).callbacks({std::make_shared<SaveAt>(0, -1, dir / "e0.ckpt")}));
  t.fit(model, volt_test::loader(data));                // no finetuning in this fit
  const auto fc1 = model.fc1->weight.detach().clone();  // as in e0.ckpt, its last state
  volt_test::TinyClassifier late;
  auto finetuning = std::make_shared<BackboneFinetuning>(
      BackboneFinetuningOptions().unfreeze_backbone_at_epoch(0).backbone("fc1"));
  auto rates = std::make_shared<Rates>();
  rates->epochs.resize(1);
  volt::Trainer r(quiet(dir.path).max_epochs(3).callbacks({finetuning, rates}));
  const auto lines = volt_test::capture_logs(
      [&] { r.fit(late, volt_test::loader(data), c10::nullopt, dir / "e0.ckpt"); });
  EXPECT_TRUE(has(lines, "2 of the 2 parameters to unfreeze are already in a param group"));
  ASSERT_EQ(rates->epochs.size(), 3u);
  EXPECT_EQ(rates->epochs[1], std::vector<double>{0.1});
  EXPECT_EQ(rates->epochs[2], std::vector<double>{0.1});
  ASSERT_TRUE(finetuning->backbone_lr().has_value());
  EXPECT_DOUBLE_EQ(*finetuning->backbone_lr(), 0.02);  // 0.01 at epoch 1, twice that at 2
  EXPECT_FALSE(torch::equal(late.fc1->weight, fc1));   // it trained, in the head's group

  torch::serialize::OutputArchive out;
  out.write("finetuned_epoch", c10::IValue(int64_t{3}));
  out.write("frozen_params", c10::IValue(c10::List<std::string>()));
  out.write("frozen_batch_norms", c10::IValue(c10::List<std::string>({"x"})));
  out.write("frozen_batch_norm_momenta", c10::IValue(c10::List<double>()));
  out.write("frozen_batch_norm_batches", c10::IValue(c10::List<int64_t>()));
  out.write("optimizers", c10::IValue(int64_t{0}));
  out.write("previous_backbone_lr", c10::IValue(0.1));
  auto in = volt_test::reread(out);
  EXPECT_TRUE(has(error_of<volt::CheckpointError>([&] { BackboneFinetuning().load_state(in); }),
                  "[BaseFinetuning] the checkpoint lists 1 frozen BatchNorm layers but 0 momenta"));
}

}  // namespace
