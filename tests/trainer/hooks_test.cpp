// The order of every module and callback hook in fit, validate, test and predict, against the
// order Lightning's own tests require (tests/tests_pytorch/models/test_hooks.py), with volt's
// departures spelled out where they are expected; setup/teardown (also after a failure),
// configure_model, and the training modes around evaluation passes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "error_text.h"
#include "log_capture.h"
#include "requires.h"
#include "save_at.h"
#include "tiny.h"

namespace {

using Calls = std::vector<std::string>;

std::string with(const std::string& name, int64_t i) {
  return name + " " + std::to_string(i);
}

/// Every hook a module has, recorded.
class HookedModule : public volt_test::TinyClassifier {
 public:
  explicit HookedModule(Calls& calls) : calls_(calls) {}

  void setup(volt::Stage stage) override {
    calls_.push_back(std::string("setup ") + volt::to_string(stage));
  }
  void configure_model() override { calls_.push_back("configure_model"); }
  void prepare_data() override { calls_.push_back("prepare_data"); }
  void on_validation_model_zero_grad() override {
    calls_.push_back("on_validation_model_zero_grad");
  }
  std::vector<std::shared_ptr<volt::Callback>> configure_callbacks() override {
    calls_.push_back("configure_callbacks");
    return {};
  }
  volt::Batch on_before_batch_transfer(volt::Batch batch) override {
    calls_.push_back("on_before_batch_transfer");
    return batch;
  }
  volt::Batch transfer_batch_to_device(volt::Batch batch, c10::Device device) override {
    calls_.push_back("transfer_batch_to_device");
    return TinyClassifier::transfer_batch_to_device(std::move(batch), device);
  }
  volt::Batch on_after_batch_transfer(volt::Batch batch) override {
    calls_.push_back("on_after_batch_transfer");
    return batch;
  }
  void teardown(volt::Stage stage) override {
    calls_.push_back(std::string("teardown ") + volt::to_string(stage));
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    calls_.push_back("configure_optimizers");
    return TinyClassifier::configure_optimizers();
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    calls_.push_back(with("training_step", i));
    return TinyClassifier::training_step(b, i);
  }
  void validation_step(const volt::Batch& b, int64_t i) override {
    calls_.push_back(with("validation_step", i));
    TinyClassifier::validation_step(b, i);
  }
  void test_step(const volt::Batch& b, int64_t i) override {
    calls_.push_back(with("test_step", i));
    TinyClassifier::test_step(b, i);
  }
  torch::Tensor predict_step(const volt::Batch& b, int64_t i) override {
    calls_.push_back(with("predict_step", i));
    return TinyClassifier::predict_step(b, i);
  }
  void on_fit_start() override { calls_.push_back("on_fit_start"); }
  void on_fit_end() override { calls_.push_back("on_fit_end"); }
  void on_train_start() override { calls_.push_back("on_train_start"); }
  void on_train_end() override {
    calls_.push_back("on_train_end");
    const auto schedulers = lr_schedulers();
    if (!schedulers.empty()) lr_at_train_end = schedulers.front()->last_lrs().front();
  }
  double lr_at_train_end = -1;  // the first scheduler's first rate then
  void on_train_epoch_start() override { calls_.push_back("on_train_epoch_start"); }
  void on_train_epoch_end() override { calls_.push_back("on_train_epoch_end"); }
  void on_train_batch_start(const volt::Batch&, int64_t i) override {
    calls_.push_back(with("on_train_batch_start", i));
    if (current_epoch() == skip_epoch && i == skip_batch) skip_rest_of_epoch();
  }
  /// Lightning's `return -1` from on_train_batch_start at this epoch's batch (-1: never).
  int64_t skip_epoch = -1, skip_batch = -1;
  void on_train_batch_end(const volt::Batch&, int64_t i) override {
    calls_.push_back(with("on_train_batch_end", i));
  }
  void on_before_backward(const at::Tensor&) override { calls_.push_back("on_before_backward"); }
  void on_after_backward() override { calls_.push_back("on_after_backward"); }
  void on_before_optimizer_step(torch::optim::Optimizer&) override {
    calls_.push_back("on_before_optimizer_step");
  }
  void on_before_zero_grad(torch::optim::Optimizer&) override {
    calls_.push_back("on_before_zero_grad");
  }
  // The overridable steps, recorded where they start; each then runs its default.
  void backward(const at::Tensor& loss) override {
    calls_.push_back("backward");
    TinyClassifier::backward(loss);
  }
  void optimizer_step(int64_t epoch, int64_t i, torch::optim::Optimizer& opt,
                      const std::function<bool()>& step) override {
    calls_.push_back(with("optimizer_step", i));
    TinyClassifier::optimizer_step(epoch, i, opt, step);
  }
  void configure_gradient_clipping(torch::optim::Optimizer& opt, c10::optional<double> value,
                                   volt::ClipAlgorithm algorithm) override {
    calls_.push_back("configure_gradient_clipping");
    TinyClassifier::configure_gradient_clipping(opt, value, algorithm);
  }
  void optimizer_zero_grad(int64_t epoch, int64_t i, torch::optim::Optimizer& opt) override {
    calls_.push_back(with("optimizer_zero_grad", i));
    TinyClassifier::optimizer_zero_grad(epoch, i, opt);
  }
  void on_validation_model_eval() override {
    calls_.push_back("on_validation_model_eval");
    TinyClassifier::on_validation_model_eval();
  }
  void on_validation_model_train() override {
    calls_.push_back("on_validation_model_train");
    TinyClassifier::on_validation_model_train();
  }
  void on_validation_start() override { calls_.push_back("on_validation_start"); }
  void on_validation_end() override { calls_.push_back("on_validation_end"); }
  void on_validation_epoch_start() override { calls_.push_back("on_validation_epoch_start"); }
  void on_validation_epoch_end() override { calls_.push_back("on_validation_epoch_end"); }
  void on_validation_batch_start(const volt::Batch&, int64_t i) override {
    calls_.push_back(with("on_validation_batch_start", i));
  }
  void on_validation_batch_end(const volt::Batch&, int64_t i) override {
    calls_.push_back(with("on_validation_batch_end", i));
  }
  void on_test_model_eval() override {
    calls_.push_back("on_test_model_eval");
    TinyClassifier::on_test_model_eval();
  }
  void on_test_model_train() override {
    calls_.push_back("on_test_model_train");
    TinyClassifier::on_test_model_train();
  }
  void on_test_start() override { calls_.push_back("on_test_start"); }
  void on_test_end() override { calls_.push_back("on_test_end"); }
  void on_test_epoch_start() override { calls_.push_back("on_test_epoch_start"); }
  void on_test_epoch_end() override { calls_.push_back("on_test_epoch_end"); }
  void on_test_batch_start(const volt::Batch&, int64_t i) override {
    calls_.push_back(with("on_test_batch_start", i));
  }
  void on_test_batch_end(const volt::Batch&, int64_t i) override {
    calls_.push_back(with("on_test_batch_end", i));
  }
  void on_predict_model_eval() override {
    calls_.push_back("on_predict_model_eval");
    TinyClassifier::on_predict_model_eval();
  }
  void on_predict_start() override { calls_.push_back("on_predict_start"); }
  void on_predict_end() override { calls_.push_back("on_predict_end"); }
  void on_predict_epoch_start() override { calls_.push_back("on_predict_epoch_start"); }
  void on_predict_epoch_end() override { calls_.push_back("on_predict_epoch_end"); }
  void on_predict_batch_start(const volt::Batch&, int64_t i) override {
    calls_.push_back(with("on_predict_batch_start", i));
  }
  void on_predict_batch_end(const at::Tensor&, const volt::Batch&, int64_t i) override {
    calls_.push_back(with("on_predict_batch_end", i));
  }

