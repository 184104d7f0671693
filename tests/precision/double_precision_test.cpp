// Precision "64-true" (Lightning's DoublePrecision): the model, its inputs, gradients and
// optimizer state in float64. A fit equals the same steps written by hand in float64, bit for
// bit; a model built in init_module() is float64; a checkpoint resumes exactly and loads into a
// float32 run; Lightning's short names resolve to their precisions; ZeRO refuses float64.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <volt/strategies/deepspeed.h>
#include <volt/volt.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "error_text.h"
#include "log_capture.h"
#include "tiny.h"

namespace {

using volt_test::quiet;
using volt_test::TinyClassifier;

// Records the dtypes the step really saw.
class Recording : public TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    input_dtype = b.input.scalar_type();
    target_dtype = b.target.scalar_type();
    torch::Tensor loss = TinyClassifier::training_step(b, i);  // one forward: one dropout draw
    logits_dtype = loss.scalar_type();
    return loss;
  }
  void on_after_backward() override { grad_dtype = fc1->weight.grad().scalar_type(); }
  c10::ScalarType input_dtype = c10::kFloat, target_dtype = c10::kFloat;
  c10::ScalarType logits_dtype = c10::kFloat, grad_dtype = c10::kFloat;  // logits: the loss's
};

// Two models with the same initial weights.
std::pair<std::unique_ptr<Recording>, std::unique_ptr<TinyClassifier>> twins() {
  torch::manual_seed(5);
  auto a = std::make_unique<Recording>();
  torch::manual_seed(5);
  auto b = std::make_unique<TinyClassifier>();
  return {std::move(a), std::move(b)};
}

}  // namespace

// The Trainer under 64-true computes what a hand-written float64 loop computes: the module
// converted once, each batch's features converted (the integer labels left alone), SGD with
// momentum over float64 state, dropout drawing from the generator the Trainer seeded.
TEST(DoublePrecision, AFitEqualsTheSameStepsWrittenInFloat64BitForBit) {
  volt_test::TempDir dir;
  auto data = volt_test::blobs(96);
  auto [a, b] = twins();
  volt::Trainer t(quiet(dir.path).max_epochs(2).precision("64-true"));
  t.fit(*a, volt_test::loader(data, 16, /*shuffle=*/false));
  EXPECT_EQ(a->input_dtype, c10::kDouble);
  EXPECT_EQ(a->target_dtype, c10::kLong);
  EXPECT_EQ(a->logits_dtype, c10::kDouble);
  EXPECT_EQ(a->grad_dtype, c10::kDouble);
  for (const auto& p : a->parameters()) EXPECT_EQ(p.scalar_type(), c10::kDouble);

  b->to(torch::kDouble);
  volt::seed_everything(123);  // quiet()'s seed, which the Trainer set
  b->train();
  auto opt = b->configure_optimizers().at(0).optimizer();
  const at::Tensor x = data->inputs().to(torch::kDouble), y = data->targets();
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int64_t i = 0; i < 96; i += 16) {
      opt->zero_grad();
      torch::cross_entropy_loss(b->forward(x.slice(0, i, i + 16)), y.slice(0, i, i + 16))
          .backward();
      opt->step();
    }
  }
  EXPECT_TRUE(at::equal(a->flat_params(), b->flat_params()));
}

// Lightning's trainer.init_module() under 64-true: the model is float64 from the start, the
// default dtype is back afterwards, and the fit keeps it float64.
TEST(DoublePrecision, AModelBuiltInInitModuleIsFloat64) {
  volt_test::TempDir dir;
  volt::Trainer trainer(quiet(dir.path).precision("64-true").max_epochs(1));
  std::shared_ptr<TinyClassifier> m;
  {
    auto init = trainer.init_module();
    ASSERT_NE(init, nullptr);
    m = std::make_shared<TinyClassifier>();
    EXPECT_EQ(at::empty({1}).scalar_type(), at::kDouble);
  }
  EXPECT_EQ(at::empty({1}).scalar_type(), at::kFloat);
  EXPECT_EQ(m->fc1->weight.scalar_type(), at::kDouble);
  const at::Tensor before = m->fc1->weight.detach().clone();
  trainer.fit(*m, volt_test::loader(volt_test::blobs(64), 16));
  EXPECT_EQ(m->fc1->weight.scalar_type(), at::kDouble);
  EXPECT_FALSE(at::equal(before, m->fc1->weight));
}

