// ModelPruning: fits against Lightning's callback around torch.nn.utils.prune in PyTorch
// (tools/model_pruning_reference.py), exact resume, the log lines, and every refusal.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "build_paths.h"
#include "error_text.h"
#include "log_capture.h"
#include "requires.h"
#include "save_at.h"
#include "tiny.h"

namespace {

using json = nlohmann::json;
using volt::ModelPruning;
using volt::ModelPruningOptions;
using volt::PruningAmount;
using volt_test::error_of;
using volt_test::has;
using volt_test::quiet;

/// The reference's Net: Linear(8, 16), ReLU, Linear(16, 2); SGD (momentum 0.9, weight decay
/// 1e-3) or Adam.
class PruneNet : public volt::Module {
 public:
  PruneNet(double lr, bool adam) : lr_(lr), adam_(adam) {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2->forward(torch::relu(fc1->forward(x)));
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    return torch::cross_entropy_loss(forward(b.input), b.target);
  }
  void validation_step(const volt::Batch& b, int64_t) override {
    log("val_loss", torch::cross_entropy_loss(forward(b.input), b.target));
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    if (adam_) {
      return {volt::OptimizerConfig(
          std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(lr_)))};
    }
    return {volt::OptimizerConfig(std::make_shared<torch::optim::SGD>(
        parameters(), torch::optim::SGDOptions(lr_).momentum(0.9).weight_decay(1e-3)))};
  }
  std::map<std::string, torch::Tensor> state() {
    std::map<std::string, torch::Tensor> out;
    for (const auto& p : named_parameters(true)) out[p.key()] = p.value().detach().clone();
    return out;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};

 private:
  double lr_;
  bool adam_;
};

json reference() {
  std::ifstream in(volt_test::source_dir() + "/tests/callbacks/data/model_pruning_reference.json");
  EXPECT_TRUE(in.good()) << "run tools/model_pruning_reference.py";
  return json::parse(in);
}

ModelPruningOptions options_of(const json& c) {
  ModelPruningOptions o(c["pruning_fn"].get<std::string>());
  o.parameter_names(c["parameter_names"].get<std::vector<std::string>>())
      .use_global_unstructured(c["use_global_unstructured"].get<bool>())
      .use_lottery_ticket_hypothesis(c["lottery"].get<bool>())
      .resample_parameters(c["resample"].get<bool>());
  if (c.contains("pruning_dim")) o.pruning_dim(c["pruning_dim"].get<int64_t>());
  if (c.contains("pruning_norm")) o.pruning_norm(c["pruning_norm"].get<double>());
  // The reference's amounts by epoch (the last one from then on); an int is a count.
  std::vector<PruningAmount> amounts;
  for (const json& a : c["amounts"]) {
    amounts.push_back(a.is_number_integer() ? PruningAmount::count(a.get<int64_t>())
                                            : PruningAmount::fraction(a.get<double>()));
  }
  o.amount_fn([amounts](int64_t epoch) {
    return amounts[std::min<size_t>(static_cast<size_t>(epoch), amounts.size() - 1)];
  });
  return o;
}

struct CaseSetup {
  std::shared_ptr<PruneNet> model;
  std::shared_ptr<volt::TensorDataset> train_data, val_data;
  volt::DataLoader train(int64_t batch) const {
    return volt_test::loader(train_data, batch, /*shuffle=*/false);
  }
  volt::DataLoader val() const { return volt_test::loader(val_data, 32, false); }
};

CaseSetup setup_of(const json& entry) {
  const json& c = entry["case"];
  CaseSetup s;
  s.model = std::make_shared<PruneNet>(c["lr"].get<double>(), c["optimizer"] == "adam");
  torch::NoGradGuard no_grad;
  for (auto& p : s.model->named_parameters(true)) {
    const auto values = entry["init"].at(p.key()).get<std::vector<double>>();
    p.value().copy_(torch::tensor(values, torch::kDouble).reshape(p.value().sizes()));
  }
  auto tensor = [&](const char* key, int64_t rows) {
    return torch::tensor(entry[key].get<std::vector<double>>(), torch::kDouble)
        .to(torch::kFloat)
        .reshape({rows, 8});
  };
  const auto x = tensor("x", c["samples"].get<int64_t>()), xv = tensor("xv", 32);
  s.train_data = std::make_shared<volt::TensorDataset>(x, (x.sum(1) > 0).to(torch::kLong));
  s.val_data = std::make_shared<volt::TensorDataset>(xv, (xv.sum(1) > 0).to(torch::kLong));
  return s;
}