 private:
  Calls& calls_;
};

/// Every hook a callback has, recorded with a "Callback." prefix.
class HookedCallback : public volt::Callback {
 public:
  explicit HookedCallback(Calls& calls) : calls_(calls) {}
  std::string state_key() const override { return "HookedCallback"; }

  void setup(volt::RunContext&, volt::Module&, volt::Stage stage) override {
    add(std::string("setup ") + volt::to_string(stage));
  }
  void teardown(volt::RunContext&, volt::Module&, volt::Stage stage) override {
    add(std::string("teardown ") + volt::to_string(stage));
  }
  void on_fit_start(volt::RunContext&, volt::Module&) override { add("on_fit_start"); }
  void on_fit_end(volt::RunContext&, volt::Module&) override { add("on_fit_end"); }
  void on_sanity_check_start(volt::RunContext&, volt::Module&) override {
    add("on_sanity_check_start");
  }
  void on_sanity_check_end(volt::RunContext&, volt::Module&) override {
    add("on_sanity_check_end");
  }
  void on_train_start(volt::RunContext&, volt::Module&) override { add("on_train_start"); }
  void on_train_end(volt::RunContext&, volt::Module&) override { add("on_train_end"); }
  void on_train_epoch_start(volt::RunContext&, volt::Module&) override {
    add("on_train_epoch_start");
  }
  void on_train_epoch_end(volt::RunContext&, volt::Module&) override { add("on_train_epoch_end"); }
  void on_train_batch_start(volt::RunContext&, volt::Module&, const volt::Batch&,
                            int64_t i) override {
    add(with("on_train_batch_start", i));
  }
  void on_train_batch_end(volt::RunContext&, volt::Module&, const volt::Batch&,
                          int64_t i) override {
    add(with("on_train_batch_end", i));
  }
  void on_before_backward(volt::RunContext&, volt::Module&, const at::Tensor&) override {
    add("on_before_backward");
  }
  void on_after_backward(volt::RunContext&, volt::Module&) override { add("on_after_backward"); }
  void on_before_optimizer_step(volt::RunContext&, volt::Module&,
                                torch::optim::Optimizer&) override {
    add("on_before_optimizer_step");
  }
  void on_before_zero_grad(volt::RunContext&, volt::Module&, torch::optim::Optimizer&) override {
    add("on_before_zero_grad");
  }
  void on_validation_start(volt::RunContext&, volt::Module&) override {
    add("on_validation_start");
  }
  void on_validation_end(volt::RunContext&, volt::Module&) override { add("on_validation_end"); }
  void on_validation_epoch_start(volt::RunContext&, volt::Module&) override {
    add("on_validation_epoch_start");
  }
  void on_validation_epoch_end(volt::RunContext&, volt::Module&) override {
    add("on_validation_epoch_end");
  }
  void on_validation_batch_start(volt::RunContext&, volt::Module&, const volt::Batch&,
                                 int64_t i) override {
    add(with("on_validation_batch_start", i));
  }
  void on_validation_batch_end(volt::RunContext&, volt::Module&, const volt::Batch&,
                               int64_t i) override {
    add(with("on_validation_batch_end", i));
  }
  void on_test_start(volt::RunContext&, volt::Module&) override { add("on_test_start"); }
  void on_test_end(volt::RunContext&, volt::Module&) override { add("on_test_end"); }
  void on_test_epoch_start(volt::RunContext&, volt::Module&) override {
    add("on_test_epoch_start");
  }
  void on_test_epoch_end(volt::RunContext&, volt::Module&) override { add("on_test_epoch_end"); }
  void on_test_batch_start(volt::RunContext&, volt::Module&, const volt::Batch&,
                           int64_t i) override {
    add(with("on_test_batch_start", i));
  }
  void on_test_batch_end(volt::RunContext&, volt::Module&, const volt::Batch&, int64_t i) override {
    add(with("on_test_batch_end", i));
  }
  void on_predict_start(volt::RunContext&, volt::Module&) override { add("on_predict_start"); }
  void on_predict_end(volt::RunContext&, volt::Module&) override { add("on_predict_end"); }
  void on_predict_epoch_start(volt::RunContext&, volt::Module&) override {
    add("on_predict_epoch_start");
  }
  void on_predict_epoch_end(volt::RunContext&, volt::Module&) override {
    add("on_predict_epoch_end");
  }
  void on_predict_batch_start(volt::RunContext&, volt::Module&, const volt::Batch&,
                              int64_t i) override {
    add(with("on_predict_batch_start", i));
  }
  void on_predict_batch_end(volt::RunContext&, volt::Module&, const at::Tensor&, const volt::Batch&,
                            int64_t i) override {
    add(with("on_predict_batch_end", i));
  }
  void on_exception(volt::RunContext&, volt::Module&, const std::exception&) override {
    add("on_exception");
  }

