// ModelSummary: Lightning's table (layout, counts, human-readable numbers) for real modules, tied
// and frozen parameters, eval-mode submodules and non-fp32 dtypes; the Trainer's default one and
// the options that replace or remove it.
#include <gtest/gtest.h>

#include <sstream>

#include "error_text.h"
#include "log_capture.h"
#include "tiny.h"

namespace {

using volt_test::TinyClassifier;

TEST(ModelSummary, HumanReadableCountsMatchLightning) {
  // Lightning's get_human_readable_count (its docstring's examples and the boundaries between
  // the one-decimal and the integer forms), trailing blanks dropped.
  const std::pair<int64_t, const char*> cases[] = {{0, "0"},
                                                   {7, "7"},
                                                   {123, "123"},
                                                   {999, "999"},
                                                   {1000, "1.0 K"},
                                                   {1234, "1.2 K"},
                                                   {1150, "1.2 K"},  // half-way counts as
                                                   {2550, "2.6 K"},  // Python rounds them
                                                   {5950000, "5.9 M"},
                                                   {1650000000, "1.7 B"},
                                                   {99949, "99.9 K"},
                                                   {99999, "100.0 K"},
                                                   {101770, "101 K"},
                                                   {999999, "999 K"},
                                                   {2000000, "2.0 M"},
                                                   {2500000, "2.5 M"},
                                                   {3000000000, "3.0 B"},
                                                   {400000000000000, "400 T"},
                                                   {5000000000000000, "5,000 T"}};
  for (const auto& [n, text] : cases) EXPECT_EQ(volt::human_readable_count(n), text) << n;
  EXPECT_NE(volt_test::error_of([] {
              volt::human_readable_count(-1);
            }).find("[ModelSummary] parameter count -1 is negative"),
            std::string::npos);
}

TEST(ModelSummary, TheTableHasLightningsLayout) {
  torch::manual_seed(0);
  TinyClassifier model;  // fc1 Linear(8, 16): 144, drop: 0, fc2 Linear(16, 2): 34
  const auto t = volt::summarize(model);
  EXPECT_EQ(t.model_type, "TinyClassifier");
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.total_params, 178);
  EXPECT_EQ(t.total_param_bytes, 178 * 4);
  EXPECT_EQ(volt::format_summary(t),
            "  | Name | Type    | Params | Mode \n"
            "-----------------------------------------\n"
            "0 | fc1  | Linear  | 144    | train\n"
            "1 | drop | Dropout | 0      | train\n"
            "2 | fc2  | Linear  | 34     | train\n"
            "-----------------------------------------\n"
            "178       Trainable params\n"
            "0         Non-trainable params\n"
            "178       Total params\n"
            "0.001     Total estimated model params size (MB)\n"
            "3         Modules in train mode\n"
            "0         Modules in eval mode");
}

// An output layer that uses a weight it is given (tied to an embedding, as in language models).
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(const at::Tensor& w) { weight = register_parameter("weight", w); }
  at::Tensor weight;
};

// A model with nesting, a tied weight, a frozen submodule, an eval-mode submodule, bf16
// parameters and a parameter of its own.
struct Nested : volt::Module {
  Nested() {
    embed = register_module("embed", torch::nn::Embedding(1000, 64));  // 64,000
    body = register_module(
        "body", torch::nn::Sequential(torch::nn::Linear(64, 64), torch::nn::ReLU(),
                                      torch::nn::LayerNorm(torch::nn::LayerNormOptions({64}))));
    head = register_module("head", std::make_shared<TiedHeadImpl>(embed->weight));
    scale = register_parameter("scale", torch::ones({10}));
    frozen = register_module("frozen", torch::nn::Linear(64, 8));  // 520
    for (auto& p : frozen->parameters()) p.requires_grad_(false);
    frozen->eval();
    body[0]->as<torch::nn::Linear>()->to(torch::kBFloat16);  // 4,160 bf16 elements
  }
  at::Tensor training_step(const volt::Batch&, int64_t) override { return {}; }
  std::vector<volt::OptimizerConfig> configure_optimizers() override { return {}; }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Sequential body{nullptr};
  std::shared_ptr<TiedHeadImpl> head;
  torch::nn::Linear frozen{nullptr};
  at::Tensor scale;
};