/// The zeros of each pruned parameter's mask after each epoch's pruning.
class Zeros : public volt::Callback {
 public:
  explicit Zeros(const ModelPruning& pruning) : pruning_(pruning) {}
  std::string state_key() const override { return "Zeros"; }
  void on_train_epoch_end(volt::RunContext&, volt::Module&) override {
    std::vector<int64_t> row;
    for (const auto& [layer, name] : pruning_.parameters_to_prune()) {
      auto it = pruning_.masks().find(layer + "." + name);
      row.push_back(it == pruning_.masks().end() ? 0 : (it->second == 0).sum().item<int64_t>());
    }
    epochs.push_back(row);
  }
  std::vector<std::vector<int64_t>> epochs;

 private:
  const ModelPruning& pruning_;
};

volt::TrainerOptions unseeded(const std::string& root, int64_t epochs) {
  // The random methods draw from torch's generator, which the test seeds as the reference does.
  return quiet(root).seed(c10::nullopt).max_epochs(epochs);
}

TEST(ModelPruning, FitsMatchLightningsCallbackAroundPyTorchsPrune) {
  const json ref = reference();
  ASSERT_EQ(ref["cases"].size(), 3u);
  for (const json& entry : ref["cases"]) {
    const json& c = entry["case"];
    const std::string name = c["name"].get<std::string>();
    volt_test::TempDir dir;
    CaseSetup s = setup_of(entry);
    auto pruning = std::make_shared<ModelPruning>(options_of(c));
    auto zeros = std::make_shared<Zeros>(*pruning);
    auto opts = unseeded(dir.path, c["epochs"].get<int64_t>()).callbacks({pruning, zeros});
    if (c.contains("clip")) opts.gradient_clip_val(c["clip"].get<double>());
    volt::Trainer t(opts);
    torch::manual_seed(c["fit_seed"].get<uint64_t>());
    t.fit(*s.model, s.train(c["batch"].get<int64_t>()), s.val());
    // The parameters pruned, in Lightning's order (weights first), and each epoch's zeros.
    std::vector<std::string> keys;
    for (const auto& [layer, param] : pruning->parameters_to_prune()) {
      keys.push_back(layer + "." + param);
    }
    EXPECT_EQ(keys, entry["keys"].get<std::vector<std::string>>()) << name;
    EXPECT_EQ(zeros->epochs, entry["zeros"].get<std::vector<std::vector<int64_t>>>()) << name;
    // make_pruning_permanent (the default) let go of the masks at the end of training.
    EXPECT_TRUE(pruning->masks().empty()) << name;
    // The weights PyTorch ended with: the same zeros exactly, the rest to float rounding.
    for (const auto& [key, got] : s.model->state()) {
      const auto values = entry["final"].at(key).get<std::vector<double>>();
      const torch::Tensor want = torch::tensor(values, torch::kDouble).reshape(got.sizes());
      EXPECT_TRUE(torch::equal(got == 0, want == 0)) << name << ": " << key;
      EXPECT_TRUE(torch::allclose(got.to(torch::kDouble), want, 1e-5, 1e-6))
          << name << ": " << key << " max diff "
          << (got.to(torch::kDouble) - want).abs().max().item<double>();
    }
  }
}