 private:
  void add(const std::string& name) { calls_.push_back("Callback." + name); }
  Calls& calls_;
};

/// Appends `items` to `out`.
void append(Calls& out, const Calls& items) {
  out.insert(out.end(), items.begin(), items.end());
}

/// A fit's set-up, up to on_fit_start (no DataModule).
Calls fit_set_up() {
  return {"configure_callbacks", "prepare_data",         "Callback.setup fit",    "setup fit",
          "configure_model",     "configure_optimizers", "Callback.on_fit_start", "on_fit_start"};
}

/// Lightning's _eval_epoch + _eval_batch for `fn` ("validation"/"test"), between the start and
/// end hooks. Departure: at the epoch's end volt calls the module's hook before the callbacks'.
Calls eval_epoch(const std::string& fn, int64_t batches) {
  Calls out = {"Callback.on_" + fn + "_epoch_start", "on_" + fn + "_epoch_start"};
  for (int64_t i = 0; i < batches; ++i) {
    append(out, {"on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer",
                 with("Callback.on_" + fn + "_batch_start", i),
                 with("on_" + fn + "_batch_start", i), with(fn + "_step", i),
                 with("Callback.on_" + fn + "_batch_end", i), with("on_" + fn + "_batch_end", i)});
  }
  append(out, {"on_" + fn + "_epoch_end", "Callback.on_" + fn + "_epoch_end"});
  return out;
}

/// A whole validation (or test) pass, model_eval to model_train.
Calls eval_pass(const std::string& fn, int64_t batches) {
  Calls out = {"on_" + fn + "_model_eval", "Callback.on_" + fn + "_start", "on_" + fn + "_start"};
  append(out, eval_epoch(fn, batches));
  append(out, {"Callback.on_" + fn + "_end", "on_" + fn + "_end", "on_" + fn + "_model_train"});
  return out;
}

/// Lightning's _auto_train_batch. The module's optimizer_step starts before, and holds, the
/// step: the unscale, on_before_optimizer_step, then configure_gradient_clipping (Lightning
/// lists optimizer_step after them because its test records the hook when it returns).
/// Departure: volt zeroes the gradients after the optimizer step, so on_before_zero_grad and
/// optimizer_zero_grad come after it (Lightning zeroes them before the backward of the step's
/// first micro-batch).
Calls train_batches(int64_t batches) {
  Calls out;
  for (int64_t i = 0; i < batches; ++i) {
    append(out, {"on_before_batch_transfer",
                 "transfer_batch_to_device",
                 "on_after_batch_transfer",
                 with("Callback.on_train_batch_start", i),
                 with("on_train_batch_start", i),
                 with("training_step", i),
                 "Callback.on_before_backward",
                 "on_before_backward",
                 "backward",
                 "Callback.on_after_backward",
                 "on_after_backward",
                 with("optimizer_step", i),
                 "Callback.on_before_optimizer_step",
                 "on_before_optimizer_step",
                 "configure_gradient_clipping",
                 "Callback.on_before_zero_grad",
                 "on_before_zero_grad",
                 with("optimizer_zero_grad", i),
                 with("Callback.on_train_batch_end", i),
                 with("on_train_batch_end", i)});
  }
  return out;
}

std::string diff_hint(const Calls& got, const Calls& expected) {
  size_t i = 0;
  while (i < got.size() && i < expected.size() && got[i] == expected[i]) ++i;
  return "first difference at " + std::to_string(i) + ": got '" +
         (i < got.size() ? got[i] : "<end>") + "', expected '" +
         (i < expected.size() ? expected[i] : "<end>") + "'";
}

TEST(Hooks, FitCallsThemInLightningsOrder) {
  volt_test::TempDir dir;
  Calls calls;
  HookedModule model(calls);
  auto cb = std::make_shared<HookedCallback>(calls);
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(1)
                            .limit_train_batches(int64_t{2})
                            .limit_val_batches(int64_t{2})
                            .num_sanity_val_steps(2)
                            .callbacks({cb}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)),
              volt_test::loader(volt_test::blobs(64, 8, 1)));
  Calls expected = fit_set_up();
  append(expected, {"Callback.on_sanity_check_start"});
  append(expected, eval_pass("validation", 2));
  append(expected, {"Callback.on_sanity_check_end", "Callback.on_train_start", "on_train_start",
                    "Callback.on_train_epoch_start", "on_train_epoch_start"});
  append(expected, train_batches(2));
  append(expected, {"on_validation_model_zero_grad"});  // in fit, not in the sanity check
  append(expected, eval_pass("validation", 2));
  append(expected, {"on_train_epoch_end", "Callback.on_train_epoch_end", "Callback.on_train_end",
                    "on_train_end", "Callback.on_fit_end", "on_fit_end", "Callback.teardown fit",
                    "teardown fit"});
  EXPECT_EQ(calls, expected) << diff_hint(calls, expected);
}

// Lightning's FitLoop.skip: a fit with nothing to train runs the fit's hooks but no train start
// or end (volt ran on_train_start/on_train_end: ModelPruning, SWA and Timer acted on a fit that
// trained nothing). A stop asked for at an epoch start trains no batch; the epoch still ends.
TEST(Hooks, AFitWithNothingToTrainRunsNoTrainStartOrEnd) {
  class StopAtEpochStart : public volt::Callback {
   public:
    std::string state_key() const override { return "StopAtEpochStart"; }
    void on_train_epoch_start(volt::RunContext& run, volt::Module&) override { run.request_stop(); }
  };
  const Calls set_up = fit_set_up();
  const Calls ends = {"Callback.on_fit_end", "on_fit_end", "Callback.teardown fit", "teardown fit"};
  for (const char* nothing : {"max_steps=0", "limit_train_batches=0", "max_epochs reached"}) {
    SCOPED_TRACE(nothing);
    volt_test::TempDir dir;
    Calls calls;
    HookedModule model(calls);
    auto options = volt_test::quiet(dir.path).max_epochs(1).num_sanity_val_steps(0).callbacks(
        {std::make_shared<HookedCallback>(calls)});
    if (std::string(nothing) == "max_steps=0") options.max_steps(0);
    if (std::string(nothing) == "limit_train_batches=0") options.limit_train_batches(int64_t{0});
    std::string ckpt;
    if (std::string(nothing) == "max_epochs reached") {
      volt::Trainer first(volt_test::quiet(dir.path).max_epochs(1).limit_train_batches(int64_t{2}));
      first.fit(model, volt_test::loader(volt_test::blobs(64)));
      ckpt = dir.path + "/done.ckpt";
      first.save_checkpoint(ckpt);
      calls.clear();
    }
    volt::Trainer trainer(options);
    trainer.fit(model, volt_test::loader(volt_test::blobs(64)), c10::nullopt, ckpt);
    Calls expected = set_up;
    append(expected, ends);
    EXPECT_EQ(calls, expected) << diff_hint(calls, expected);
  }
  volt_test::TempDir dir;
  Calls calls;
  HookedModule model(calls);
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(2).num_sanity_val_steps(0).callbacks(
      {std::make_shared<HookedCallback>(calls), std::make_shared<StopAtEpochStart>()}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)));
  Calls expected = set_up;
  append(expected, {"Callback.on_train_start", "on_train_start", "Callback.on_train_epoch_start",
                    "on_train_epoch_start", "on_train_epoch_end", "Callback.on_train_epoch_end",
                    "Callback.on_train_end", "on_train_end"});
  append(expected, ends);
  EXPECT_EQ(calls, expected) << diff_hint(calls, expected);
  EXPECT_EQ(trainer.state().global_step, 0);
}