TEST(ModelSummary, CountsTiedFrozenAndOwnParametersOnce) {
  Nested model;
  const auto t = volt::summarize(model);
  // 64,000 (embedding = head) + 4,160 (body.0) + 128 (body.2) + 10 (scale) + 520 (frozen).
  EXPECT_EQ(t.total_params, 64000 + 4160 + 128 + 10 + 520);
  EXPECT_EQ(t.non_trainable_params, 520);
  EXPECT_EQ(t.trainable_params, t.total_params - 520);
  EXPECT_EQ(t.total_param_bytes, (64000 + 128 + 10 + 520) * 4 + 4160 * 2);
  ASSERT_EQ(t.rows.size(), 4u);
  const std::string names[] = {"embed", "body", "head", "frozen"};
  const int64_t params[] = {64000, 4160 + 128, 64000, 520};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(t.rows[i].name, names[i]);
    EXPECT_EQ(t.rows[i].params, params[i]) << names[i];
  }
  EXPECT_EQ(t.rows[1].type, "Sequential");
  EXPECT_EQ(t.rows[2].type, "TiedHead");  // the holder convention: FooImpl is shown as Foo
  EXPECT_FALSE(t.rows[3].training);
  // The rows hold the tied weight twice, so no parameter is left over for "other params"
  // (Lightning's rule: total minus the rows, when positive).
  EXPECT_EQ(t.other_params, 0);
  // embed, body, body.0-2, head, frozen: 6 in train mode, 1 in eval.
  EXPECT_EQ(t.modules_in_train_mode, 6);
  EXPECT_EQ(t.modules_in_eval_mode, 1);

  const auto all = volt::summarize(model, -1);
  std::vector<std::string> all_names;
  for (const auto& r : all.rows) all_names.push_back(r.name);
  EXPECT_EQ(all_names, (std::vector<std::string>{"embed", "body", "body.0", "body.1", "body.2",
                                                 "head", "frozen"}));
  EXPECT_EQ(all.rows[2].type, "Linear");
  EXPECT_EQ(all.rows[3].type, "ReLU");
  EXPECT_EQ(all.rows[4].type, "LayerNorm");
  EXPECT_EQ(all.total_params, t.total_params);
  EXPECT_TRUE(volt::summarize(model, 0).rows.empty());
  EXPECT_EQ(volt::summarize(model, 0).total_params, t.total_params);
}

TEST(ModelSummary, ParametersOfTheModelItselfGetAnOtherParamsRow) {
  struct Own : volt::Module {
    Own() {
      fc = register_module("fc", torch::nn::Linear(4, 4));  // 20
      bias = register_parameter("bias", torch::zeros({3000}));
    }
    at::Tensor training_step(const volt::Batch&, int64_t) override { return {}; }
    std::vector<volt::OptimizerConfig> configure_optimizers() override { return {}; }
    torch::nn::Linear fc{nullptr};
    at::Tensor bias;
  } model;
  const auto t = volt::summarize(model);
  EXPECT_EQ(t.other_params, 3000);
  const std::string text = volt::format_summary(t);
  EXPECT_NE(text.find("\n0 | fc           | Linear | 20     | train\n"
                      "  | other params | n/a    | 3.0 K  | n/a  \n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("3.0 K     Total params\n0.012     Total estimated"), std::string::npos)
      << text;
}

TEST(ModelSummary, BadDepthIsAConfigError) {
  EXPECT_NE(volt_test::error_of([] {
              volt::ModelSummary(volt::ModelSummaryOptions().max_depth(-2));
            }).find("[ModelSummary] max_depth=-2 is invalid"),
            std::string::npos);
  TinyClassifier model;
  EXPECT_THROW(volt::summarize(model, -5), volt::ConfigError);
  std::ostringstream os;
  os << volt::ModelSummaryOptions().max_depth(3);
  EXPECT_EQ(os.str(), "ModelSummaryOptions(max_depth=3)");
}

// The summary lines a fit logs.
std::vector<std::string> summaries_of_fit(volt::TrainerOptions opts) {
  volt_test::TempDir dir;
  TinyClassifier model;
  volt::Trainer trainer(opts.default_root_dir(dir.path).max_epochs(1));
  std::vector<std::string> out;
  for (const auto& line : volt_test::capture_logs(
           [&] { trainer.fit(model, volt_test::loader(volt_test::blobs(32))); })) {
    if (line.find("[ModelSummary]") != std::string::npos) out.push_back(line);
  }
  return out;
}

TEST(ModelSummary, TheTrainerLogsOneByDefaultWhenFitStarts) {
  auto lines = summaries_of_fit(volt_test::quiet("").enable_model_summary(true));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind("[volt] info: [ModelSummary] TinyClassifier\n  | Name | Type    |", 0),
            0u)
      << lines[0];
  EXPECT_NE(lines[0].find("178       Total params"), std::string::npos) << lines[0];
  // Off: no table.
  EXPECT_TRUE(summaries_of_fit(volt_test::quiet("").enable_model_summary(false)).empty());
  // The run's own ModelSummary replaces the default (one table, at its depth).
  lines = summaries_of_fit(volt_test::quiet("").enable_model_summary(true).callbacks(
      {std::make_shared<volt::ModelSummary>(volt::ModelSummaryOptions().max_depth(-1))}));
  ASSERT_EQ(lines.size(), 1u);
  // max_depth 0: no table, as Lightning.
  EXPECT_TRUE(summaries_of_fit(volt_test::quiet("").callbacks({std::make_shared<volt::ModelSummary>(
                                   volt::ModelSummaryOptions().max_depth(0))}))
                  .empty());
}

}  // namespace