// A float64 checkpoint: a fit resumed from it ends bit for bit where the uninterrupted fit ends
// (shuffled batches, dropout, SGD momentum in float64), and a float32 run loads its weights.
TEST(DoublePrecision, ACheckpointResumesExactlyAndLoadsIntoAFloat32Run) {
  volt_test::TempDir dir;
  auto data = volt_test::blobs(96);
  const auto opts = [&] { return quiet(dir.path).precision("64-true"); };
  torch::manual_seed(5);
  TinyClassifier whole;
  volt::Trainer(opts().max_epochs(3)).fit(whole, volt_test::loader(data, 16));

  torch::manual_seed(5);
  TinyClassifier cut;
  {
    volt::Trainer first(opts().max_epochs(1));
    first.fit(cut, volt_test::loader(data, 16));
    first.save_checkpoint(dir / "epoch1.ckpt");
  }
  torch::manual_seed(5);
  TinyClassifier resumed;
  volt::Trainer(opts().max_epochs(3))
      .fit(resumed, volt_test::loader(data, 16), c10::nullopt, dir / "epoch1.ckpt");
  EXPECT_EQ(resumed.fc1->weight.scalar_type(), at::kDouble);
  EXPECT_TRUE(at::equal(whole.flat_params(), resumed.flat_params()));

  // Validation in fp32 from the float64 checkpoint: the module stays float32 and holds the
  // checkpoint's weights rounded to float32.
  torch::manual_seed(9);
  TinyClassifier fp32;
  volt::Trainer(quiet(dir.path))
      .validate(fp32, volt_test::loader(data, 32, false), dir / "epoch1.ckpt");
  EXPECT_EQ(fp32.fc1->weight.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(fp32.flat_params(), cut.flat_params().to(torch::kFloat)));
}

// Lightning's short names ("64", "32", "16", "bf16") make the same precisions as the full ones.
TEST(DoublePrecision, LightningsShortNamesMakeTheirPrecisions) {
  auto& reg = volt::registry();
  for (const auto& [alias, name] : std::vector<std::pair<std::string, std::string>>{
           {"64", "64-true"}, {"32", "32-true"}, {"16", "16-mixed"}, {"bf16", "bf16-mixed"}}) {
    ASSERT_TRUE(reg.precisions.contains(alias)) << alias;
    EXPECT_EQ(reg.precisions.create(alias)->name(), name) << alias;
  }
  EXPECT_EQ(reg.precisions.create("64")->compute_dtype(), c10::kDouble);
  volt_test::TempDir dir;
  Recording m;
  volt::Trainer(quiet(dir.path).max_epochs(1).precision("64"))
      .fit(m, volt_test::loader(volt_test::blobs(32), 16));
  EXPECT_EQ(m.logits_dtype, c10::kDouble);
}

// ZeRO's partitions and masters are built for fp32 / bf16 / fp16 weights: float64 is refused at
// construction, naming the way out (as Lightning's DeepSpeed precision refuses "64-true").
TEST(DoublePrecision, DeepSpeedRefusesFloat64) {
  auto accel = std::make_shared<volt::CpuAccelerator>();
  const auto err = volt_test::error_of<volt::ConfigError>([&] {
    volt::DeepSpeedStrategy s(volt::DeepSpeedStrategyOptions().stage(2), accel,
                              volt::registry().precisions.create("64-true"), 1);
  });
  EXPECT_TRUE(volt_test::has(err, "[DeepSpeedStrategy] precision \"64-true\" (float64)")) << err;
  EXPECT_TRUE(volt_test::has(err, "strategy=\"ddp\"")) << err;
  volt_test::TempDir dir;
  const auto trainer_err = volt_test::error_of<volt::ConfigError>(
      [&] { volt::Trainer t(quiet(dir.path).strategy("deepspeed_stage_3").precision("64")); });
  EXPECT_TRUE(volt_test::has(trainer_err, "float64")) << trainer_err;
}