// Lightning's on_train_batch_start returning -1 (volt: skip_rest_of_epoch() there): that batch
// runs no training_step and no batch-end hooks, the epoch ends without its validation, its
// epoch-interval scheduler steps as after the last batch, and the next epoch trains whole.
TEST(Hooks, SkipRestOfEpochEndsTheEpochBeforeItsBatchWithoutValidation) {
  volt_test::TempDir dir;
  Calls calls;
  HookedModule model(calls);
  model.skip_epoch = 0;
  model.skip_batch = 1;
  model.scheduler_step_size = 1;  // StepLR(gamma 0.5) each epoch
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(2)
                            .limit_train_batches(int64_t{3})
                            .limit_val_batches(int64_t{1})
                            .num_sanity_val_steps(0)
                            .callbacks({std::make_shared<HookedCallback>(calls)}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)),
              volt_test::loader(volt_test::blobs(64, 8, 1)));
  Calls expected = fit_set_up();
  append(expected, {"Callback.on_train_start", "on_train_start", "Callback.on_train_epoch_start",
                    "on_train_epoch_start"});
  append(expected, train_batches(1));
  append(expected,
         {"on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer",
          "Callback.on_train_batch_start 1", "on_train_batch_start 1", "on_train_epoch_end",
          "Callback.on_train_epoch_end", "Callback.on_train_epoch_start", "on_train_epoch_start"});
  append(expected, train_batches(3));
  append(expected, {"on_validation_model_zero_grad"});
  append(expected, eval_pass("validation", 1));
  append(expected, {"on_train_epoch_end", "Callback.on_train_epoch_end", "Callback.on_train_end",
                    "on_train_end", "Callback.on_fit_end", "on_fit_end", "Callback.teardown fit",
                    "teardown fit"});
  EXPECT_EQ(calls, expected) << diff_hint(calls, expected);
  EXPECT_EQ(trainer.state().global_step, 4);
  EXPECT_EQ(trainer.state().epoch, 1);
  // Both epochs' ends stepped the scheduler, the skipped one too.
  EXPECT_DOUBLE_EQ(model.lr_at_train_end, 0.1 * 0.5 * 0.5);
}

TEST(Hooks, ValidateTestAndPredictCallThemInLightningsOrder) {
  volt_test::TempDir dir;
  Calls calls;
  HookedModule model(calls);
  auto cb = std::make_shared<HookedCallback>(calls);
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .limit_val_batches(int64_t{2})
                            .limit_test_batches(int64_t{2})
                            .limit_predict_batches(int64_t{2})
                            .callbacks({cb}));
  const auto data = volt_test::loader(volt_test::blobs(64), 16, false);

  trainer.validate(model, data);
  Calls expected = {"configure_callbacks", "prepare_data", "Callback.setup validate",
                    "setup validate", "configure_model"};
  append(expected, eval_pass("validation", 2));
  append(expected, {"Callback.teardown validate", "teardown validate"});
  EXPECT_EQ(calls, expected) << diff_hint(calls, expected);

  calls.clear();
  trainer.test(model, data);
  expected = {"configure_callbacks", "prepare_data", "Callback.setup test", "setup test",
              "configure_model"};
  append(expected, eval_pass("test", 2));
  append(expected, {"Callback.teardown test", "teardown test"});
  EXPECT_EQ(calls, expected) << diff_hint(calls, expected);

  calls.clear();
  trainer.predict(model, data);
  expected = {"configure_callbacks",
              "prepare_data",
              "Callback.setup predict",
              "setup predict",
              "configure_model",
              "on_predict_model_eval",
              "Callback.on_predict_start",
              "on_predict_start",
              "Callback.on_predict_epoch_start",
              "on_predict_epoch_start"};
  for (int64_t i = 0; i < 2; ++i) {
    append(expected, {"on_before_batch_transfer", "transfer_batch_to_device",
                      "on_after_batch_transfer", with("Callback.on_predict_batch_start", i),
                      with("on_predict_batch_start", i), with("predict_step", i),
                      with("Callback.on_predict_batch_end", i), with("on_predict_batch_end", i)});
  }
  append(expected,
         {"Callback.on_predict_epoch_end", "on_predict_epoch_end", "Callback.on_predict_end",
          "on_predict_end", "Callback.teardown predict", "teardown predict"});
  EXPECT_EQ(calls, expected) << diff_hint(calls, expected);
}

TEST(Hooks, ManualOptimizationHasNoZeroGradHook) {
  // As Lightning: on_before_zero_grad, optimizer_step, configure_gradient_clipping and
  // optimizer_zero_grad belong to automatic optimization; a manual step calls the backward hooks
  // (the module's backward too) and on_before_optimizer_step from inside training_step.
  class Manual : public HookedModule {
   public:
    explicit Manual(Calls& calls) : HookedModule(calls) { set_automatic_optimization(false); }
    torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
      auto opt = optimizers().front();
      opt.zero_grad();
      manual_backward(torch::cross_entropy_loss(forward(b.input), b.target));
      opt.step();
      return {};
    }
  };
  volt_test::TempDir dir;
  Calls calls;
  Manual model(calls);
  auto cb = std::make_shared<HookedCallback>(calls);
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(1).limit_train_batches(int64_t{1}).callbacks({cb}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)));
  const Calls batch(std::find(calls.begin(), calls.end(), "Callback.on_train_batch_start 0"),
                    std::find(calls.begin(), calls.end(), "on_train_batch_end 0") + 1);
  const Calls expected = {"Callback.on_train_batch_start 0",
                          "on_train_batch_start 0",
                          "Callback.on_before_backward",
                          "on_before_backward",
                          "backward",
                          "Callback.on_after_backward",
                          "on_after_backward",
                          "Callback.on_before_optimizer_step",
                          "on_before_optimizer_step",
                          "Callback.on_train_batch_end 0",
                          "on_train_batch_end 0"};
  EXPECT_EQ(batch, expected) << diff_hint(batch, expected);
}

/// A callback whose setup or teardown throws when asked to.
class Failing : public volt::Callback {
 public:
  Failing(Calls& calls, bool in_setup, bool in_teardown)
      : calls_(calls), in_setup_(in_setup), in_teardown_(in_teardown) {}
  std::string state_key() const override { return "Failing"; }
  void setup(volt::RunContext&, volt::Module&, volt::Stage) override {
    calls_.push_back("Failing.setup");
    if (in_setup_) throw std::runtime_error("setup broke");
  }
  void teardown(volt::RunContext&, volt::Module&, volt::Stage) override {
    calls_.push_back("Failing.teardown");
    if (in_teardown_) throw std::runtime_error("teardown broke");
  }

 private:
  Calls& calls_;
  bool in_setup_, in_teardown_;
};