// On a GPU: the weights, their masks and the ranking live on the device; the deterministic
// methods prune the same entries as PyTorch's prune on the CPU and end within float rounding
// (the random ones draw from the GPU's generator, so they cannot equal the CPU reference).
TEST(ModelPruningCuda, DeterministicMethodsMatchTheCpuReferenceOnTheGpu) {
  VOLT_REQUIRE_CUDA();
  const json ref = reference();
  int compared = 0;
  for (const json& entry : ref["cases"]) {
    const json& c = entry["case"];
    const std::string name = c["name"].get<std::string>();
    if (c["pruning_fn"].get<std::string>().rfind("random", 0) == 0) continue;
    ++compared;
    volt_test::TempDir dir;
    CaseSetup s = setup_of(entry);
    auto pruning = std::make_shared<ModelPruning>(options_of(c));
    auto zeros = std::make_shared<Zeros>(*pruning);
    auto opts = unseeded(dir.path, c["epochs"].get<int64_t>())
                    .accelerator("cuda")
                    .callbacks({pruning, zeros});
    if (c.contains("clip")) opts.gradient_clip_val(c["clip"].get<double>());
    volt::Trainer t(opts);
    torch::manual_seed(c["fit_seed"].get<uint64_t>());
    t.fit(*s.model, s.train(c["batch"].get<int64_t>()), s.val());
    EXPECT_EQ(zeros->epochs, entry["zeros"].get<std::vector<std::vector<int64_t>>>()) << name;
    for (const auto& [key, got] : s.model->state()) {
      const auto values = entry["final"].at(key).get<std::vector<double>>();
      const torch::Tensor want = torch::tensor(values, torch::kDouble).reshape(got.sizes());
      const torch::Tensor have = got.cpu().to(torch::kDouble);
      EXPECT_TRUE(torch::equal(have == 0, want == 0)) << name << ": " << key;
      EXPECT_TRUE(torch::allclose(have, want, 1e-4, 1e-5))
          << name << ": " << key << " max diff " << (have - want).abs().max().item<double>();
    }
  }
  EXPECT_EQ(compared, 2);
}

TEST(ModelPruning, PrunedWeightsStayZeroThroughMomentumAndTheMasksCanBeKept) {
  // After the first pruning, every batch ends with the pruned weights at zero although SGD's
  // momentum and weight decay would move them; with make_pruning_permanent off the masks stay.
  volt_test::TempDir dir;
  torch::manual_seed(0);
  PruneNet model(0.1, false);
  auto pruning = std::make_shared<ModelPruning>(ModelPruningOptions("l1_unstructured")
                                                    .amount(PruningAmount::fraction(0.6))
                                                    .use_lottery_ticket_hypothesis(false)
                                                    .make_pruning_permanent(false));
  struct Watch : volt::Callback {
    explicit Watch(const ModelPruning& p) : p_(p) {}
    std::string state_key() const override { return "Watch"; }
    void on_train_batch_end(volt::RunContext&, volt::Module& m, const volt::Batch&,
                            int64_t) override {
      const auto params = m.named_parameters(true);
      for (const auto& [key, mask] : p_.masks()) {
        const auto* param = params.find(key);
        ASSERT_NE(param, nullptr) << key;
        checked += (param->masked_select(mask == 0) != 0).sum().item<int64_t>() == 0;
        failures += (param->masked_select(mask == 0) != 0).sum().item<int64_t>() != 0;
      }
    }
    const ModelPruning& p_;
    int64_t checked = 0, failures = 0;
  };
  auto watch = std::make_shared<Watch>(*pruning);
  volt::Trainer t(quiet(dir.path).max_epochs(3).callbacks({pruning, watch}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)));
  EXPECT_GT(watch->checked, 0);
  EXPECT_EQ(watch->failures, 0);
  ASSERT_EQ(pruning->masks().size(), 4u);
  // 60% of what was left each epoch: 178 -> 71 -> 28 -> 11 left.
  int64_t left = 0;
  for (const auto& [key, mask] : pruning->masks()) left += mask.sum().item<int64_t>();
  EXPECT_EQ(left, 11);
}

