// TrainerOptions::inference_mode (Lightning's Trainer(inference_mode=...)): validation, test and
// predict run under c10::InferenceMode, or under NoGradGuard when it is off; training never does.
#include <gtest/gtest.h>

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "log_capture.h"
#include "tiny.h"

namespace {

using volt_test::quiet;
using volt_test::TinyClassifier;

struct Seen {
  int64_t steps = 0;
  int64_t inference = 0;  // steps that ran in inference mode
  int64_t grad = 0;       // steps that ran with grad mode on
  int64_t inference_outputs = 0;
};

/// Records the autograd state each step runs in.
class ModeRecorder : public TinyClassifier {
 public:
  static void note(Seen& s, const torch::Tensor& output) {
    ++s.steps;
    s.inference += c10::InferenceMode::is_enabled();
    s.grad += at::GradMode::is_enabled();
    s.inference_outputs += output.is_inference();
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    auto loss = TinyClassifier::training_step(b, i);
    note(train, loss);
    return loss;
  }
  void validation_step(const volt::Batch& b, int64_t i) override {
    note(val, forward(b.input));
    TinyClassifier::validation_step(b, i);
  }
  void test_step(const volt::Batch& b, int64_t i) override {
    note(test, forward(b.input));
    TinyClassifier::test_step(b, i);
  }
  torch::Tensor predict_step(const volt::Batch& b, int64_t i) override {
    auto out = TinyClassifier::predict_step(b, i);
    note(predict, out);
    return out;
  }
  Seen train, val, test, predict;
};

TEST(InferenceMode, EvaluationRunsInInferenceModeOrWithoutGradAndGivesTheSameResults) {
  volt_test::TempDir dir;
  struct Result {
    torch::Tensor weights;
    std::vector<double> val_loss;
    std::vector<torch::Tensor> predictions;
  };
  const auto run = [&](bool inference_mode, ModeRecorder& model) {
    auto logger = std::make_shared<volt_test::MemoryLogger>();
    volt::Trainer t(quiet(dir.path)
                        .max_epochs(2)
                        .num_sanity_val_steps(1)
                        .inference_mode(inference_mode)
                        .loggers({logger}));
    t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
    t.test(model, volt_test::loader(volt_test::blobs(32)));
    Result r;
    r.predictions = t.predict(model, volt_test::loader(volt_test::blobs(32), 16, false));
    r.weights = model.flat_params();
    for (const auto& rec : logger->with("val_loss"))
      r.val_loss.push_back(rec.second.at("val_loss"));
    return r;
  };
  torch::manual_seed(1);
  ModeRecorder on;
  torch::manual_seed(1);
  ModeRecorder off;  // the same initial weights
  const Result a = run(true, on);
  const Result b = run(false, off);

  // Training: never in inference mode, always with gradients.
  for (const Seen* s : {&on.train, &off.train}) {
    EXPECT_EQ(s->steps, 8);
    EXPECT_EQ(s->inference, 0);
    EXPECT_EQ(s->grad, 8);
  }
  // 1 sanity batch + 2 epochs of 2 batches; 2 test and 2 predict batches.
  EXPECT_EQ(on.val.steps, 5);
  EXPECT_EQ(on.test.steps, 2);
  EXPECT_EQ(on.predict.steps, 2);
  for (const Seen* s : {&on.val, &on.test, &on.predict}) {
    EXPECT_EQ(s->inference, s->steps);
    EXPECT_EQ(s->inference_outputs, s->steps);
    EXPECT_EQ(s->grad, 0);
  }
  for (const Seen* s : {&off.val, &off.test, &off.predict}) {
    EXPECT_EQ(s->inference, 0);
    EXPECT_EQ(s->inference_outputs, 0);
    EXPECT_EQ(s->grad, 0);
  }
  for (const auto& p : a.predictions) EXPECT_TRUE(p.is_inference());
  for (const auto& p : b.predictions) EXPECT_FALSE(p.is_inference());
  // The same numbers either way, bit for bit.
  EXPECT_TRUE(a.weights.equal(b.weights));
  ASSERT_EQ(a.val_loss.size(), 2u);
  EXPECT_EQ(a.val_loss, b.val_loss);
  ASSERT_EQ(a.predictions.size(), b.predictions.size());
  for (size_t i = 0; i < a.predictions.size(); ++i) {
    EXPECT_TRUE(a.predictions[i].equal(b.predictions[i]));
  }
  // The process's own state is left as it was.
  EXPECT_FALSE(c10::InferenceMode::is_enabled());
  EXPECT_TRUE(at::GradMode::is_enabled());
}

/// Keeps a tensor from validation and multiplies training's logits by it: autograd must save it
/// for the backward, which it refuses for an inference tensor.
class KeepsAValidationTensor : public TinyClassifier {
 public:
  void validation_step(const volt::Batch& b, int64_t i) override {
    weight = torch::softmax(forward(b.input), 1).mean(0).detach();
    TinyClassifier::validation_step(b, i);
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto logits = forward(b.input);
    if (weight.defined()) logits = logits * weight;
    return torch::cross_entropy_loss(logits, b.target);
  }
  torch::Tensor weight;
};

TEST(InferenceMode, ATensorFromValidationUsedInTrainingFailsNamingTheOption) {
  volt_test::TempDir dir;
  const auto options = quiet(dir.path).max_epochs(2);
  {  // inference_mode(false): the kept tensor is a normal one and training goes on
    KeepsAValidationTensor model;
    volt::Trainer t(volt::TrainerOptions(options).inference_mode(false));
    t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
    EXPECT_EQ(t.state().global_step, 8);
  }
  KeepsAValidationTensor model;
  volt::Trainer t(options);
  std::string what;
  const auto lines = volt_test::capture_logs([&] {
    try {
      t.fit(model, volt_test::loader(volt_test::blobs(64)),
            volt_test::loader(volt_test::blobs(32)));
    } catch (const std::exception& e) {
      what = e.what();
    }
  });
  EXPECT_NE(what.find("Inference tensors cannot be saved for backward"), std::string::npos) << what;
  // The first epoch trained; the first step after its validation failed.
  EXPECT_EQ(t.state().global_step, 4);
  const auto line = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("fit failed in training_step at epoch 1, batch 0") != std::string::npos;
  });
  ASSERT_NE(line, lines.end());
  EXPECT_NE(line->find("a tensor made in validation, test or predict, which run under "
                       "c10::InferenceMode (TrainerOptions::inference_mode, default true), "
                       "reached autograd or an in-place op after it: clone() it where it is "
                       "made, or set inference_mode(false) (--trainer.inference_mode=false)"),
            std::string::npos)
      << *line;
}

}  // namespace