/// Records its DataModule hooks.
class HookedData : public volt::DataModule {
 public:
  explicit HookedData(Calls& calls) : calls_(calls) {}
  void prepare_data() override { calls_.push_back("DataModule.prepare_data"); }
  void setup(volt::Stage stage) override {
    calls_.push_back(std::string("DataModule.setup ") + volt::to_string(stage));
  }
  void teardown(volt::Stage stage) override {
    calls_.push_back(std::string("DataModule.teardown ") + volt::to_string(stage));
  }
  volt::DataLoader train_dataloader() override { return volt_test::loader(volt_test::blobs(64)); }
  c10::optional<volt::DataLoader> val_dataloader() override { return train_dataloader(); }
  c10::optional<volt::DataLoader> test_dataloader() override { return train_dataloader(); }
  c10::optional<volt::DataLoader> predict_dataloader() override { return train_dataloader(); }

 private:
  Calls& calls_;
};

Calls only_set_up_and_teardown(const Calls& calls) {
  Calls out;
  for (const auto& c : calls) {
    if (c.find("setup") != std::string::npos || c.find("teardown") != std::string::npos ||
        c.find("prepare_data") != std::string::npos || c == "Callback.on_exception") {
      out.push_back(c);
    }
  }
  return out;
}

TEST(Hooks, TheDataModuleIsPreparedAndSetUpFirstAndTornDownFirstAtEveryEntryPoint) {
  volt_test::TempDir dir;
  Calls calls;
  HookedModule model(calls);
  HookedData data(calls);
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(1)
                            .limit_train_batches(int64_t{1})
                            .limit_val_batches(int64_t{1})
                            .limit_test_batches(int64_t{1})
                            .limit_predict_batches(int64_t{1})
                            .callbacks({std::make_shared<HookedCallback>(calls)}));
  trainer.fit(model, data);
  trainer.validate(model, data);
  trainer.test(model, data);
  trainer.predict(model, data);
  Calls expected;
  for (const char* stage : {"fit", "validate", "test", "predict"}) {
    const std::string s = stage;
    // Lightning's order: prepare_data (the DataModule's, the module's), then the DataModule's
    // setup, the callbacks', the module's; teardown in the same order.
    append(expected, {"DataModule.prepare_data", "prepare_data", "DataModule.setup " + s,
                      "Callback.setup " + s, "setup " + s});
    append(expected, {"DataModule.teardown " + s, "Callback.teardown " + s, "teardown " + s});
  }
  const Calls got = only_set_up_and_teardown(calls);
  EXPECT_EQ(got, expected) << diff_hint(got, expected);
}

TEST(Hooks, AFailedRunTearsDownWhatWasSetUpAfterOnException) {
  class Breaks : public HookedModule {
   public:
    using HookedModule::HookedModule;
    torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
      throw std::runtime_error("step broke");
    }
  };
  volt_test::TempDir dir;
  Calls calls;
  Breaks model(calls);
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1).callbacks(
      {std::make_shared<HookedCallback>(calls), std::make_shared<Failing>(calls, false, true)}));
  const auto logs = volt_test::capture_logs([&] {
    EXPECT_THROW(trainer.fit(model, volt_test::loader(volt_test::blobs(64))), std::runtime_error);
  });
  // A teardown failing after a failure is logged; the run's own error is the one thrown.
  const Calls expected = {"prepare_data",     "Callback.setup fit",    "Failing.setup",
                          "setup fit",        "Callback.on_exception", "Callback.teardown fit",
                          "Failing.teardown", "teardown fit"};
  const Calls got = only_set_up_and_teardown(calls);
  EXPECT_EQ(got, expected) << diff_hint(got, expected);
  EXPECT_TRUE(volt_test::has(logs, "Failing.teardown failed: teardown broke"));
}

TEST(Hooks, ASetupThatThrowsLeavesItselfAndWhatCameAfterItUntornDown) {
  volt_test::TempDir dir;
  Calls calls;
  HookedModule model(calls);
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1).callbacks(
      {std::make_shared<HookedCallback>(calls), std::make_shared<Failing>(calls, true, false)}));
  EXPECT_THROW(trainer.fit(model, volt_test::loader(volt_test::blobs(64))), std::runtime_error);
  const Calls expected = {"prepare_data", "Callback.setup fit", "Failing.setup",
                          "Callback.on_exception", "Callback.teardown fit"};
  const Calls got = only_set_up_and_teardown(calls);
  EXPECT_EQ(got, expected) << diff_hint(got, expected);
}

TEST(Hooks, ATeardownThatThrowsFailsASuccessfulRunAndTheOthersStillTearDown) {
  volt_test::TempDir dir;
  Calls calls;
  HookedModule model(calls);
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .limit_val_batches(int64_t{1})
                            .callbacks({std::make_shared<Failing>(calls, false, true),
                                        std::make_shared<HookedCallback>(calls)}));
  const std::string what = volt_test::error_of<std::runtime_error>(
      [&] { trainer.validate(model, volt_test::loader(volt_test::blobs(64))); });
  EXPECT_EQ(what, "teardown broke");
  // The others are still torn down, and not twice: the failure path finds nothing left.
  const Calls expected = {"prepare_data",      "Failing.setup",        "Callback.setup validate",
                          "setup validate",    "Failing.teardown",     "Callback.teardown validate",
                          "teardown validate", "Callback.on_exception"};
  const Calls got = only_set_up_and_teardown(calls);
  EXPECT_EQ(got, expected) << diff_hint(got, expected);
}

/// A module whose head is built in configure_model and whose body is frozen in setup.
class Lazy : public volt::Module {
 public:
  Lazy() { body = register_module("body", torch::nn::Linear(8, 8)); }
  void setup(volt::Stage) override { body->weight.set_requires_grad(false); }
  void configure_model() override {
    if (!head) {
      head = register_module("head", torch::nn::Linear(8, 2));
      built = head->weight.scalar_type();
    }
    ++configured;
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    return torch::cross_entropy_loss(head->forward(torch::relu(body->forward(b.input))), b.target);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    std::vector<torch::Tensor> trainable;
    for (auto& p : parameters()) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    return {volt::OptimizerConfig(
        std::make_shared<torch::optim::SGD>(trainable, torch::optim::SGDOptions(0.1)))};
  }
  torch::nn::Linear body{nullptr}, head{nullptr};
  int configured = 0;
  c10::ScalarType built =
      c10::ScalarType::Undefined;  // the head's dtype as configure_model built it
};

TEST(Hooks, SetupFreezesAndConfigureModelBuildsLayersBeforeTheOptimizersAreMade) {
  volt_test::TempDir dir;
  Lazy model;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1).limit_train_batches(int64_t{3}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)));
  ASSERT_TRUE(model.head);
  const auto body_w = model.body->weight.clone();
  const auto head_w = model.head->weight.clone();
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)));
  EXPECT_EQ(model.configured, 2);
  EXPECT_TRUE(torch::equal(model.body->weight, body_w));   // frozen in setup: never stepped
  EXPECT_FALSE(torch::equal(model.head->weight, head_w));  // built in configure_model: trained
}

