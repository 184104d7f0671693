// ActivationCheckpointing: a fit with it equals a fit without it (losses and weights, bitwise,
// dropout included), it wraps before the first forward, and its YAML name builds it.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "requires.h"
#include "tiny.h"
#include "volt/callbacks/activation_checkpointing.h"
#include "volt/cli/cli.h"
#include "volt/nn/checkpoint.h"
#include "volt/strategies/deepspeed.h"

namespace {

namespace nn = torch::nn;

/// A classifier whose body is a Sequential (its entries can be checkpointed by name).
class SeqClassifier : public volt::Module {
 public:
  SeqClassifier() {
    torch::manual_seed(0);
    body = register_module("body", nn::Sequential(nn::Linear(8, 32), nn::ReLU(), nn::Dropout(0.3),
                                                  nn::Linear(32, 32), nn::Tanh()));
    head = register_module("head", nn::Linear(32, 2));
  }
  at::Tensor forward(const at::Tensor& x) { return head(body->forward(x)); }
  at::Tensor training_step(const volt::Batch& b, int64_t) override {
    forward_calls_checkpointed.push_back(body->forward(b.input).grad_fn()->name());
    auto loss = torch::cross_entropy_loss(forward(b.input), b.target);
    log("train_loss", loss);
    return loss;
  }
  void validation_step(const volt::Batch& b, int64_t) override {
    log("val_loss", torch::cross_entropy_loss(forward(b.input), b.target));
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {volt::OptimizerConfig(std::make_shared<torch::optim::SGD>(
        parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)))};
  }
  at::Tensor flat_params() {
    std::vector<at::Tensor> v;
    for (auto& p : parameters()) v.push_back(p.detach().reshape({-1}));
    return torch::cat(v);
  }
  nn::Sequential body{nullptr};
  nn::Linear head{nullptr};
  std::vector<std::string> forward_calls_checkpointed;  // grad_fn of the body's output per step
};

struct Fitted {
  std::vector<double> losses;
  at::Tensor params;
  std::vector<std::string> grad_fns;
};

Fitted fit(std::vector<std::shared_ptr<volt::Callback>> callbacks, SeqClassifier& model,
           const volt::Spec<volt::Precision>& precision = "32-true") {
  volt_test::TempDir dir;
  auto mem = std::make_shared<volt_test::MemoryLogger>();
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(2)
                            .log_every_n_steps(1)
                            .precision(precision)
                            .loggers({mem})
                            .callbacks(std::move(callbacks)));
  trainer.fit(model, volt_test::loader(volt_test::blobs(96)),
              volt_test::loader(volt_test::blobs(32, 8, 1), 16, false));
  Fitted f;
  for (const auto& [step, m] : mem->with("train_loss")) f.losses.push_back(m.at("train_loss"));
  f.params = model.flat_params();
  f.grad_fns = model.forward_calls_checkpointed;
  return f;
}

TEST(ActivationCheckpointingCallback, FitEqualsFitWithoutIt) {
  SeqClassifier plain_model, ckpt_model;
  const Fitted plain = fit({}, plain_model);
  auto cb = std::make_shared<volt::ActivationCheckpointing>(
      volt::ActivationCheckpointingOptions({"body.*"}));
  const Fitted ckpt = fit({cb}, ckpt_model);
  ASSERT_EQ(plain.losses.size(), 12u);  // 2 epochs x 6 steps
  EXPECT_EQ(plain.losses, ckpt.losses);
  EXPECT_TRUE(torch::equal(plain.params, ckpt.params));
  EXPECT_EQ(volt::checkpointed_modules(ckpt_model),
            (std::vector<std::string>{"body.0", "body.1", "body.2", "body.3", "body.4"}));
  // Checkpointed from the first step on (the wrap happened in on_fit_start).
  ASSERT_EQ(ckpt.grad_fns.size(), 12u);
  for (const auto& n : ckpt.grad_fns) EXPECT_NE(n.find("CheckpointNode"), std::string::npos) << n;
  for (const auto& n : plain.grad_fns) EXPECT_EQ(n.find("CheckpointNode"), std::string::npos) << n;
  // Parameter names (what checkpoints are keyed by) did not change.
  EXPECT_EQ(plain_model.named_parameters().keys(), ckpt_model.named_parameters().keys());
}

TEST(ActivationCheckpointingCallback, Bf16MixedFitEqualsFitWithoutIt) {
  // The Trainer's autocast region has ended when backward recomputes: the callback's
  // checkpoints replay it (the fp32 recomputation would give other losses after step 1).
  // The CPU policy is off, so the Linears really compute in bf16 (it keeps them in fp32 where
  // its probe finds bf16 slower, and the test would then compare fp32 fits).
  const auto bf16 = [] {
    return std::make_shared<volt::MixedPrecision>(
        volt::MixedPrecisionOptions().cpu_policy(false).read_env_lists(false));
  };
  SeqClassifier plain_model, ckpt_model, fp32_model;
  const Fitted plain = fit({}, plain_model, bf16());
  const Fitted ckpt = fit({std::make_shared<volt::ActivationCheckpointing>(
                              volt::ActivationCheckpointingOptions({"body.*"}))},
                          ckpt_model, bf16());
  ASSERT_EQ(plain.losses.size(), 12u);
  EXPECT_FALSE(torch::equal(plain.params, fit({}, fp32_model).params));  // bf16 did compute
  EXPECT_EQ(plain.losses, ckpt.losses);
  EXPECT_TRUE(torch::equal(plain.params, ckpt.params));
}