// A layer registered under two names is one tensor and is pruned once: local random pruning
// drew a mask per name and applied both (amount 0.5 left about 25% of the shared weight).
TEST(ModelPruning, ALayerRegisteredTwiceIsPrunedOnce) {
  struct Aliased : PruneNet {
    Aliased() : PruneNet(0.1, false) { register_module("fc1_again", fc1); }
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      return {volt::OptimizerConfig(std::make_shared<torch::optim::SGD>(
          volt::distinct_parameters(*this), torch::optim::SGDOptions(0.1)))};
    }
  };
  volt_test::TempDir dir;
  torch::manual_seed(0);
  Aliased model;
  auto pruning = std::make_shared<ModelPruning>(ModelPruningOptions("random_unstructured")
                                                    .use_global_unstructured(false)
                                                    .parameter_names({"weight"})
                                                    .use_lottery_ticket_hypothesis(false)
                                                    .make_pruning_permanent(false));
  volt::Trainer t(quiet(dir.path).max_epochs(1).callbacks({pruning}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)));
  ASSERT_EQ(pruning->masks().size(), 2u);  // fc1.weight and fc2.weight, not fc1_again.weight
  EXPECT_EQ((model.fc1->weight == 0).sum().item<int64_t>(), 64);  // half of 128
  EXPECT_EQ((model.fc2->weight == 0).sum().item<int64_t>(), 16);  // half of 32
}

// A fit resumed from a checkpoint written before the first pruning, or mid-epoch after it (the
// masks and the lottery ticket's initial values then come from the checkpoint), ends bit for bit
// as the uninterrupted one.
TEST(ModelPruning, AResumeBeforeOrAfterAPruningIsExact) {
  const json ref = reference();
  for (const json& entry : ref["cases"]) {
    const json& c = entry["case"];
    const std::string name = c["name"].get<std::string>();
    const int64_t epochs = c["epochs"].get<int64_t>();
    volt_test::TempDir dir;
    CaseSetup whole = setup_of(entry);
    volt::Trainer t(
        unseeded(dir.path, epochs)
            .callbacks({std::make_shared<ModelPruning>(options_of(c)),
                        std::make_shared<volt_test::SaveAt>(0, 1, dir / "before.ckpt"),
                        std::make_shared<volt_test::SaveAt>(1, 2, dir / "after.ckpt")}));
    torch::manual_seed(c["fit_seed"].get<uint64_t>());
    t.fit(*whole.model, whole.train(c["batch"].get<int64_t>()), whole.val());
    for (const std::string ckpt : {"before.ckpt", "after.ckpt"}) {
      CaseSetup resumed = setup_of(entry);
      torch::manual_seed(99);  // the checkpoint's generator state replaces this
      volt::Trainer r(
          unseeded(dir.path, epochs).callbacks({std::make_shared<ModelPruning>(options_of(c))}));
      r.fit(*resumed.model, resumed.train(c["batch"].get<int64_t>()), resumed.val(), dir / ckpt);
      const auto got = resumed.model->state();
      for (const auto& [key, value] : whole.model->state()) {
        EXPECT_TRUE(torch::equal(got.at(key), value)) << name << " from " << ckpt << ": " << key;
      }
    }
  }
}

TEST(ModelPruning, LogsLightningsSparsityLines) {
  volt_test::TempDir dir;
  torch::manual_seed(0);
  PruneNet model(0.1, false);
  auto pruning = std::make_shared<ModelPruning>(
      ModelPruningOptions("l1_unstructured").parameter_names({"weight"}).verbose(2));
  volt::Trainer t(quiet(dir.path).max_epochs(2).callbacks({pruning}));
  const auto lines =
      volt_test::capture_logs([&] { t.fit(model, volt_test::loader(volt_test::blobs(64))); });
  // 128 + 32 weights: half of them, then half of what is left.
  EXPECT_TRUE(has(lines, "Applied `L1Unstructured`. Pruned: 0/160 (0.00%) -> 80/160 (50.00%)"));
  EXPECT_TRUE(has(lines, "Pruned: 80/160 (50.00%) -> 120/160 (75.00%)"));
  EXPECT_TRUE(has(lines, "Applied `L1Unstructured` to `fc1.weight` with amount=0.5. Pruned: "));
  // The default parameters: every layer's weight (parameter_names), nothing else.
  EXPECT_EQ(pruning->parameters_to_prune(),
            (std::vector<volt::PrunedParameter>{{"fc1", "weight"}, {"fc2", "weight"}}));
}