// configure_model runs inside the precision's init context, as Lightning's: bf16-true builds
// the layers in bfloat16 at once (they were built in float32 and converted after), 64-true in
// float64; the default dtype is float32 again afterwards.
TEST(Hooks, ConfigureModelBuildsLayersInThePrecisionsDtype) {
  volt_test::TempDir dir;
  for (const auto& [precision, dtype] : std::vector<std::pair<std::string, c10::ScalarType>>{
           {"32-true", at::kFloat}, {"bf16-true", at::kBFloat16}, {"64-true", at::kDouble}}) {
    Lazy model;
    volt::Trainer trainer(volt_test::quiet(dir.path)
                              .max_epochs(1)
                              .limit_train_batches(int64_t{2})
                              .precision(precision));
    trainer.fit(model, volt_test::loader(volt_test::blobs(64)));
    EXPECT_EQ(model.built, dtype) << precision;
    EXPECT_EQ(model.head->weight.scalar_type(), dtype) << precision;
    EXPECT_EQ(torch::get_default_dtype(), caffe2::TypeMeta::Make<float>()) << precision;
  }
}

/// Dropout stays on in validation (the override), and a BatchNorm kept in eval mode from
/// on_train_epoch_start (fit puts the module in training mode just before) stays in eval mode
/// after each validation inside the epoch (the default on_validation_model_train).
class Modes : public volt_test::TinyClassifier {
 public:
  Modes() { norm = register_module("norm", torch::nn::BatchNorm1d(16)); }
  void on_validation_model_eval() override {
    eval();
    drop->train();
  }
  void validation_step(const volt::Batch& b, int64_t i) override {
    EXPECT_TRUE(drop->is_training());
    EXPECT_FALSE(fc1->is_training());
    ++validated;
  }
  void on_train_epoch_start() override { norm->eval(); }
  void on_train_batch_start(const volt::Batch&, int64_t) override {
    EXPECT_TRUE(is_training());
    EXPECT_TRUE(fc1->is_training());
    EXPECT_FALSE(norm->is_training());
  }
  torch::nn::BatchNorm1d norm{nullptr};
  int validated = 0;
};

TEST(Hooks, EvaluationPassesPutEveryModuleBackInItsModeAndTheEvalHookCanKeepDropoutOn) {
  volt_test::TempDir dir;
  Modes model;
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(1)
                            .limit_train_batches(int64_t{4})
                            .limit_val_batches(int64_t{1})
                            .val_check_interval(int64_t{2})
                            .num_sanity_val_steps(1));
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)),
              volt_test::loader(volt_test::blobs(64, 8, 1)));
  EXPECT_EQ(model.validated, 3);  // the sanity check and two validations inside the epoch
  EXPECT_TRUE(model.is_training());
  EXPECT_FALSE(model.norm->is_training());
  // validate() and predict() leave the module as they found it, here all in eval mode.
  model.eval();
  trainer.validate(model, volt_test::loader(volt_test::blobs(64)));
  trainer.predict(model, volt_test::loader(volt_test::blobs(64)));
  EXPECT_FALSE(model.is_training());
  EXPECT_FALSE(model.drop->is_training());
}

/// Lightning's recommended pattern: collect in validation_step, reduce and clear in
/// on_validation_epoch_end. The sanity check runs the epoch hooks too, so its batches never
/// leak into the first real validation.
class Collects : public volt_test::TinyClassifier {
 public:
  void validation_step(const volt::Batch& b, int64_t i) override {
    outputs.push_back(b.size());
    TinyClassifier::validation_step(b, i);
  }
  void on_validation_epoch_end() override {
    seen.push_back(static_cast<int64_t>(outputs.size()));
    log("val_seen", static_cast<double>(outputs.size()));
    outputs.clear();
  }
  std::vector<int64_t> outputs;
  std::vector<int64_t> seen;
};

TEST(Hooks, TheSanityCheckRunsTheValidationEpochHooksAndDropsWhatTheyLog) {
  volt_test::TempDir dir;
  Collects model;
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(1)
                            .limit_train_batches(int64_t{2})
                            .limit_val_batches(int64_t{3})
                            .num_sanity_val_steps(2)
                            .loggers({logger}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)),
              volt_test::loader(volt_test::blobs(64, 8, 1)));
  EXPECT_EQ(model.seen, (std::vector<int64_t>{2, 3}));
  const auto logged = logger->with("val_seen");
  ASSERT_EQ(logged.size(), 1u);  // the sanity check's value went nowhere
  EXPECT_EQ(logged[0].second.at("val_seen"), 3.0);
}

// Lightning's _run_sanity_check skips the check when its loops restart: a resume inside an
// epoch (a checkpoint written at a batch end, or at the end of the epoch's validation, before
// its epoch-end hooks), or any resume under max_steps. A checkpoint written at the epoch's end
// (ModelCheckpoint's with one validation per epoch) or after the fit resumes with the check, as
// Lightning's epoch progress counts the epoch processed before on_train_epoch_end.
TEST(Hooks, TheSanityCheckIsSkippedOnAResumeInsideAnEpochAsLightnings) {
  class CountsSanity : public volt::Callback {
   public:
    std::string state_key() const override { return "CountsSanity"; }
    void on_sanity_check_start(volt::RunContext&, volt::Module&) override { ++checks; }
    int checks = 0;
  };
  class SaveAtValidationEnd : public volt::Callback {
   public:
    explicit SaveAtValidationEnd(std::string path) : path_(std::move(path)) {}
    std::string state_key() const override { return "SaveAtValidationEnd"; }
    void on_validation_end(volt::RunContext& run, volt::Module&) override {
      if (!run.sanity_checking() && run.state().epoch == 0) run.save_checkpoint(path_);
    }

   private:
    std::string path_;
  };
  volt_test::TempDir dir;
  const std::string at_batch = dir.path + "/batch.ckpt", at_epoch = dir.path + "/epoch.ckpt",
                    at_val = dir.path + "/val.ckpt", after = dir.path + "/after.ckpt";
  auto options = [&] {
    return volt_test::quiet(dir.path)
        .num_sanity_val_steps(1)
        .limit_train_batches(int64_t{3})
        .limit_val_batches(int64_t{2});
  };
  auto train = [] { return volt_test::loader(volt_test::blobs(64)); };
  auto val = [] { return volt_test::loader(volt_test::blobs(64, 8, 1)); };
  {
    volt_test::TinyClassifier model;
    auto counts = std::make_shared<CountsSanity>();
    volt::Trainer first(options().max_epochs(2).callbacks(
        {counts, std::make_shared<volt_test::SaveAt>(0, 1, at_batch),
         std::make_shared<volt_test::SaveAt>(0, -1, at_epoch),
         std::make_shared<SaveAtValidationEnd>(at_val)}));
    first.fit(model, train(), val());
    first.save_checkpoint(after);
    EXPECT_EQ(counts->checks, 1);
  }
  struct Case {
    std::string ckpt;
    bool max_steps;
    int checks;
  };
  for (const Case& c : {Case{at_batch, false, 0}, Case{at_val, false, 0}, Case{at_epoch, false, 1},
                        Case{at_epoch, true, 0}, Case{after, false, 1}, Case{after, true, 0}}) {
    SCOPED_TRACE(c.ckpt + (c.max_steps ? " with max_steps" : ""));
    volt_test::TinyClassifier model;
    auto counts = std::make_shared<CountsSanity>();
    auto opts = options().max_epochs(3).callbacks({counts});
    if (c.max_steps) opts.max_steps(9);
    volt::Trainer resumed(opts);
    resumed.fit(model, train(), val(), c.ckpt);
    EXPECT_EQ(counts->checks, c.checks);
    EXPECT_EQ(resumed.state().global_step, 9);  // the resume trained on either way
  }
}