TEST(ActivationCheckpointingCallback, ModuleOutsideASequentialFailsTheFit) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;  // fc1, drop, fc2 are typed members
  auto cb = std::make_shared<volt::ActivationCheckpointing>(
      volt::ActivationCheckpointingOptions({"fc1"}));
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1).callbacks({cb}));
  try {
    trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
    FAIL() << "fit accepted";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not an entry of a torch::nn::Sequential"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(volt::ActivationCheckpointing(volt::ActivationCheckpointingOptions({})),
               volt::ConfigError);
}

class BlobsData : public volt::DataModule {
 public:
  void setup(volt::Stage) override { train_ = volt_test::blobs(64, 8, 1); }
  volt::DataLoader train_dataloader() override { return volt_test::loader(train_, 16); }

 private:
  std::shared_ptr<volt::TensorDataset> train_;
};

TEST(ActivationCheckpointingCallback, BuiltFromYaml) {
  volt::Registry reg = volt::registry();
  reg.models.add("Seq", "Sequential-bodied classifier", volt::Params(),
                 [](const volt::Args&) -> std::shared_ptr<volt::Module> {
                   return std::make_shared<SeqClassifier>();
                 });
  reg.data_modules.add("Blobs", "2-class blobs", volt::Params(),
                       [](const volt::Args&) -> std::shared_ptr<volt::DataModule> {
                         return std::make_shared<BlobsData>();
                       });
  volt_test::TempDir dir;
  auto run = [&](const std::string& modules, std::string& err) {
    {
      std::ofstream f(dir.path + "/run.yaml");
      f << "model: Seq\ndata: Blobs\ntrainer:\n  max_epochs: 1\n  default_root_dir: " << dir.path
        << "\n  enable_progress_bar: false\n  callbacks:\n"
        << "    - class_path: ActivationCheckpointing\n      init_args:\n        modules: "
        << modules << "\n        cpu_checkpointing: true\n";
    }
    const std::string cfg = dir.path + "/run.yaml";
    const char* argv[] = {"volt", "fit", "--config", cfg.c_str()};
    std::ostringstream out, errs;
    volt::CliOptions o;
    o.out = &out;
    o.err = &errs;
    o.registry = &reg;
    const int code = volt::run_cli(4, argv, o);
    err = errs.str();
    return code;
  };
  std::string err;
  EXPECT_EQ(run("[\"body.*\"]", err), volt::kCliOk) << err;
  // The model is known only once the run started; a pattern matching nothing is bad config all
  // the same: exit 2 (1 before session 34), with the callback's message.
  EXPECT_EQ(run("[\"head\"]", err), volt::kCliBadUsage) << err;
  EXPECT_NE(err.find("[wrap_activation_checkpointing] \"head\""), std::string::npos) << err;
}

// Records checkpoint_defaults() while the run trains.
class DefaultsProbe : public volt::Callback {
 public:
  std::string state_key() const override { return "DefaultsProbe"; }
  void on_train_start(volt::RunContext&, volt::Module&) override {
    seen = volt::checkpoint_defaults().cpu_checkpointing();
  }
  bool seen = false;
};

TEST(ActivationCheckpointingCallback, DeepSpeedCpuCheckpointingHoldsForTheRunOnly) {
  VOLT_REQUIRE_GLOO();
  auto make = [](const volt::DeepSpeedStrategyOptions& o) {
    return std::make_shared<volt::DeepSpeedStrategy>(o, std::make_shared<volt::CpuAccelerator>(),
                                                     volt::registry().precisions.create("32-true"),
                                                     1);
  };
  // The reference's strategy option, and the JSON config's section.
  EXPECT_TRUE(make(volt::DeepSpeedStrategyOptions().cpu_checkpointing(true))
                  ->deepspeed_options()
                  .cpu_checkpointing());
  EXPECT_TRUE(make(volt::DeepSpeedStrategyOptions().config(
                       R"({"zero_optimization": {"stage": 3},
                           "activation_checkpointing": {"cpu_checkpointing": true}})"))
                  ->deepspeed_options()
                  .cpu_checkpointing());
  EXPECT_FALSE(make(volt::DeepSpeedStrategyOptions().cpu_checkpointing(true).config(
                        R"({"zero_optimization": {"stage": 3}})"))
                   ->deepspeed_options()
                   .cpu_checkpointing());  // the JSON is the whole configuration

  volt_test::TempDir dir;
  SeqClassifier model;
  auto probe = std::make_shared<DefaultsProbe>();
  auto cb = std::make_shared<volt::ActivationCheckpointing>(
      volt::ActivationCheckpointingOptions({"body.*"}));
  volt::Trainer trainer(
      volt_test::quiet(dir.path)
          .max_epochs(1)
          .devices(1)
          .callbacks({cb, probe})
          .strategy(make(volt::DeepSpeedStrategyOptions().stage(3).cpu_checkpointing(true))));
  trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
  EXPECT_TRUE(probe->seen);
  EXPECT_FALSE(volt::checkpoint_defaults().cpu_checkpointing());  // restored at teardown
  EXPECT_EQ(volt::checkpointed_modules(model).size(), 5u);
}

}  // namespace