TEST(ModelPruning, RefusesBadOptionsWithTheFix) {
  auto bad = [](const std::function<void()>& fn, const std::string& phrase) {
    const std::string e = error_of<volt::ConfigError>(fn);
    EXPECT_TRUE(has(e, phrase)) << "got: " << e;
  };
  bad([] { ModelPruning(ModelPruningOptions("l2_unstructured")); },
      "pruning_fn 'l2_unstructured' is not one of l1_unstructured, random_unstructured");
  bad([] { ModelPruning(ModelPruningOptions("ln_structured").use_global_unstructured(false)); },
      "ln_structured needs pruning_dim");
  bad([] { ModelPruning(ModelPruningOptions("random_structured").pruning_dim(0)); },
      "use_global_unstructured=true takes unstructured methods only");
  bad(
      [] {
        ModelPruning(
            ModelPruningOptions("ln_structured").pruning_dim(0).use_global_unstructured(false));
      },
      "ln_structured needs pruning_norm");
  bad([] { ModelPruning(ModelPruningOptions("l1_unstructured").pruning_dim(0)); },
      "pruning_dim is for the structured methods (ln_structured, random_structured); "
      "l1_unstructured does not use it: remove it.");
  bad(
      [] {
        ModelPruning(ModelPruningOptions("random_structured")
                         .pruning_dim(0)
                         .pruning_norm(2)
                         .use_global_unstructured(false));
      },
      "pruning_norm is for ln_structured; random_structured does not use it");
  bad([] { ModelPruning(ModelPruningOptions("l1_unstructured").parameter_names({"gamma"})); },
      "parameter_names holds 'gamma'");
  bad([] { ModelPruning(ModelPruningOptions("l1_unstructured").verbose(3)); },
      "verbose=3 is not 0, 1 or 2");
  bad([] { PruningAmount::fraction(1.5); }, "amount fraction 1.5 is not in [0, 1]");
  bad([] { PruningAmount::count(-1); }, "amount count -1 is negative");
}

TEST(ModelPruning, RefusesWhatTheFitCannotPrune) {
  volt_test::TempDir dir;
  auto fit_error = [&](ModelPruningOptions o, volt::TrainerOptions t = {}) {
    PruneNet model(0.1, false);
    return error_of<volt::Error>([&] {
      volt::Trainer(quiet(dir.path)
                        .max_epochs(3)
                        .strategy(t.strategy())
                        .callbacks({std::make_shared<ModelPruning>(o)}))
          .fit(model, volt_test::loader(volt_test::blobs(64)));
    });
  };
  EXPECT_TRUE(has(fit_error(ModelPruningOptions("l1_unstructured")
                                .parameters_to_prune({{"fc3", "weight"}, {"fc1", "gain"}})),
                  "parameters_to_prune names fc3.weight, fc1.gain, which the module does not "
                  "have; its parameters are: fc1.weight fc1.bias fc2.weight fc2.bias."));
  EXPECT_TRUE(has(fit_error(ModelPruningOptions("ln_structured")
                                .pruning_dim(0)
                                .pruning_norm(1)
                                .use_global_unstructured(false)),
                  "ln_structured removes channels of tensors of 2 or more dimensions; fc1.bias "
                  "has 1: prune weights only (parameter_names=[weight])."));
  EXPECT_TRUE(has(fit_error(ModelPruningOptions("random_structured")
                                .pruning_dim(2)
                                .parameter_names({"weight"})
                                .use_global_unstructured(false)),
                  "pruning_dim=2 is not a dimension of fc1.weight (2 dimensions)"));
  // Three input columns of fc1 per epoch: the third epoch finds two left.
  const std::string count = fit_error(ModelPruningOptions("ln_structured")
                                          .pruning_dim(1)
                                          .pruning_norm(2)
                                          .parameter_names({"weight"})
                                          .amount(PruningAmount::count(3))
                                          .use_global_unstructured(false));
  EXPECT_TRUE(has(count, "amount=3 is more than the 2 unpruned channels left")) << count;
  if (volt_test::gloo()) {  // a one-process DeepSpeed fit on the CPU makes a Gloo group
    EXPECT_TRUE(has(fit_error(ModelPruningOptions("l1_unstructured"),
                              volt::TrainerOptions().strategy("deepspeed_stage_2")),
                    "does not work with DeepSpeed"));
    // Each pipeline rank holds only its stage's weights (refused before the module is split).
    EXPECT_TRUE(has(fit_error(ModelPruningOptions("l1_unstructured"),
                              volt::TrainerOptions().strategy("pipeline")),
                    "does not work with the pipeline strategy: each rank holds and trains only "
                    "its stage's weights"));
  }
  // Outside a fit.
  ModelPruning idle(ModelPruningOptions("l1_unstructured"));
  EXPECT_TRUE(
      has(error_of<volt::ValueError>([&] { idle.apply_pruning(PruningAmount::fraction(0.5)); }),
          "apply_pruning() before fit set up"));
}