/// Brings its own callbacks.
class Bringing : public volt_test::TinyClassifier {
 public:
  std::vector<std::shared_ptr<volt::Callback>> configure_callbacks() override { return own; }
  std::vector<std::shared_ptr<volt::Callback>> own;
};

TEST(Hooks, ConfigureCallbacksReplacesTheTrainersOfItsTypeAndCheckpointsGoLast) {
  volt_test::TempDir dir;
  Bringing model;
  auto early = std::make_shared<volt::EarlyStopping>(
      volt::EarlyStoppingOptions("val_acc").mode(volt::Mode::kMax).patience(10));
  model.own = {early};
  auto checkpoint = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "ckpt").monitor("val_loss"));
  auto trainers_early =
      std::make_shared<volt::EarlyStopping>(volt::EarlyStoppingOptions("val_loss"));
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(2)
                            .limit_train_batches(int64_t{2})
                            .limit_val_batches(int64_t{1})
                            .callbacks({checkpoint, trainers_early}));
  const auto lines = volt_test::capture_logs([&] {
    trainer.fit(model, volt_test::loader(volt_test::blobs(64)),
                volt_test::loader(volt_test::blobs(64, 8, 1)));
  });
  ASSERT_EQ(trainer.callbacks().size(), 2u);
  EXPECT_EQ(trainer.callbacks()[0], early);       // the module's, in place of the Trainer's
  EXPECT_EQ(trainer.callbacks()[1], checkpoint);  // checkpoints last
  EXPECT_TRUE(volt_test::has(
      lines, "the module's configure_callbacks() replaces the Trainer's volt::EarlyStopping."));
  EXPECT_EQ(trainer.state().epoch, 1);  // it ran: val_acc, mode max, patience 10
  // Asked again at the next entry point: the same object stays, nothing is replaced twice.
  const auto again = volt_test::capture_logs(
      [&] { trainer.validate(model, volt_test::loader(volt_test::blobs(64))); });
  EXPECT_EQ(trainer.callbacks()[0], early);
  EXPECT_FALSE(volt_test::has(again, "replaces"));
}

TEST(Hooks, ACheckpointAtValidationEndHoldsEarlyStoppingsCountWhicheverOrderTheyAreGiven) {
  // ModelCheckpoint saves last.ckpt at on_validation_end. Given before EarlyStopping it would
  // save the count of the validation before; given after, the checkpoint said the validation was
  // still due, and a resumed fit ran it again and counted it twice (volt until session 45).
  // Now checkpoints run last (as Lightning) and the checkpoint records the validation as run.
  for (const bool checkpoint_first : {true, false}) {
    SCOPED_TRACE(checkpoint_first ? "ModelCheckpoint given first" : "EarlyStopping given first");
    volt_test::TempDir dir;
    auto make = [&] {
      std::vector<std::shared_ptr<volt::Callback>> cbs{
          std::make_shared<volt::EarlyStopping>(
              volt::EarlyStoppingOptions("val_loss").min_delta(100.0).patience(100)),
          std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                      .dirpath(dir / "ckpt")
                                                      .monitor("val_loss")
                                                      .save_last(true))};
      if (checkpoint_first) std::swap(cbs[0], cbs[1]);
      return cbs;
    };
    auto options = [&](const std::vector<std::shared_ptr<volt::Callback>>& cbs, int64_t epochs) {
      return volt_test::quiet(dir.path)
          .max_epochs(epochs)
          .limit_train_batches(int64_t{2})
          .limit_val_batches(int64_t{1})
          .logger(true)  // a CSVLogger, resumed with the fit
          .callbacks(cbs);
    };
    auto early_of = [](const volt::Trainer& t) {
      return std::dynamic_pointer_cast<volt::EarlyStopping>(t.callbacks().front());
    };
    const auto train = volt_test::loader(volt_test::blobs(64));
    const auto val = volt_test::loader(volt_test::blobs(64, 8, 1));
    volt::Trainer trainer(options(make(), 3));
    ASSERT_TRUE(early_of(trainer));  // EarlyStopping first, the checkpoint last
    volt_test::TinyClassifier model;
    trainer.fit(model, train, val);
    EXPECT_EQ(early_of(trainer)->wait_count(), 2);  // the first set the best, two did not improve
    // Resumed from the last checkpoint for one more epoch: one more validation, counted once.
    volt::Trainer resumed(options(make(), 4));
    volt_test::TinyClassifier other;
    const auto lines =
        volt_test::capture_logs([&] { resumed.fit(other, train, val, dir / "ckpt/last.ckpt"); });
    EXPECT_EQ(early_of(resumed)->wait_count(), 3);
    // The step the checkpoint was written at is not saved again (it said it was saved), so no
    // "monitor is not among the logged metrics yet" from a save before this run validated.
    EXPECT_FALSE(volt_test::has(lines, "not among the logged metrics"));
    // The CSV has one val_loss row per epoch: the resumed fit did not validate epoch 2 again.
    std::ifstream csv(resumed.log_dir() + "/metrics.csv");
    std::string header, line;
    std::getline(csv, header);
    size_t column = 0;
    for (size_t at = 0; at < header.find("val_loss"); ++at) column += header[at] == ',';
    int rows = 0;
    while (std::getline(csv, line)) {
      std::vector<std::string> cells(1);
      for (char ch : line) {
        if (ch == ',') {
          cells.emplace_back();
        } else {
          cells.back().push_back(ch);
        }
      }
      rows += column < cells.size() && !cells[column].empty();
    }
    EXPECT_EQ(rows, 4) << resumed.log_dir();
  }
}