// resample_parameters draws new values with each layer's own reset_parameters, norm layers'
// too (their running statistics kept), and gives a layer without one its initial values, as
// Lightning's apply_lottery_ticket_hypothesis (volt refused every layer but Linear and Conv
// before session 106).
TEST(ModelPruning, ResampleResetsKnownLayersAndGivesOthersTheirInitialValues) {
  struct Scale : torch::nn::Module {
    Scale() { weight = register_parameter("weight", torch::tensor({1.0f, 2.0f})); }
    torch::Tensor weight;
  };
  struct Net : volt::Module {
    Net() {
      fc1 = register_module("fc1", torch::nn::Linear(8, 16));
      bn = register_module("bn", torch::nn::BatchNorm1d(16));
      fc2 = register_module("fc2", torch::nn::Linear(16, 2));
      scale = register_module("scale", std::make_shared<Scale>());
    }
    torch::Tensor training_step(const volt::Batch& b, int64_t) override {
      const auto h = torch::relu(bn->forward(fc1->forward(b.input)));
      return torch::cross_entropy_loss(fc2->forward(h) * scale->weight, b.target);
    }
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      return {volt::OptimizerConfig(
          std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1)))};
    }
    torch::nn::Linear fc1{nullptr}, fc2{nullptr};
    torch::nn::BatchNorm1d bn{nullptr};
    std::shared_ptr<Scale> scale;
  };
  volt_test::TempDir dir;
  torch::manual_seed(0);
  Net net;
  const torch::Tensor fc1_initial = net.fc1->weight.detach().clone();
  volt::Trainer(quiet(dir.path).max_epochs(1).callbacks(
                    {std::make_shared<ModelPruning>(ModelPruningOptions("l1_unstructured")
                                                        .parameter_names({"weight"})
                                                        .amount(PruningAmount::fraction(0.5))
                                                        .use_global_unstructured(false)
                                                        .resample_parameters(true))}))
      .fit(net, volt_test::loader(volt_test::blobs(64)));
  // Scale has no reset_parameters: its initial values where the mask keeps them.
  const torch::Tensor w = net.scale->weight.detach();
  EXPECT_EQ(w.eq(0).sum().item<int64_t>(), 1);
  EXPECT_TRUE(torch::logical_or(w.eq(0), w.eq(torch::tensor({1.0f, 2.0f}))).all().item<bool>())
      << w;
  // BatchNorm1d's reset: weights of 1 where kept; its running statistics stay the trained ones.
  const torch::Tensor g = net.bn->weight.detach();
  EXPECT_EQ(g.eq(0).sum().item<int64_t>(), 8);
  EXPECT_TRUE(torch::logical_or(g.eq(0), g.eq(1)).all().item<bool>()) << g;
  EXPECT_GT(net.bn->running_mean.abs().sum().item<double>(), 0.0);
  EXPECT_EQ(net.bn->num_batches_tracked.item<int64_t>(), 4);
  // Linear's reset: new random values, neither the initial nor zero where kept.
  const torch::Tensor kept = net.fc1->weight.detach().ne(0);
  EXPECT_EQ(kept.sum().item<int64_t>(), 64);
  EXPECT_FALSE(net.fc1->weight.detach().masked_select(kept).equal(fc1_initial.masked_select(kept)));
  EXPECT_LE(net.fc1->weight.detach().abs().max().item<double>(), 1.0 / std::sqrt(8.0) + 1e-6);
}

}  // namespace