TEST(Hooks, ConfigureCallbacksWithANullOrADuplicateStateKeyIsAConfigError) {
  volt_test::TempDir dir;
  Bringing model;
  model.own = {nullptr};
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1));
  const auto data = volt_test::loader(volt_test::blobs(64));
  EXPECT_TRUE(
      volt_test::has(volt_test::error_of<volt::ConfigError>([&] { trainer.fit(model, data); }),
                     "[Trainer] configure_callbacks() returned a null callback"));
  Calls calls;
  volt::Trainer with_one(volt_test::quiet(dir.path).max_epochs(1).callbacks(
      {std::make_shared<HookedCallback>(calls)}));
  // A different type with the same key as one the Trainer has.
  class SameKey : public volt::Callback {
   public:
    std::string state_key() const override { return "HookedCallback"; }
  };
  model.own = {std::make_shared<SameKey>()};
  EXPECT_TRUE(
      volt_test::has(volt_test::error_of<volt::ConfigError>([&] { with_one.fit(model, data); }),
                     "share state_key \"HookedCallback\""));
}

TEST(Hooks, ATunersTrialsRunWithoutTheModulesCallbacks) {
  // As Lightning's tuners, whose trials run without the run's callbacks: a ModelCheckpoint the
  // module brings saves nothing during lr_find's trial steps, and saves in the fit after it.
  volt_test::TempDir dir;
  Bringing model;
  model.own = {std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "ckpt").every_n_train_steps(1).save_last(true))};
  const auto data = volt_test::loader(volt_test::blobs(64));
  const auto found = volt::lr_find(model, data, volt_test::quiet(dir.path),
                                   volt::LrFinderOptions().num_training(5));
  EXPECT_FALSE(found.lrs.empty());
  EXPECT_FALSE(std::filesystem::exists(dir / "ckpt"));
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1).limit_train_batches(int64_t{2}));
  trainer.fit(model, data);
  EXPECT_TRUE(std::filesystem::exists(dir / "ckpt/last.ckpt"));
}

/// Marks the batch on the host, checks the mark and replaces the inputs on the device.
class Transfers : public volt_test::TinyClassifier {
 public:
  explicit Transfers(c10::Device device = c10::kCPU) : device_(device) {}
  volt::Batch on_before_batch_transfer(volt::Batch batch) override {
    EXPECT_TRUE(batch.input.device().is_cpu());
    batch.extra["seen_on_host"] = torch::ones({1});
    return batch;
  }
  volt::Batch transfer_batch_to_device(volt::Batch batch, c10::Device device) override {
    EXPECT_EQ(device.type(), device_.type());  // the run's device
    EXPECT_TRUE(batch.input.device().is_cpu());
    batch.extra["moved"] = torch::ones({1});
    return TinyClassifier::transfer_batch_to_device(std::move(batch), device);
  }
  volt::Batch on_after_batch_transfer(volt::Batch batch) override {
    EXPECT_EQ(batch.extra.count("seen_on_host"), 1u);
    EXPECT_EQ(batch.extra.count("moved"), 1u);
    EXPECT_EQ(batch.input.device().type(), device_.type());
    EXPECT_EQ(batch.extra.at("moved").device().type(), device_.type());
    batch.input = torch::full_like(batch.input, 2.0);
    return batch;
  }
  torch::Tensor predict_step(const volt::Batch& b, int64_t) override { return b.input; }
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    EXPECT_TRUE(torch::all(b.input == 2.0).item<bool>());
    ++steps;
    return TinyClassifier::training_step(b, i);
  }
  int steps = 0;

 private:
  c10::Device device_;
};

TEST(Hooks, TheBatchTransferHooksChangeTheBatchEveryLoopRuns) {
  volt_test::TempDir dir;
  Transfers model;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1).limit_train_batches(int64_t{3}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)));
  EXPECT_EQ(model.steps, 3);
  const auto out = trainer.predict(model, volt_test::loader(volt_test::blobs(32), 16, false));
  ASSERT_EQ(out.size(), 2u);
  for (const auto& t : out) EXPECT_TRUE(torch::all(t == 2.0).item<bool>());
}

// On a GPU: the hooks before the transfer see host tensors, transfer_batch_to_device gets the
// CUDA device, the hook after it and the steps see CUDA tensors.
TEST(HooksCuda, TheBatchTransferHooksSeeTheHostThenTheGpu) {
  VOLT_REQUIRE_CUDA();
  volt_test::TempDir dir;
  Transfers model(c10::Device(c10::kCUDA, 0));
  volt::Trainer trainer(
      volt_test::quiet(dir.path).accelerator("cuda").max_epochs(1).limit_train_batches(int64_t{3}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)));
  EXPECT_EQ(model.steps, 3);
  const auto out = trainer.predict(model, volt_test::loader(volt_test::blobs(32), 16, false));
  ASSERT_EQ(out.size(), 2u);
  for (const auto& t : out) EXPECT_TRUE(torch::all(t == 2.0).item<bool>());
}

/// A module with its own batch hooks, and a DataModule overriding one of them.
class OwnHooks : public volt_test::TinyClassifier {
 public:
  volt::Batch on_before_batch_transfer(volt::Batch batch) override {
    batch.extra["module_before"] = torch::ones({1});
    return batch;
  }
  volt::Batch on_after_batch_transfer(volt::Batch batch) override {
    ++module_after;
    batch.input = torch::full_like(batch.input, 2.0);
    return batch;
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    inputs.push_back(b.input[0][0].item<float>());
    EXPECT_EQ(b.extra.count("module_before"), 1u);  // the DataModule does not override it
    return TinyClassifier::training_step(b, i);
  }
  int module_after = 0;
  std::vector<float> inputs;
};

class Augments : public volt::DataModule {
 public:
  volt::DataLoader train_dataloader() override { return volt_test::loader(volt_test::blobs(32)); }
  volt::Batch on_after_batch_transfer(volt::Batch batch) override {
    batch.input = torch::full_like(batch.input, 3.0);
    return batch;
  }
};

/// An override that calls the DataModule's default first, then changes the batch.
class AugmentsAfterTheDefault : public Augments {
 public:
  volt::Batch on_after_batch_transfer(volt::Batch batch) override {
    batch = volt::DataModule::on_after_batch_transfer(std::move(batch));
    batch.input = torch::full_like(batch.input, 4.0);
    return batch;
  }
};

TEST(Hooks, ADataModulesBatchHookReplacesTheModulesAndItsDefaultsLeaveThemToTheModule) {
  volt_test::TempDir dir;
  OwnHooks with_data, with_data_too, alone;
  Augments augments;
  AugmentsAfterTheDefault after_default;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1));
  trainer.fit(with_data, augments);
  EXPECT_EQ(with_data.inputs, std::vector<float>(2, 3.0f));  // the DataModule's augmentation
  EXPECT_EQ(with_data.module_after, 0);                      // in place of the module's
  trainer.fit(with_data_too, after_default);
  EXPECT_EQ(with_data_too.inputs, std::vector<float>(2, 4.0f));
  EXPECT_EQ(with_data_too.module_after, 0);
  trainer.fit(alone, volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(alone.inputs, std::vector<float>(2, 2.0f));
  EXPECT_EQ(alone.module_after, 2);
}

}  // namespace
