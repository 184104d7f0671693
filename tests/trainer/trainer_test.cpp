#include <gtest/gtest.h>

#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "error_text.h"
#include "log_capture.h"
#include "manual_module.h"
#include "save_at.h"
#include "tiny.h"

namespace {

using volt_test::quiet;
using volt_test::TinyClassifier;

// Records every hook call so tests can check counts and order.
class Recorder : public volt::Callback {
 public:
  std::string state_key() const override { return "Recorder"; }
  void on_train_epoch_start(volt::RunContext&, volt::Module&) override {
    events.push_back("epoch_start");
  }
  void on_train_batch_end(volt::RunContext& r, volt::Module&, const volt::Batch&,
                          int64_t) override {
    ++batches;
    steps_seen.push_back(r.state().global_step);
  }
  void on_validation_end(volt::RunContext& r, volt::Module&) override {
    ++validations;
    events.push_back("val@" + std::to_string(r.state().batches_done));
  }
  void on_train_epoch_end(volt::RunContext&, volt::Module&) override {
    events.push_back("epoch_end");
  }
  void on_exception(volt::RunContext&, volt::Module&, const std::exception& e) override {
    exception = e.what();
  }
  int64_t batches = 0, validations = 0;
  std::vector<int64_t> steps_seen;
  std::vector<std::string> events;
  std::string exception;
};

TEST(Trainer, FitLearnsAndValidateTestPredictWork) {
  volt_test::TempDir dir;
  TinyClassifier model(8, 0.1);
  auto train = volt_test::blobs(512, 8, 1), val = volt_test::blobs(256, 8, 2);
  volt::Trainer trainer(quiet(dir.path).max_epochs(5));
  trainer.fit(model, volt_test::loader(train), volt_test::loader(val, 64, false));
  EXPECT_EQ(trainer.state().status, volt::RunStatus::kFinished);
  EXPECT_EQ(trainer.state().global_step, 5 * 32);
  EXPECT_GT(trainer.callback_metrics().at("val_acc"), 0.9);
  auto m = trainer.validate(model, volt_test::loader(val, 64, false));
  EXPECT_GT(m.at("val_acc"), 0.9);
  auto t = trainer.test(model, volt_test::loader(val, 64, false));
  EXPECT_NEAR(t.at("test_acc"), m.at("val_acc"), 1e-6);  // same data, same metric
  auto preds = trainer.predict(model, volt_test::loader(val, 64, false));
  ASSERT_EQ(preds.size(), 4u);
  EXPECT_EQ(preds[0].sizes(), (std::vector<int64_t>{64}));
}

// A logger failing to close after a successful fit (its last rows cannot be written) fails the
// fit, but only after the other loggers closed and the run was torn down (before session 99 the
// later loggers were never finalized and the module stayed attached to the dead run; on a
// tensor-parallel rank the collective teardown was skipped).
TEST(Trainer, ALoggerFailingToCloseFailsTheFitAfterTheRestClosed) {
  struct FailsToClose : volt_test::MemoryLogger {
    void finalize(volt::RunStatus) override {
      throw volt::ConfigError("[FailsToClose] no space left");
    }
  };
  struct CountsCloses : volt_test::MemoryLogger {
    void finalize(volt::RunStatus status) override { closed.push_back(status); }
    std::vector<volt::RunStatus> closed;
  };
  volt_test::TempDir dir;
  TinyClassifier model;
  auto fails = std::make_shared<FailsToClose>();
  auto counts = std::make_shared<CountsCloses>();
  volt::Trainer trainer(quiet(dir.path).max_epochs(1).loggers({fails, counts}));
  try {
    trainer.fit(model, volt_test::loader(volt_test::blobs(64)));
    ADD_FAILURE() << "no error";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no space left"), std::string::npos) << e.what();
  }
  EXPECT_EQ(counts->closed, (std::vector<volt::RunStatus>{volt::RunStatus::kFinished}));
  EXPECT_EQ(model.run(), nullptr);
  EXPECT_EQ(trainer.state().global_step, 4);
}

TEST(Trainer, LimitsStepsAndValidationSchedule) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(160), val = volt_test::blobs(64);
  {
    TinyClassifier model;
    auto rec = std::make_shared<Recorder>();
    volt::Trainer t(quiet(dir.path).max_epochs(2).limit_train_batches(4).callbacks({rec}));
    t.fit(model, volt_test::loader(train), volt_test::loader(val));
    EXPECT_EQ(rec->batches, 8);
    EXPECT_EQ(rec->validations, 2);
  }
  {
    TinyClassifier model;
    auto rec = std::make_shared<Recorder>();
    volt::Trainer t(quiet(dir.path).max_steps(13).callbacks({rec}));
    t.fit(model, volt_test::loader(train));
    EXPECT_EQ(t.state().global_step, 13);
    EXPECT_EQ(t.state().epoch, 1);  // 10 batches per epoch
  }
  {
    TinyClassifier model;
    auto rec = std::make_shared<Recorder>();
    volt::Trainer t(quiet(dir.path).max_epochs(1).val_check_interval(0.5).callbacks({rec}));
    t.fit(model, volt_test::loader(train), volt_test::loader(val));
    EXPECT_EQ(rec->events,
              (std::vector<std::string>{"epoch_start", "val@5", "val@10", "epoch_end"}));
  }
  {
    // 0.0 validates after every batch (Lightning's max(1, int(batches * 0.0))); it was refused.
    TinyClassifier model;
    auto rec = std::make_shared<Recorder>();
    volt::Trainer t(quiet(dir.path)
                        .max_epochs(1)
                        .limit_train_batches(int64_t{3})
                        .val_check_interval(0.0)
                        .callbacks({rec}));
    t.fit(model, volt_test::loader(train), volt_test::loader(val));
    EXPECT_EQ(rec->events,
              (std::vector<std::string>{"epoch_start", "val@1", "val@2", "val@3", "epoch_end"}));
  }
  {
    TinyClassifier model;
    auto rec = std::make_shared<Recorder>();
    volt::Trainer t(
        quiet(dir.path).max_epochs(4).check_val_every_n_epoch(2).val_check_interval(3).callbacks(
            {rec}));
    t.fit(model, volt_test::loader(train), volt_test::loader(val));
    EXPECT_EQ(rec->validations, 2 * 3);  // epochs 1 and 3, batches 3, 6, 9
  }
  {
    TinyClassifier model;
    auto rec = std::make_shared<Recorder>();
    volt::Trainer t(
        quiet(dir.path).max_epochs(3).limit_train_batches(0.25).limit_val_batches(0).callbacks(
            {rec}));
    t.fit(model, volt_test::loader(train), volt_test::loader(val));
    EXPECT_EQ(rec->batches, 3 * 2);
    EXPECT_EQ(rec->validations, 0);
  }
}

TEST(Trainer, AccumulationStepsOncePerKBatchesAndAtEpochEnd) {
  volt_test::TempDir dir;
  TinyClassifier model;
  auto rec = std::make_shared<Recorder>();
  volt::Trainer t(quiet(dir.path).max_epochs(2).accumulate_grad_batches(3).callbacks({rec}));
  t.fit(model, volt_test::loader(volt_test::blobs(160)));  // 10 batches: steps after 3,6,9,10
  EXPECT_EQ(t.state().global_step, 8);
  EXPECT_EQ(std::vector<int64_t>(rec->steps_seen.begin(), rec->steps_seen.begin() + 10),
            (std::vector<int64_t>{0, 0, 1, 1, 1, 2, 2, 2, 3, 4}));
}

// Gives `b` the weights of `a` and turns dropout off in both.
void make_twins(TinyClassifier& a, TinyClassifier& b) {
  a.drop->options.p(0.0);
  b.drop->options.p(0.0);
  torch::NoGradGuard g;
  for (size_t i = 0; i < a.parameters().size(); ++i) b.parameters()[i].copy_(a.parameters()[i]);
}

// Accumulating k micro-batches equals one step on their union (mean losses, no dropout).
TEST(Trainer, AccumulationMatchesTheLargeBatchStep) {
  volt_test::TempDir dir;
  auto ds = volt_test::blobs(32);
  TinyClassifier a, b;
  make_twins(a, b);
  volt::Trainer ta(quiet(dir.path).max_steps(1).accumulate_grad_batches(4));
  ta.fit(a, volt_test::loader(ds, 8, false));
  volt::Trainer tb(quiet(dir.path).max_steps(1));
  tb.fit(b, volt_test::loader(ds, 32, false));
  EXPECT_TRUE(torch::allclose(a.flat_params(), b.flat_params(), 1e-5, 1e-6));
}

// The loop zeroes gradients after each step; what the parameters hold when fit() starts (a
// program's own backward, or an elastic restart's failed attempt) must not reach the first step.
TEST(Trainer, GradientsLeftBeforeFitDoNotReachTheFirstStep) {
  volt_test::TempDir dir;
  auto ds = volt_test::blobs(32);
  TinyClassifier a, b;
  make_twins(a, b);
  for (auto& p : b.parameters()) p.mutable_grad() = torch::full_like(p, 0.5);
  volt::Trainer ta(quiet(dir.path + "/a").max_steps(2));
  ta.fit(a, volt_test::loader(ds, 8, false));
  volt::Trainer tb(quiet(dir.path + "/b").max_steps(2));
  tb.fit(b, volt_test::loader(ds, 8, false));
  EXPECT_TRUE(torch::equal(a.flat_params(), b.flat_params()));
}

TEST(Trainer, GradientClippingBoundsTheFirstStep) {
  volt_test::TempDir dir;
  for (auto algo : {volt::ClipAlgorithm::kNorm, volt::ClipAlgorithm::kValue}) {
    TinyClassifier model(8, /*lr=*/1.0);
    auto before = model.flat_params();
    volt::Trainer t(
        quiet(dir.path).max_steps(1).gradient_clip_val(1e-3).gradient_clip_algorithm(algo));
    t.fit(model, volt_test::loader(volt_test::blobs(64)));
    auto delta = model.flat_params() - before;  // first SGD step: lr * clipped grad
    if (algo == volt::ClipAlgorithm::kNorm) {
      EXPECT_LE(delta.norm().item<double>(), 1e-3 * 1.0001);
    } else {
      EXPECT_LE(delta.abs().max().item<double>(), 1e-3 * 1.0001);
    }
    EXPECT_GT(delta.abs().max().item<double>(), 0.0);
  }
}

class NanModule : public TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    auto loss = TinyClassifier::training_step(b, i);
    return global_step() == 4 ? loss * std::numeric_limits<float>::quiet_NaN() : loss;
  }
};

TEST(Trainer, NonFiniteLossRaisesNamingTheStep) {
  volt_test::TempDir dir;
  NanModule model;
  volt::Trainer t(quiet(dir.path).max_epochs(1));
  try {
    t.fit(model, volt_test::loader(volt_test::blobs(160)));
    FAIL();
  } catch (const volt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("global step 4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.state().status, volt::RunStatus::kFailed);
  NanModule again;
  volt::Trainer lenient(quiet(dir.path).max_epochs(1).detect_nonfinite_loss(false));
  EXPECT_NO_THROW(lenient.fit(again, volt_test::loader(volt_test::blobs(160))));
}

// The check reads the device once per logging interval: with log_every_n_steps=3 the losses of
// steps 3, 4, 5 are read together in step 5's forward, and the error still names step 4; with 1
// it reads every step and stops at step 4 itself.
TEST(Trainer, NonFiniteLossIsReadAtTheLoggingCadenceAndNamesTheFirstBadStep) {
  for (const int64_t every : {1, 3}) {
    volt_test::TempDir dir;
    NanModule model;
    volt::Trainer t(quiet(dir.path).max_epochs(1).log_every_n_steps(every));
    std::string msg;
    try {
      t.fit(model, volt_test::loader(volt_test::blobs(160)));
    } catch (const volt::ValueError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("the training loss is nan at global step 4 (epoch 0, batch 4)"),
              std::string::npos)
        << msg;
    EXPECT_EQ(t.state().global_step, every == 1 ? 4 : 5) << msg;
    EXPECT_EQ(msg.find("found at global step") != std::string::npos, every == 3) << msg;
  }
}

// Writing a checkpoint reads the unchecked losses first: weights stepped with a NaN loss are
// never saved, and the file is not created.
class SaveAtStep : public volt::Callback {
 public:
  explicit SaveAtStep(std::string path) : path_(std::move(path)) {}
  std::string state_key() const override { return "SaveAtStep"; }
  void on_train_batch_end(volt::RunContext& r, volt::Module&, const volt::Batch&,
                          int64_t) override {
    if (r.state().global_step == 2 || r.state().global_step == 5)
      r.save_checkpoint(path_ + std::to_string(r.state().global_step));
  }

 private:
  std::string path_;
};

TEST(Trainer, ACheckpointIsNeverWrittenAfterAnUncheckedNonFiniteLoss) {
  volt_test::TempDir dir;
  NanModule model;
  const std::string prefix = dir.path + "/step";
  volt::Trainer t(quiet(dir.path).max_epochs(1).log_every_n_steps(50).callbacks(
      {std::make_shared<SaveAtStep>(prefix)}));
  std::string msg;
  try {
    t.fit(model, volt_test::loader(volt_test::blobs(160)));
  } catch (const volt::ValueError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("global step 4"), std::string::npos) << msg;
  EXPECT_TRUE(std::filesystem::exists(prefix + "2"));
  EXPECT_FALSE(std::filesystem::exists(prefix + "5"));
  EXPECT_EQ(t.state().global_step, 5);
}

// deterministic=true: deterministic algorithms on, and the cuBLAS workspace that makes CUDA
// matmuls repeatable (a value the user set is kept).
TEST(Trainer, DeterministicTurnsOnDeterministicAlgorithmsAndTheCublasWorkspace) {
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  volt_test::TempDir dir;
  { volt::Trainer t(quiet(dir.path).deterministic(true)); }
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  ASSERT_NE(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":4096:8");
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
  { volt::Trainer t(quiet(dir.path).deterministic(true)); }
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":16:8");
  at::globalContext().setDeterministicAlgorithms(false, false);
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
}

// benchmark, as Lightning's: set for the process at construction when given; unset keeps the
// current setting, except that deterministic turns autotuning off; true with deterministic
// warns and is kept.
TEST(Trainer, BenchmarkSetsCudnnAutotuningAsLightningDoes) {
  auto& ctx = at::globalContext();
  const bool before = ctx.benchmarkCuDNN();
  volt_test::TempDir dir;
  { volt::Trainer t(quiet(dir.path).benchmark(true)); }
  EXPECT_TRUE(ctx.benchmarkCuDNN());
  { volt::Trainer t(quiet(dir.path)); }
  EXPECT_TRUE(ctx.benchmarkCuDNN()) << "unset must keep the process's setting";
  { volt::Trainer t(quiet(dir.path).benchmark(false)); }
  EXPECT_FALSE(ctx.benchmarkCuDNN());
  ctx.setBenchmarkCuDNN(true);
  { volt::Trainer t(quiet(dir.path).deterministic(true)); }
  EXPECT_FALSE(ctx.benchmarkCuDNN()) << "deterministic without benchmark turns it off";
  const auto lines = volt_test::capture_logs(
      [&] { volt::Trainer t(quiet(dir.path).deterministic(true).benchmark(true)); });
  EXPECT_TRUE(ctx.benchmarkCuDNN());
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("benchmark=true with deterministic=true") != std::string::npos;
  }));
  ctx.setDeterministicAlgorithms(false, false);
  ctx.setDeterministicCuDNN(false);
  ctx.setBenchmarkCuDNN(before);
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
}

class ThrowingCallback : public volt::Callback {
 public:
  std::string state_key() const override { return "Throwing"; }
  void on_train_batch_end(volt::RunContext& r, volt::Module&, const volt::Batch&,
                          int64_t) override {
    if (r.state().global_step == 7) throw std::runtime_error("user hook failed at step 7");
  }
};

// The Trainer's init_module(): a bf16-true model built inside is bfloat16 before fit and trains.
TEST(Trainer, InitModuleBuildsBf16TrueModelsInBfloat16) {
  volt_test::TempDir dir;
  volt::Trainer trainer(volt_test::quiet(dir.path).precision("bf16-true").max_epochs(1));
  std::shared_ptr<TinyClassifier> m;
  {
    auto init = trainer.init_module();
    m = std::make_shared<TinyClassifier>();
  }
  EXPECT_EQ(at::empty({1}).scalar_type(), at::kFloat);
  EXPECT_EQ(m->fc1->weight.scalar_type(), at::kBFloat16);
  const at::Tensor before = m->fc1->weight.detach().clone();
  trainer.fit(*m, volt_test::loader(volt_test::blobs(64), 16));
  EXPECT_EQ(m->fc1->weight.scalar_type(), at::kBFloat16);
  EXPECT_FALSE(at::equal(before, m->fc1->weight));
  volt::Trainer fp32(volt_test::quiet(dir.path));
  EXPECT_EQ(fp32.init_module(), nullptr);
}

// init_module(true): a model whose weights a checkpoint replaces is built without running its
// initializers (the generator draws nothing for them), in bfloat16 under bf16-true, and
// load_weights gives it the trained weights.
TEST(Trainer, InitModuleWithEmptyInitLeavesTheWeightsToTheCheckpoint) {
  volt_test::TempDir dir;
  volt::Trainer first(volt_test::quiet(dir.path).precision("bf16-true").max_epochs(1));
  auto trained = std::make_shared<TinyClassifier>();
  first.fit(*trained, volt_test::loader(volt_test::blobs(64), 16));
  first.save_checkpoint(dir / "trained.ckpt", /*weights_only=*/true);
  volt::Trainer trainer(volt_test::quiet(dir.path).precision("bf16-true"));
  torch::manual_seed(5);
  const at::Tensor fresh = torch::rand({8});
  torch::manual_seed(5);
  std::shared_ptr<TinyClassifier> m;
  {
    auto init = trainer.init_module(/*empty_init=*/true);
    m = std::make_shared<TinyClassifier>();
  }
  EXPECT_TRUE(torch::equal(torch::rand({8}), fresh)) << "an initializer ran";
  EXPECT_FALSE(volt::EmptyInit::active());
  EXPECT_EQ(m->fc1->weight.scalar_type(), at::kBFloat16);
  volt::load_weights(*m, dir / "trained.ckpt");
  EXPECT_TRUE(torch::equal(m->flat_params(), trained->flat_params()));
  EXPECT_NE(volt::Trainer(volt_test::quiet(dir.path)).init_module(true), nullptr);
}

TEST(Trainer, ExceptionInAHookEndsCleanlyAndKeepsTheLastCheckpoint) {
  volt_test::TempDir dir;
  TinyClassifier model;
  auto rec = std::make_shared<Recorder>();
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                          .dirpath(dir / "ckpt")
                                                          .every_n_train_steps(2)
                                                          .save_last(true)
                                                          .save_top_k(0));
  auto logger = std::make_shared<volt::CSVLogger>(
      volt::CSVLoggerOptions(dir.path).flush_logs_every_n_steps(1000));
  volt::Trainer t(quiet(dir.path)
                      .max_epochs(3)
                      .log_every_n_steps(1)
                      .callbacks({ckpt, std::make_shared<ThrowingCallback>(), rec})
                      .loggers({logger}));
  EXPECT_THROW(t.fit(model, volt_test::loader(volt_test::blobs(160))), std::runtime_error);
  EXPECT_EQ(rec->exception, "user hook failed at step 7");
  EXPECT_EQ(t.state().status, volt::RunStatus::kFailed);
  // The last checkpoint (step 6) is intact and resumable.
  auto in = volt::TorchCheckpointIO().load(dir / "ckpt/last.ckpt");
  torch::serialize::InputArchive loop;
  in.read("loop", loop);
  c10::IValue step;
  loop.read("global_step", step);
  EXPECT_EQ(step.toInt(), 6);
  // The logger was flushed on failure even though its buffer was not full.
  std::ifstream csv(logger->metrics_path());
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "step,epoch,train_loss");  // every row carries the epoch (session 99)
  TinyClassifier resumed;
  volt::Trainer t2(quiet(dir.path).max_epochs(3));
  t2.fit(resumed, volt_test::loader(volt_test::blobs(160)), c10::nullopt, dir / "ckpt/last.ckpt");
  EXPECT_EQ(t2.state().global_step, 30);
}

TEST(Trainer, CheckpointFromAnotherModelListsMismatches) {
  volt_test::TempDir dir;
  TinyClassifier small(8);
  volt::Trainer t(quiet(dir.path).max_steps(2));
  t.fit(small, volt_test::loader(volt_test::blobs(64)));
  t.save_checkpoint(dir / "small.ckpt");
  TinyClassifier other(5);
  volt::Trainer t2(quiet(dir.path).max_steps(4));
  try {
    t2.fit(other, volt_test::loader(volt_test::blobs(64, 5)), c10::nullopt, dir / "small.ckpt");
    FAIL();
  } catch (const volt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("fc1.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("small.ckpt"), std::string::npos) << e.what();
  }
}

using ManualModule = volt_test::ManualTinyClassifier;

TEST(Trainer, ManualOptimization) {
  volt_test::TempDir dir;
  ManualModule model;
  auto before = model.flat_params();
  volt::Trainer t(quiet(dir.path).max_epochs(2));
  t.fit(model, volt_test::loader(volt_test::blobs(160)));
  EXPECT_EQ(t.state().global_step, 20);
  EXPECT_FALSE(model.flat_params().equal(before));
  ManualModule clipped;
  volt::Trainer bad(quiet(dir.path).max_epochs(1).gradient_clip_val(1.0));
  EXPECT_THROW(bad.fit(clipped, volt_test::loader(volt_test::blobs(160))), volt::ConfigError);
}

// A step replayed from a CUDA graph ran the optimizer inside the graph; count_step() makes it
// count (global_step) without running the optimizer again. Here the "replayed" odd batches do
// no work, so the weights must equal a module that skips them, and only the step count differs.
class HalfStepModule : public TinyClassifier {
 public:
  explicit HalfStepModule(bool count) : count_(count) { set_automatic_optimization(false); }
  torch::Tensor training_step(const volt::Batch& b, int64_t idx) override {
    auto opt = optimizers().at(0);
    if (idx % 2 == 0) {
      opt.zero_grad();
      manual_backward(torch::cross_entropy_loss(forward(b.input), b.target));
      opt.step();
    } else if (count_) {
      opt.count_step();
    }
    return {};
  }

 private:
  bool count_;
};

TEST(Trainer, ManualCountStepAdvancesTheStepWithoutStepping) {
  volt_test::TempDir dir;
  torch::manual_seed(5);
  HalfStepModule counted(true);
  torch::manual_seed(5);
  HalfStepModule skipped(false);
  volt::Trainer a(quiet(dir.path).max_epochs(1));
  a.fit(counted, volt_test::loader(volt_test::blobs(160), 16, /*shuffle=*/false));
  volt::Trainer b(quiet(dir.path).max_epochs(1));
  b.fit(skipped, volt_test::loader(volt_test::blobs(160), 16, false));
  EXPECT_EQ(a.state().global_step, 10);
  EXPECT_EQ(b.state().global_step, 5);
  EXPECT_TRUE(counted.flat_params().equal(skipped.flat_params()));
}

TEST(Trainer, SchedulerIntervalsAndFrequency) {
  volt_test::TempDir dir;
  {
    // Observe the lr the optimizer really used, from inside the run.
    struct LrProbe : volt::Callback {
      std::string state_key() const override { return "LrProbe"; }
      void on_before_optimizer_step(volt::RunContext&, volt::Module&,
                                    torch::optim::Optimizer& o) override {
        lrs.push_back(o.param_groups()[0].options().get_lr());
      }
      std::vector<double> lrs;
    };
    auto probe = std::make_shared<LrProbe>();
    TinyClassifier model(8, 0.1);
    model.scheduler_step_size = 1;
    model.scheduler_interval = volt::Interval::kStep;
    model.scheduler_frequency = 2;
    volt::Trainer t(quiet(dir.path).max_steps(6).callbacks({probe}));
    t.fit(model, volt_test::loader(volt_test::blobs(160)));
    std::vector<double> expect = {0.1, 0.1, 0.05, 0.05, 0.025, 0.025};
    ASSERT_EQ(probe->lrs.size(), expect.size());
    for (size_t i = 0; i < expect.size(); ++i) EXPECT_NEAR(probe->lrs[i], expect[i], 1e-12);

    auto probe2 = std::make_shared<LrProbe>();
    TinyClassifier m2(8, 0.1);
    m2.scheduler_step_size = 1;  // epoch interval: halves after each epoch
    volt::Trainer t2(quiet(dir.path).max_epochs(3).limit_train_batches(2).callbacks({probe2}));
    t2.fit(m2, volt_test::loader(volt_test::blobs(160)));
    std::vector<double> expect2 = {0.1, 0.1, 0.05, 0.05, 0.025, 0.025};
    ASSERT_EQ(probe2->lrs.size(), expect2.size());
    for (size_t i = 0; i < expect2.size(); ++i) EXPECT_NEAR(probe2->lrs[i], expect2[i], 1e-12);
  }
}

class BothModule : public TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto loss = torch::cross_entropy_loss(forward(b.input), b.target);
    log("loss", loss, volt::LogOptions().on_step(true).on_epoch(true));
    log("bs", static_cast<double>(b.size()),
        volt::LogOptions().on_step(false).on_epoch(true).reduce(volt::Reduce::kSum));
    return loss;
  }
};

TEST(Trainer, LoggingStepEpochKeysAndReductions) {
  volt_test::TempDir dir;
  BothModule model;
  auto logger = std::make_shared<volt::CSVLogger>(volt::CSVLoggerOptions(dir.path));
  volt::Trainer t(quiet(dir.path).max_epochs(2).log_every_n_steps(5).loggers({logger}));
  t.fit(model, volt_test::loader(volt_test::blobs(150)));  // 10 batches: 9 of 16, one of 6
  const auto& m = t.logged_metrics();
  EXPECT_TRUE(m.count("loss_step"));
  EXPECT_TRUE(m.count("loss_epoch"));
  EXPECT_DOUBLE_EQ(m.at("bs"), 150.0);              // kSum over the epoch
  EXPECT_TRUE(t.callback_metrics().count("loss"));  // "x_epoch" also answers to "x"
  std::ifstream csv(logger->metrics_path());
  std::string header, line;
  std::getline(csv, header);
  EXPECT_NE(header.find("loss_step"), std::string::npos);
  EXPECT_NE(header.find("loss_epoch"), std::string::npos);
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  EXPECT_EQ(rows, 4 + 2);  // steps 5,10,15,20 + two epoch rows
}

// What callback_metrics() holds for "loss" (logged on_step and on_epoch) at each batch's end and
// at the epoch's end, beside "loss_step" and "loss_epoch".
class PlainNameProbe : public volt::Callback {
 public:
  std::string state_key() const override { return "PlainNameProbe"; }
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t) override {
    const auto& m = run.callback_metrics();
    at_batch_end.push_back(m.count("loss") != 0 && m.at("loss") == m.at("loss_step"));
  }
  void on_train_epoch_end(volt::RunContext& run, volt::Module&) override {
    const auto& m = run.callback_metrics();
    at_epoch_end.push_back(m.count("loss") != 0 && m.at("loss") == m.at("loss_epoch"));
  }
  std::vector<bool> at_batch_end, at_epoch_end;
};

TEST(Trainer, APlainNameLoggedPerStepAndEpochIsTheLatestStepWhileTraining) {
  // Lightning's callback metrics hold both "loss" and "loss_step" while training, so a
  // monitor on "loss" sees the latest step; the epoch's mean replaces it at the epoch's end.
  // volt had no "loss" during the first epoch (a step-interval monitor on it was a ConfigError)
  // and the previous epoch's mean during the later ones.
  volt_test::TempDir dir;
  BothModule model;
  auto probe = std::make_shared<PlainNameProbe>();
  volt::Trainer t(quiet(dir.path).max_epochs(2).callbacks({probe}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)));  // 4 batches an epoch
  EXPECT_EQ(probe->at_batch_end, std::vector<bool>(8, true));
  EXPECT_EQ(probe->at_epoch_end, std::vector<bool>(2, true));
}

TEST(Trainer, EachEntryPointStartsWithoutThePreviousOnesMetrics) {
  // Lightning's Trainer._run resets its results and metrics: after fit then test,
  // callback_metrics() and logged_metrics() hold the test's values only (they kept the fit's
  // "loss_step", "loss" and "bs" beside them).
  volt_test::TempDir dir;
  BothModule model;
  auto logger = std::make_shared<volt::CSVLogger>(volt::CSVLoggerOptions(dir.path));
  volt::Trainer t(quiet(dir.path).max_epochs(1).loggers({logger}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)));
  ASSERT_TRUE(t.callback_metrics().count("loss_step"));
  ASSERT_TRUE(t.logged_metrics().count("bs"));
  t.test(model, volt_test::loader(volt_test::blobs(32)));
  for (const auto* m : {&t.callback_metrics(), &t.logged_metrics()}) {
    EXPECT_FALSE(m->count("loss_step"));
    EXPECT_FALSE(m->count("loss"));
    EXPECT_FALSE(m->count("bs"));
  }
  EXPECT_TRUE(t.callback_metrics().count("test_acc"));
  EXPECT_TRUE(t.logged_metrics().count("test_acc"));
}

// Lightning 2.6's time-based val_check_interval: validation after the first batch that ends the
// interval (counted from training's start and each validation's end), on the epochs
// check_val_every_n_epoch selects, and none at an epoch's end otherwise.
TEST(Trainer, ValCheckIntervalSValidatesByTrainingTime) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(96), val = volt_test::blobs(32);  // 6 training batches
  const auto fit = [&](volt::TrainerOptions o, int64_t sleep_ms = 0) {
    // Its steps take at least sleep_ms: the clock is read after the step, before the batch's
    // end hooks.
    struct Slow : TinyClassifier {
      explicit Slow(int64_t ms) : ms_(ms) {}
      torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms_));
        return TinyClassifier::training_step(b, i);
      }
      int64_t ms_;
    };
    // Also the fit's batch count at each validation.
    struct Totals : Recorder {
      void on_validation_end(volt::RunContext& r, volt::Module& m) override {
        Recorder::on_validation_end(r, m);
        totals.push_back(r.state().total_batches_done);
      }
      std::vector<int64_t> totals;
    };
    Slow model(sleep_ms);
    auto rec = std::make_shared<Totals>();
    volt::Trainer t(o.callbacks({rec}));
    t.fit(model, volt_test::loader(train), volt_test::loader(val));
    return rec;
  };
  // 0 s: after every batch.
  EXPECT_EQ(fit(quiet(dir.path).max_epochs(1).val_check_interval_s(0.0))->events,
            (std::vector<std::string>{"epoch_start", "val@1", "val@2", "val@3", "val@4", "val@5",
                                      "val@6", "epoch_end"}));
  // Longer than the fit: never, not even at the epochs' ends.
  EXPECT_EQ(fit(quiet(dir.path).max_epochs(2).val_check_interval_s(1e6))->validations, 0);
  // Only on the epochs check_val_every_n_epoch selects (here the second of two).
  const auto second =
      fit(quiet(dir.path).max_epochs(2).check_val_every_n_epoch(2).val_check_interval_s(0.0));
  EXPECT_EQ(second->validations, 6);
  EXPECT_EQ(second->events.front(), "epoch_start");
  EXPECT_EQ(second->events.at(1), "epoch_end");
  // 30 ms a batch, every 0.07 s: at most 3 batches apart over the whole fit (the clock cannot
  // be behind), and it starts again after each validation (else every batch after the first
  // would validate). Unset check_val_every_n_epoch is allowed with it.
  const auto timed = fit(quiet(dir.path)
                             .max_epochs(2)
                             .check_val_every_n_epoch(c10::nullopt)
                             .val_check_interval_s(0.07),
                         30);
  ASSERT_GE(timed->validations, 4);
  EXPECT_LE(timed->validations, 8);
  int64_t previous = 0;
  for (const int64_t at : timed->totals) {
    EXPECT_LE(at - previous, 3) << "validation after batch " << at;
    previous = at;
  }
  EXPECT_GE(previous, 10);  // the last validation near the fit's end (12 batches)
  // It says when to validate alone: with a val_check_interval other than 1.0 it is refused.
  EXPECT_NE(volt_test::error_of<volt::ConfigError>([] {
              volt::TrainerOptions().val_check_interval(0.5).val_check_interval_s(60.0).validate();
            }).find("both say when to validate; keep one"),
            std::string::npos);
  EXPECT_NE(volt_test::error_of<volt::ConfigError>([] {
              volt::TrainerOptions().val_check_interval_s(-1.0).validate();
            }).find("val_check_interval_s=-1 is no duration"),
            std::string::npos);
}

TEST(Trainer, FastDevRunWritesNothing) {
  volt_test::TempDir dir;
  TinyClassifier model;
  auto rec = std::make_shared<Recorder>();
  volt::Trainer t(volt::TrainerOptions()
                      .accelerator("cpu")
                      .default_root_dir(dir.path)
                      .fast_dev_run(2)
                      .enable_progress_bar(false)
                      .callbacks({rec}));
  t.fit(model, volt_test::loader(volt_test::blobs(160)), volt_test::loader(volt_test::blobs(64)));
  EXPECT_EQ(rec->batches, 2);
  EXPECT_EQ(rec->validations, 1);
  EXPECT_TRUE(t.loggers().empty());
  DIR* d = opendir(dir.path.c_str());
  int entries = 0;
  while (dirent* e = readdir(d)) entries += e->d_name[0] != '.';
  closedir(d);
  EXPECT_EQ(entries, 0);
  // It replaces the limits, as Lightning's: limit_*_batches=0 still runs its batches.
  TinyClassifier again;
  auto rec2 = std::make_shared<Recorder>();
  volt::Trainer limited(quiet(dir.path)
                            .fast_dev_run(2)
                            .limit_train_batches(int64_t{0})
                            .limit_val_batches(int64_t{0})
                            .limit_test_batches(int64_t{0})
                            .limit_predict_batches(0.01)  // would be refused as below one batch
                            .callbacks({rec2}));
  limited.fit(again, volt_test::loader(volt_test::blobs(160)),
              volt_test::loader(volt_test::blobs(64)));
  EXPECT_EQ(rec2->batches, 2);
  EXPECT_EQ(rec2->validations, 1);
  EXPECT_EQ(limited.test(again, volt_test::loader(volt_test::blobs(64))).count("test_acc"), 1u);
  EXPECT_EQ(limited.predict(again, volt_test::loader(volt_test::blobs(64))).size(), 2u);
}

TEST(Trainer, MaxTimeStops) {
  volt_test::TempDir dir;
  TinyClassifier model;
  volt::Trainer t(quiet(dir.path).max_epochs(1000).max_time(1e-6));
  t.fit(model, volt_test::loader(volt_test::blobs(160)));
  EXPECT_EQ(t.state().global_step, 1);
}

// Lightning's _should_check_val_fx: a stop requested mid-epoch (request_stop(), max_time) runs
// the epoch's validation at the stopping batch, so ModelCheckpoint and EarlyStopping see the
// weights the fit leaves with; volt skipped it, and a checkpoint saved there carried the previous
// validation's score. Reaching max_steps does not validate (nor in Lightning), nor an epoch that
// check_val_every_n_epoch skips, and a stop at a due validation validates once.
TEST(Trainer, AStopRequestMidEpochValidatesTheWeightsItLeavesWith) {
  class StopsAt : public volt::Callback {
   public:
    std::string state_key() const override { return "StopsAt"; }
    explicit StopsAt(int64_t batch) : batch_(batch) {}
    void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                            int64_t batch_idx) override {
      if (batch_idx == batch_) run.request_stop();
    }
    void on_validation_end(volt::RunContext& run, volt::Module&) override {
      validated_at.push_back(run.state().global_step);
    }
    std::vector<int64_t> validated_at;

   private:
    int64_t batch_;
  };
  struct Case {
    const char* what;
    int64_t stop_at;  // -1: no request
    volt::TrainerOptions options;
    int64_t steps;
    std::vector<int64_t> validated_at;
  };
  volt_test::TempDir dir;
  // 112 rows at batch 16: 7 batches an epoch.
  const std::vector<Case> cases = {
      {"request_stop at batch 2", 2, quiet(dir.path).max_epochs(3), 3, {3}},
      {"request_stop at the last batch, where validation is due",
       6,
       quiet(dir.path).max_epochs(3),
       7,
       {7}},
      {"request_stop in an epoch check_val_every_n_epoch skips",
       2,
       quiet(dir.path).max_epochs(3).check_val_every_n_epoch(2),
       3,
       {}},
      {"request_stop deferred by min_epochs=1 to the end of epoch 0",
       2,
       quiet(dir.path).max_epochs(3).min_epochs(1),
       7,
       {7}},
      {"max_time", -1, quiet(dir.path).max_epochs(3).max_time(1e-6), 1, {1}},
      {"max_steps mid-epoch", -1, quiet(dir.path).max_epochs(3).max_steps(3), 3, {}},
  };
  for (const auto& c : cases) {
    TinyClassifier model;
    auto stops = std::make_shared<StopsAt>(c.stop_at);
    volt::Trainer t(volt::TrainerOptions(c.options).callbacks({stops}));
    t.fit(model, volt_test::loader(volt_test::blobs(112)),
          volt_test::loader(volt_test::blobs(32), 16, false));
    EXPECT_EQ(t.state().global_step, c.steps) << c.what;
    EXPECT_EQ(stops->validated_at, c.validated_at) << c.what;
  }
}

// Lightning reduces what a Callback logs in its epoch-end hooks with the epoch's own values.
// volt reduced the epoch before the callbacks' hooks: the validation and test values were
// dropped (a ModelCheckpoint could not monitor them), the training ones waited for the next
// epoch, were averaged with its value there, and the last epoch's never reached a logger.
TEST(Trainer, ValuesACallbackLogsAtEpochEndBelongToThatEpoch) {
  class LogsAtEpochEnd : public volt::Callback {
   public:
    std::string state_key() const override { return "LogsAtEpochEnd"; }
    void on_train_epoch_end(volt::RunContext& run, volt::Module&) override {
      run.log("cb_train", torch::tensor(static_cast<double>(run.state().epoch)), {});
    }
    void on_validation_epoch_end(volt::RunContext& run, volt::Module&) override {
      run.log("cb_val", torch::tensor(100.0 + static_cast<double>(run.state().epoch)), {});
    }
    void on_test_epoch_end(volt::RunContext& run, volt::Module&) override {
      run.log("cb_test", torch::tensor(7.0), {});
    }
  };
  volt_test::TempDir dir;
  TinyClassifier model;
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  // Listed after the callback that logs, as Lightning requires for a monitored callback value.
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                          .dirpath(dir / "ckpt")
                                                          .monitor("cb_val")
                                                          .mode(volt::Mode::kMax));
  volt::Trainer t(quiet(dir.path)
                      .max_epochs(2)
                      .num_sanity_val_steps(2)
                      .callbacks({std::make_shared<LogsAtEpochEnd>(), ckpt})
                      .loggers({logger}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)),
        volt_test::loader(volt_test::blobs(32), 16, false));
  const auto train = logger->with("cb_train");
  ASSERT_EQ(train.size(), 2u);
  EXPECT_EQ(train[0].second.at("cb_train"), 0.0);
  EXPECT_EQ(train[1].second.at("cb_train"), 1.0);
  EXPECT_EQ(train[1].second.at("epoch"), 1.0);
  const auto val = logger->with("cb_val");  // not the sanity check's
  ASSERT_EQ(val.size(), 2u);
  EXPECT_EQ(val[0].second.at("cb_val"), 100.0);
  EXPECT_EQ(val[1].second.at("cb_val"), 101.0);
  ASSERT_TRUE(ckpt->best_model_score().has_value());
  EXPECT_EQ(*ckpt->best_model_score(), 101.0);
  EXPECT_EQ(t.callback_metrics().at("cb_val"), 101.0);
  const auto tested = t.test(model, volt_test::loader(volt_test::blobs(32), 16, false));
  EXPECT_EQ(tested.at("cb_test"), 7.0);
  EXPECT_EQ(logger->with("cb_test").size(), 1u);
}

// Rows reach the loggers as Lightning's LoggerConnector.log_metrics sends them: each step row
// carries the epoch (before session 99 only epoch-end rows did: metrics.csv's epoch column was
// blank on every step row), and a value logged as "step" is the row's step instead of a column
// (it went to the loggers as a metric and the row stayed at the global step).
TEST(Trainer, StepRowsCarryTheEpochAndALoggedStepIsTheRowsStep) {
  struct LogsAStep : TinyClassifier {
    torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
      torch::Tensor loss = TinyClassifier::training_step(b, i);
      if (current_epoch() == 1) log("step", torch::tensor(static_cast<double>(1000 + i)));
      return loss;
    }
  };
  volt_test::TempDir dir;
  LogsAStep model;
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  volt::Trainer t(quiet(dir.path).max_epochs(2).log_every_n_steps(1).loggers({logger}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)));  // 4 batches an epoch
  const auto rows = logger->with("train_loss");
  ASSERT_EQ(rows.size(), 8u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(rows[i].first, i);
    EXPECT_EQ(rows[i].second.at("epoch"), 0.0);
  }
  for (int i = 4; i < 8; ++i) {
    EXPECT_EQ(rows[i].first, 1000 + i - 4);
    EXPECT_EQ(rows[i].second.count("step"), 0u);
    EXPECT_EQ(rows[i].second.count("epoch"), 0u);
  }
}

// ---------------------------------------------------------------- where a foreign error came from

// Throws std::runtime_error from the hook or step named `at`, at batch `batch` (of the training
// epoch, or of the validation pass once a step was taken, so the sanity check passes).
class FailsIn : public TinyClassifier {
 public:
  FailsIn(std::string at, int64_t batch) : at_(std::move(at)), batch_(batch) {}
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    if (at_ == "training_step" && i == batch_) throw std::runtime_error("boom");
    return TinyClassifier::training_step(b, i);
  }
  void validation_step(const volt::Batch& b, int64_t i) override {
    if (at_ == "validation_step" && i == batch_ && global_step() > 0)
      throw std::runtime_error("boom");
    TinyClassifier::validation_step(b, i);
  }
  torch::Tensor predict_step(const volt::Batch& b, int64_t i) override {
    if (at_ == "predict_step" && i == batch_) throw std::runtime_error("boom");
    return TinyClassifier::predict_step(b, i);
  }
  void on_train_epoch_end() override {
    if (at_ == "on_train_epoch_end") throw std::runtime_error("boom");
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    if (at_ == "configure_optimizers") throw std::runtime_error("boom");
    return TinyClassifier::configure_optimizers();
  }

 private:
  std::string at_;
  int64_t batch_;
};

class ThrowsAtBatchEnd : public volt::Callback {
 public:
  std::string state_key() const override { return "ThrowsAtBatchEnd"; }
  void on_train_batch_end(volt::RunContext&, volt::Module&, const volt::Batch&,
                          int64_t i) override {
    if (i == 2) throw std::out_of_range("map::at");
  }
};

// The error lines a run logs while `body` fails with the error it throws.
std::vector<std::string> failure_lines(const std::function<void()>& body) {
  std::vector<std::string> out;
  const auto logs = volt_test::capture_logs([&] {
    try {
      body();
      ADD_FAILURE() << "no error";
    } catch (const std::exception&) {
    }
  });
  for (const auto& l : logs) {
    if (l.find(" failed in ") != std::string::npos) out.push_back(l);
  }
  return out;
}

TEST(Trainer, AnErrorFromUserCodeOrLibtorchIsLoggedWithTheStepOrHookAndTheBatch) {
  // C++ has no traceback: an exception from the model, a callback or libtorch said what went
  // wrong but not where. The Trainer's error line names the step or hook and the batch.
  const auto fit = [](const std::string& at, int64_t batch,
                      std::vector<std::shared_ptr<volt::Callback>> callbacks = {}) {
    return failure_lines([&] {
      volt_test::TempDir dir;
      FailsIn model(at, batch);
      volt::Trainer t(quiet(dir.path).max_epochs(2).callbacks(callbacks));
      // 64 samples in batches of 16: four steps per epoch, then validation.
      t.fit(model, volt_test::loader(volt_test::blobs(64)),
            volt_test::loader(volt_test::blobs(48)));
    });
  };
  const auto one = [](const std::vector<std::string>& lines) {
    EXPECT_EQ(lines.size(), 1u);
    return lines.empty() ? std::string() : lines.front();
  };
  EXPECT_NE(one(fit("training_step", 3))
                .find("fit failed in training_step at epoch 0, batch 3 (global step 3): "
                      "std::runtime_error: boom"),
            std::string::npos);
  EXPECT_NE(one(fit("validation_step", 1))
                .find("fit failed in validation_step at validation batch 1 (epoch 0, global "
                      "step 4): std::runtime_error: boom"),
            std::string::npos);
  EXPECT_NE(one(fit("on_train_epoch_end", 0))
                .find("fit failed in on_train_epoch_end at epoch 0 (global step 4): "),
            std::string::npos);
  EXPECT_NE(one(fit("configure_optimizers", 0))
                .find("fit failed in configure_optimizers at epoch 0 (global step 0): "),
            std::string::npos);
  EXPECT_NE(one(fit("none", 0, {std::make_shared<ThrowsAtBatchEnd>()}))
                .find("fit failed in ThrowsAtBatchEnd.on_train_batch_end at epoch 0, batch 2 "
                      "(global step 3): std::out_of_range: map::at"),
            std::string::npos);
  // A libtorch error: its first line only (not libtorch's C++ backtrace).
  const std::string shape = one(failure_lines([] {
    volt_test::TempDir dir;
    TinyClassifier model(5);
    volt::Trainer t(quiet(dir.path).max_epochs(1));
    t.fit(model, volt_test::loader(volt_test::blobs(64)));
  }));
  EXPECT_NE(shape.find("fit failed in training_step at epoch 0, batch 0 (global step 0): "
                       "c10::Error: mat1 and mat2 shapes cannot be multiplied (16x8 and 5x16)"),
            std::string::npos)
      << shape;
  EXPECT_EQ(shape.find('\n'), std::string::npos) << shape;
  // Entry points other than fit: the pass and its batch.
  EXPECT_NE(one(failure_lines([] {
              volt_test::TempDir dir;
              FailsIn model("predict_step", 2);
              volt::Trainer t(quiet(dir.path));
              t.predict(model, volt_test::loader(volt_test::blobs(64), 16, false));
            })).find("predict failed in predict_step at predict batch 2: std::runtime_error"),
            std::string::npos);
  // volt's own errors name their component and fix already: no second line.
  EXPECT_TRUE(failure_lines([] {
                volt_test::TempDir dir;
                TinyClassifier model;
                volt::Trainer t(quiet(dir.path).max_epochs(1));
                t.fit(model, volt_test::loader(volt_test::blobs(64)), c10::nullopt,
                      dir / "missing.ckpt");
              }).empty());
}

TEST(Trainer, SaysWhyFitStopped) {
  // Lightning's "`Trainer.fit` stopped: `max_epochs=2` reached." line.
  const auto stopped = [](volt::TrainerOptions o) {
    volt_test::TempDir dir;
    TinyClassifier model;
    volt::Trainer t(o.default_root_dir(dir.path));
    std::string line;
    for (const auto& l :
         volt_test::capture_logs([&] { t.fit(model, volt_test::loader(volt_test::blobs(64))); })) {
      if (l.find("fit stopped") != std::string::npos) line += l;
    }
    return line;
  };
  EXPECT_NE(stopped(quiet("").max_epochs(2))
                .find("[Trainer] fit stopped: max_epochs=2 reached (epoch 1, global step 8)."),
            std::string::npos);
  EXPECT_NE(stopped(quiet("").max_epochs(5).max_steps(3))
                .find("[Trainer] fit stopped: max_steps=3 reached (epoch 0, global step 3)."),
            std::string::npos);
}

TEST(Trainer, AValCheckIntervalAboveTheEpochsBatchesIsRefusedBeforeTraining) {
  // Lightning's rule: an int val_check_interval counts batches of an epoch. Before, 100 with an
  // epoch of 4 batches never validated, silently (and a monitored checkpoint then had no metric).
  volt_test::TempDir dir;
  const auto fit = [&](volt::TrainerOptions o) {
    TinyClassifier model;
    auto rec = std::make_shared<Recorder>();
    volt::Trainer t(o.default_root_dir(dir.path).callbacks({rec}));
    t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
    return rec;
  };
  try {
    fit(quiet("").max_epochs(1).val_check_interval(100));
    ADD_FAILURE() << "no error";
  } catch (const volt::ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "[Trainer] val_check_interval=100 is more than the 4 training batches of an "
                 "epoch, so validation would never run; use a count <= 4, a fraction such as 0.5, "
                 "or limit_val_batches=0 to turn validation off.");
  }
  EXPECT_EQ(fit(quiet("").max_epochs(1).val_check_interval(4))->validations, 1);
  EXPECT_EQ(fit(quiet("").max_epochs(1).val_check_interval(100).limit_val_batches(0))->validations,
            0);
  // fast_dev_run validates once at the end of its batches whatever the interval, as Lightning
  // (which sets val_check_interval=1.0 for it).
  EXPECT_EQ(fit(quiet("").fast_dev_run(2).val_check_interval(100))->validations, 1);
  EXPECT_EQ(fit(quiet("").fast_dev_run(3).val_check_interval(0.25))->validations, 1);
}

// A shuffled validation loader draws each epoch's order (Lightning sets the evaluation sampler's
// epoch to the training epoch): it read epoch 0's order every time.
TEST(Trainer, AShuffledValidationLoaderHasEachEpochsOrder) {
  struct FirstValidationBatch : volt::Callback {
    std::string state_key() const override { return "FirstValidationBatch"; }
    void on_validation_batch_start(volt::RunContext& run, volt::Module&, const volt::Batch& b,
                                   int64_t idx) override {
      if (idx == 0 && !run.sanity_checking()) firsts.push_back(b.input.clone());
    }
    std::vector<at::Tensor> firsts;
  };
  volt_test::TempDir dir;
  TinyClassifier model;
  auto probe = std::make_shared<FirstValidationBatch>();
  volt::Trainer t(quiet(dir.path).max_epochs(2).callbacks({probe}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)),
        volt::DataLoader(volt_test::blobs(64, 8, 4),
                         volt::DataLoaderOptions(8).shuffle(true).seed(1)));
  ASSERT_EQ(probe->firsts.size(), 2u);
  EXPECT_FALSE(torch::equal(probe->firsts[0], probe->firsts[1]));
}

// Lightning lets on_validation_start / on_validation_epoch_start log (an epoch value). Inside fit
// the value was dropped (the scope was still the training step's); validate() refused it.
TEST(Trainer, AValueLoggedWhenValidationStartsIsAnEpochValue) {
  struct LogsAtStart : TinyClassifier {
    void on_validation_epoch_start() override { log("vs", torch::tensor(3.0)); }
    void on_validation_start() override { log("vstart", torch::tensor(4.0)); }
  };
  volt_test::TempDir dir;
  LogsAtStart model;
  volt::Trainer t(quiet(dir.path).max_epochs(1));
  const auto val = volt_test::loader(volt_test::blobs(32, 8, 4), 16, false);
  t.fit(model, volt_test::loader(volt_test::blobs(64)), val);
  EXPECT_EQ(t.callback_metrics().count("vs"), 1u);
  EXPECT_EQ(t.callback_metrics().count("vstart"), 1u);
  const auto m = t.validate(model, val);
  EXPECT_EQ(m.count("vs"), 1u);
  EXPECT_DOUBLE_EQ(m.at("vs"), 3.0);
}

// on_validation_model_zero_grad runs before a validation only outside an accumulation window, as
// Lightning: an override that sets the gradients to none (Lightning's default) dropped the
// part-accumulated sums of a validation inside a window. It ran before every validation.
TEST(Trainer, OnValidationModelZeroGradWaitsForTheAccumulationWindowToClose) {
  struct ZeroesGrads : TinyClassifier {
    void on_validation_model_zero_grad() override {
      ++calls;
      for (auto& p : parameters()) p.mutable_grad() = at::Tensor();
    }
    int calls = 0;
  };
  volt_test::TempDir dir;
  ZeroesGrads model;
  volt::Trainer t(quiet(dir.path)
                      .max_epochs(1)
                      .accumulate_grad_batches(2)
                      .val_check_interval(int64_t{1})
                      .num_sanity_val_steps(0));
  t.fit(model, volt_test::loader(volt_test::blobs(64), 16, false),
        volt_test::loader(volt_test::blobs(16, 8, 4), 16, false));
  EXPECT_EQ(model.calls, 2);  // after batches 2 and 4 of 4, not after 1 and 3
  EXPECT_EQ(t.state().global_step, 2);
}

TEST(Trainer, AnEmptyTrainingLoaderWarnsThatNothingIsTrained) {
  volt_test::TempDir dir;
  TinyClassifier model;
  volt::Trainer t(quiet(dir.path).max_epochs(2));
  bool warned = false;
  for (const auto& l :
       volt_test::capture_logs([&] { t.fit(model, volt_test::loader(volt_test::blobs(0))); })) {
    warned =
        warned || l.find("[Trainer] the training DataLoader has no batches") != std::string::npos;
  }
  EXPECT_TRUE(warned);
  EXPECT_EQ(t.state().global_step, 0);
  // Bounded by max_steps alone, a fit without batches ends at once (Lightning's FitLoop.done);
  // it started empty epochs forever.
  volt::Trainer steps_only(
      quiet(dir.path).max_epochs(-1).max_steps(5).limit_train_batches(int64_t{0}));
  const auto lines = volt_test::capture_logs(
      [&] { steps_only.fit(model, volt_test::loader(volt_test::blobs(64))); });
  EXPECT_EQ(steps_only.state().global_step, 0);
  EXPECT_EQ(steps_only.state().epoch, 0);
  EXPECT_TRUE(volt_test::has(lines, "fit stopped: no training batches"));
}

TEST(Module, LogRefusesAnEmptyName) {
  struct LogsEmpty : TinyClassifier {
    torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
      auto loss = TinyClassifier::training_step(b, i);
      log("", loss);
      return loss;
    }
  };
  volt_test::TempDir dir;
  LogsEmpty model;
  volt::Trainer t(quiet(dir.path).max_epochs(1));
  try {
    t.fit(model, volt_test::loader(volt_test::blobs(32)));
    ADD_FAILURE() << "log(\"\") was accepted";
  } catch (const volt::ValueError& e) {
    EXPECT_STREQ(e.what(),
                 "[Module] log() got an empty name; name the metric, e.g. "
                 "log(\"train_loss\", loss).");
  }
}

}  // namespace

// A DataModule without the loader an evaluation entry point needs: a ConfigError naming the
// method to override, raised inside the run (the loader is asked for after the setup hooks),
// where callbacks hear of it.
TEST(Trainer, AnEvaluationOfADataModuleWithoutItsLoaderNamesTheMethodToOverride) {
  volt_test::TempDir dir;
  struct TrainOnly : volt::DataModule {
    volt::DataLoader train_dataloader() override { return volt_test::loader(volt_test::blobs(32)); }
  } data;
  struct Failures : volt::Callback {
    std::string state_key() const override { return "Failures"; }
    void on_exception(volt::RunContext&, volt::Module&, const std::exception&) override { ++n; }
    int n = 0;
  };
  auto failures = std::make_shared<Failures>();
  TinyClassifier model;
  volt::Trainer trainer(quiet(dir.path).callbacks({failures}));
  const auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const volt::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no ConfigError");
  };
  EXPECT_EQ(
      message([&] { trainer.validate(model, data); }),
      "[Trainer] validate() needs DataModule::val_dataloader() (or val_dataloaders() for several "
      "loaders); override it.");
  EXPECT_EQ(
      message([&] { trainer.test(model, data); }),
      "[Trainer] test() needs DataModule::test_dataloader() (or test_dataloaders() for several "
      "loaders); override it.");
  EXPECT_EQ(message([&] { trainer.predict(model, data); }),
            "[Trainer] predict() needs DataModule::predict_dataloader() (or predict_dataloaders() "
            "for several "
            "loaders); override it.");
  EXPECT_EQ(failures->n, 3);
}

namespace {

// Lightning's evaluation and prediction loops skip a pass whose loaders have no batch: no hook
// runs, the results are empty. A module's saved hyper-parameters reach the loggers in every
// entry point (Lightning's Trainer._run), so a test-only run records them.
TEST(Trainer, APassWithoutBatchesRunsNoHookAndEveryEntryPointLogsHparams) {
  volt_test::TempDir dir;
  struct Counts : volt::Callback {
    std::string state_key() const override { return "Counts"; }
    void on_validation_start(volt::RunContext&, volt::Module&) override { ++starts; }
    void on_test_start(volt::RunContext&, volt::Module&) override { ++starts; }
    void on_predict_start(volt::RunContext&, volt::Module&) override { ++starts; }
    int starts = 0;
  };
  auto counts = std::make_shared<Counts>();
  TinyClassifier model;
  model.save_hyperparameters({{"width", "8"}});
  volt::Trainer none(
      quiet(dir.path).limit_val_batches(0).limit_test_batches(0).limit_predict_batches(0).callbacks(
          {counts}));
  const auto data = volt_test::loader(volt_test::blobs(64), 16, false);
  EXPECT_TRUE(none.validate(model, data).empty());
  EXPECT_TRUE(none.test(model, data).empty());
  EXPECT_TRUE(none.predict(model, data).empty());
  EXPECT_EQ(counts->starts, 0);

  // A predict_step may return no tensor; predict() keeps it (the host copy skips it).
  struct PredictsNothing : TinyClassifier {
    at::Tensor predict_step(const volt::Batch&, int64_t) override { return at::Tensor(); }
  } nothing;
  const auto kept = volt::Trainer(quiet(dir.path)).predict(nothing, data);
  ASSERT_EQ(kept.size(), 4u);
  EXPECT_FALSE(kept[0].defined());

  volt::Trainer tester(quiet(dir.path).logger(true).callbacks({counts}));
  tester.test(model, data);
  EXPECT_EQ(counts->starts, 1);
  std::ifstream hparams(dir / "volt_logs/version_0/hparams.yaml");
  std::stringstream text;
  text << hparams.rdbuf();
  EXPECT_EQ(text.str(), "width: 8\n");
}

// ------------------------------------------------ Module::log as Lightning 2.6's (session 106)

/// metrics.csv as column name -> the cells of every row ("" where the row has no value).
std::map<std::string, std::vector<std::string>> csv_columns(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> names;
  std::stringstream hs(line);
  for (std::string c; std::getline(hs, c, ',');) names.push_back(c);
  std::map<std::string, std::vector<std::string>> out;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ls(line);
    for (std::string c; std::getline(ls, c, ',');) cells.push_back(c);
    cells.resize(names.size());
    for (size_t i = 0; i < names.size(); ++i) out[names[i]].push_back(cells[i]);
  }
  return out;
}

size_t filled(const std::vector<std::string>& cells) {
  return static_cast<size_t>(
      std::count_if(cells.begin(), cells.end(), [](const std::string& c) { return !c.empty(); }));
}

// on_step in a validation step (Lightning's fx_validator allows it there and in the batch hooks):
// one row per batch, no epoch column (at the fit's step in a fit, at the loader's count of
// batches in validate()), the pass's mean as "<name>_epoch" and in callback_metrics under the
// plain name. It was a ConfigError ("only possible inside training_step").
TEST(Trainer, AValidationStepValueLoggedOnStepGoesToTheLoggersAfterEachBatch) {
  struct EvalSteps : TinyClassifier {
    void validation_step(const volt::Batch& b, int64_t i) override {
      log("vb", static_cast<double>(i + 1), volt::LogOptions().on_step(true).on_epoch(true));
    }
  };
  volt_test::TempDir dir;
  EvalSteps model;
  auto csv = std::make_shared<volt::CSVLogger>(volt::CSVLoggerOptions(dir.path));
  volt::Trainer t(quiet(dir.path).max_epochs(2).num_sanity_val_steps(2).loggers({csv}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)),
        volt_test::loader(volt_test::blobs(64, 8, 1), 16, false));  // 4 validation batches
  const auto cols = csv_columns(csv->metrics_path());
  ASSERT_TRUE(cols.count("vb_step") && cols.count("vb_epoch") && cols.count("epoch"));
  std::vector<std::string> steps, values;
  for (size_t row = 0; row < cols.at("step").size(); ++row) {
    if (cols.at("vb_step")[row].empty()) continue;
    steps.push_back(cols.at("step")[row]);
    values.push_back(cols.at("vb_step")[row]);
    EXPECT_EQ(cols.at("epoch")[row], "") << "row " << row;
  }
  // Two passes of 4 batches at the fit's step (4 batches an epoch: steps 3 and 7); the sanity
  // check's 2 batches write nothing.
  EXPECT_EQ(steps, (std::vector<std::string>{"3", "3", "3", "3", "7", "7", "7", "7"}));
  EXPECT_EQ(values, (std::vector<std::string>{"1", "2", "3", "4", "1", "2", "3", "4"}));
  EXPECT_EQ(filled(cols.at("vb_epoch")), 2u);
  EXPECT_DOUBLE_EQ(t.callback_metrics().at("vb"), 2.5);
  EXPECT_EQ(t.callback_metrics().count("vb_step"), 0u);
  // validate() numbers its rows by its own batches from 0 (Lightning's).
  volt::Trainer v(quiet(dir.path).loggers({csv}));
  v.validate(model, volt_test::loader(volt_test::blobs(32, 8, 1), 16, false));
  const auto after = csv_columns(csv->metrics_path());
  std::vector<std::string> validate_steps;
  for (size_t row = cols.at("step").size(); row < after.at("step").size(); ++row) {
    if (!after.at("vb_step")[row].empty()) validate_steps.push_back(after.at("step")[row]);
  }
  EXPECT_EQ(validate_steps, (std::vector<std::string>{"0", "1"}));
  // Not in the pass's start and epoch-end hooks (Lightning's neither).
  struct AtEpochEnd : TinyClassifier {
    void on_validation_epoch_end() override { log("late", 1.0, volt::LogOptions().on_step(true)); }
  } late;
  const std::string e = volt_test::error_of<volt::ConfigError>([&] {
    volt::Trainer(quiet(dir.path)).validate(late, volt_test::loader(volt_test::blobs(16)));
  });
  EXPECT_NE(e.find("log(\"late\", on_step=true) is only possible in training, validation and test "
                   "steps and their batch hooks"),
            std::string::npos)
      << e;
}

// LogOptions::batch_size weights a value in the epoch's mean (Lightning's batch_size argument):
// the batch's size otherwise.
TEST(Trainer, LogBatchSizeWeightsTheEpochMean) {
  struct Weighted : TinyClassifier {
    torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
      log("w", static_cast<double>(i + 1),
          volt::LogOptions().on_step(false).on_epoch(true).batch_size(i == 0 ? int64_t{3}
                                                                             : int64_t{1}));
      log("u", static_cast<double>(i + 1), volt::LogOptions().on_step(false).on_epoch(true));
      return TinyClassifier::training_step(b, i);
    }
  };
  volt_test::TempDir dir;
  Weighted model;
  volt::Trainer t(quiet(dir.path).max_epochs(1));
  t.fit(model, volt_test::loader(volt_test::blobs(24)));  // batches of 16 and 8
  EXPECT_DOUBLE_EQ(t.callback_metrics().at("w"), (1.0 * 3 + 2.0 * 1) / 4);
  EXPECT_DOUBLE_EQ(t.callback_metrics().at("u"), (1.0 * 16 + 2.0 * 8) / 24);
}

// A value logged per step once stays in its epoch's step rows only (Lightning resets its step
// values at each epoch's end); it was repeated in every later epoch's rows. It stays in
// callback_metrics.
TEST(Trainer, AStepValueLoggedOnceIsNotRepeatedInLaterEpochs) {
  struct Once : TinyClassifier {
    torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
      if (current_epoch() == 0 && i == 0) log("once", 7.0);
      return TinyClassifier::training_step(b, i);
    }
  };
  volt_test::TempDir dir;
  Once model;
  auto csv = std::make_shared<volt::CSVLogger>(volt::CSVLoggerOptions(dir.path));
  volt::Trainer t(quiet(dir.path).max_epochs(3).log_every_n_steps(1).loggers({csv}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)));
  const auto cols = csv_columns(csv->metrics_path());
  EXPECT_EQ(filled(cols.at("once")), 4u);  // epoch 0's four rows, not the 8 after
  EXPECT_EQ(filled(cols.at("train_loss")), 12u);
  EXPECT_DOUBLE_EQ(t.callback_metrics().at("once"), 7.0);
}

// on_train_start and on_train_epoch_start may log epoch values (Lightning's fx_validator); they
// were "called outside a step or epoch-end hook".
TEST(Trainer, TheTrainStartAndEpochStartHooksLogEpochValues) {
  struct StartLogs : TinyClassifier {
    void on_train_start() override { log("at_start", 5.0); }
    void on_train_epoch_start() override {
      log("epoch_x10", static_cast<double>(current_epoch() * 10));
    }
  };
  volt_test::TempDir dir;
  StartLogs model;
  auto csv = std::make_shared<volt::CSVLogger>(volt::CSVLoggerOptions(dir.path));
  volt::Trainer t(quiet(dir.path).max_epochs(2).loggers({csv}));
  t.fit(model, volt_test::loader(volt_test::blobs(32)));
  const auto cols = csv_columns(csv->metrics_path());
  std::vector<std::string> x10;
  for (const auto& c : cols.at("epoch_x10")) {
    if (!c.empty()) x10.push_back(c);
  }
  EXPECT_EQ(x10, (std::vector<std::string>{"0", "10"}));
  EXPECT_EQ(filled(cols.at("at_start")), 1u);
  EXPECT_DOUBLE_EQ(t.callback_metrics().at("epoch_x10"), 10.0);
  // A fit resumed in the middle of epoch 1 runs both hooks again: what they log then is dropped
  // (the checkpoint's epoch values hold epoch 1's), so the epoch sums as in the whole fit.
  struct Counts : TinyClassifier {
    void on_train_start() override { log("starts", 1.0, sum()); }
    void on_train_epoch_start() override { log("epoch_starts", 1.0, sum()); }
    static volt::LogOptions sum() { return volt::LogOptions().reduce(volt::Reduce::kSum); }
  };
  const std::string ckpt = dir / "mid.ckpt";
  Counts cut;
  volt::Trainer(
      quiet(dir / "cut").max_epochs(2).callbacks({std::make_shared<volt_test::SaveAt>(1, 0, ckpt)}))
      .fit(cut, volt_test::loader(volt_test::blobs(32)));
  Counts resumed;
  auto rows = std::make_shared<volt::CSVLogger>(volt::CSVLoggerOptions(dir / "resumed_logs"));
  volt::Trainer r(quiet(dir / "resumed").max_epochs(2).loggers({rows}));
  r.fit(resumed, volt_test::loader(volt_test::blobs(32)), c10::nullopt, ckpt);
  EXPECT_DOUBLE_EQ(r.callback_metrics().at("epoch_starts"), 1.0);
  // Its rows are epoch 1's: on_train_start's value belongs to epoch 0, before the checkpoint.
  const auto resumed_cols = csv_columns(rows->metrics_path());
  EXPECT_EQ(resumed_cols.count("starts"), 0u);
  ASSERT_EQ(resumed_cols.count("epoch_starts"), 1u);
  EXPECT_EQ(filled(resumed_cols.at("epoch_starts")), 1u);
  struct StepAtStart : TinyClassifier {
    void on_train_epoch_start() override { log("s", 1.0, volt::LogOptions().on_step(true)); }
  } step_at_start;
  EXPECT_NE(volt_test::error_of<volt::ConfigError>([&] {
              volt::Trainer(quiet(dir.path).max_epochs(1))
                  .fit(step_at_start, volt_test::loader(volt_test::blobs(16)));
            }).find("on_step=true) is only possible in training, validation and test steps"),
            std::string::npos);
}

// Lightning's fx_validator refuses log() in the end hooks, the evaluation mode hooks and the
// fit's start/end hooks; volt dropped what on_validation_end / on_test_end and the mode hooks
// logged. The error names the hook.
TEST(Trainer, LoggingInAnEndOrModeHookIsAConfigErrorNamingIt) {
  struct LogsIn : TinyClassifier {
    explicit LogsIn(std::string h) : hook(std::move(h)) {}
    void maybe(const char* here) {
      if (hook == here) log("x", 1.0);
    }
    void on_validation_end() override { maybe("on_validation_end"); }
    void on_test_end() override { maybe("on_test_end"); }
    void on_validation_model_eval() override {
      maybe("on_validation_model_eval");
      TinyClassifier::on_validation_model_eval();
    }
    void on_validation_model_train() override {
      maybe("on_validation_model_train");
      TinyClassifier::on_validation_model_train();
    }
    void on_test_model_eval() override {
      maybe("on_test_model_eval");
      TinyClassifier::on_test_model_eval();
    }
    void on_fit_start() override { maybe("on_fit_start"); }
    void on_train_end() override { maybe("on_train_end"); }
    std::string hook;
  };
  for (const char* hook :
       {"on_validation_end", "on_validation_model_eval", "on_validation_model_train",
        "on_fit_start", "on_train_end", "on_test_end", "on_test_model_eval"}) {
    SCOPED_TRACE(hook);
    volt_test::TempDir dir;
    LogsIn model(hook);
    volt::Trainer t(quiet(dir.path).max_epochs(1).limit_train_batches(int64_t{2}));
    const std::string h = hook;
    const std::string error = volt_test::error_of<volt::ConfigError>([&] {
      if (h.find("test") != std::string::npos) {
        t.test(model, volt_test::loader(volt_test::blobs(32)));
      } else {
        t.fit(model, volt_test::loader(volt_test::blobs(32)),
              volt_test::loader(volt_test::blobs(32)));
      }
    });
    EXPECT_NE(error.find("log(\"x\") called in " + h + ", where nothing can be logged"),
              std::string::npos)
        << error;
  }
}

// As Lightning's metrics["log"]: validate() and test() return what the loggers get; a value
// logged with logger(false) is in callback_metrics() (and the progress bar's) only.
TEST(Trainer, ValidateAndTestReturnWhatTheLoggersGet) {
  struct Logs : TinyClassifier {
    void validation_step(const volt::Batch& b, int64_t i) override {
      TinyClassifier::validation_step(b, i);
      log("shown", 2.0, volt::LogOptions().logger(false).prog_bar(true));
    }
    void test_step(const volt::Batch& b, int64_t i) override {
      TinyClassifier::test_step(b, i);
      log("hidden", 3.0, volt::LogOptions().logger(false));
      log("kept", 4.0);
    }
  };
  volt_test::TempDir dir;
  Logs model;
  volt::Trainer t(quiet(dir.path));
  const volt::Metrics val = t.validate(model, volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(val.count("shown"), 0u);
  EXPECT_EQ(val.count("val_loss"), 1u);
  EXPECT_DOUBLE_EQ(t.callback_metrics().at("shown"), 2.0);
  const volt::Metrics test = t.test(model, volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(test.count("hidden"), 0u);
  EXPECT_DOUBLE_EQ(test.at("kept"), 4.0);
  EXPECT_DOUBLE_EQ(t.callback_metrics().at("hidden"), 3.0);
}

// Lightning's: log() without a Trainer (a unit test calling training_step) warns and logs
// nothing; a name that holds "/dataloader_idx_" while add_dataloader_idx is on is refused.
TEST(Module, LogWithoutATrainerWarnsAndANameMayNotNameItsLoader) {
  TinyClassifier model;
  const auto lines = volt_test::capture_logs([&] {
    auto b = volt_test::blobs(16);
    volt::Batch batch{b->inputs(), b->targets()};
    EXPECT_NO_THROW(model.training_step(batch, 0));
  });
  EXPECT_TRUE(volt_test::has(lines, "log() was called outside a Trainer run"));
  struct NamesLoader : TinyClassifier {
    void validation_step(const volt::Batch&, int64_t) override { log("acc/dataloader_idx_0", 1.0); }
  } names;
  volt_test::TempDir dir;
  EXPECT_NE(
      volt_test::error_of<volt::ConfigError>([&] {
        volt::Trainer(quiet(dir.path)).validate(names, volt_test::loader(volt_test::blobs(16)));
      }).find("names a dataloader itself, but add_dataloader_idx is on"),
      std::string::npos);
  struct NamesLoaderOff : TinyClassifier {
    void validation_step(const volt::Batch&, int64_t) override {
      log("acc/dataloader_idx_0", 1.0, volt::LogOptions().add_dataloader_idx(false));
    }
  } off;
  volt::Trainer t(quiet(dir.path));
  t.validate(off, volt_test::loader(volt_test::blobs(16)));
  EXPECT_DOUBLE_EQ(t.callback_metrics().at("acc/dataloader_idx_0"), 1.0);
}

// check_val_every_n_epoch unset (Lightning's None): validation every val_check_interval batches
// of the fit, across epochs (step-based validation); a fraction is refused with it.
TEST(Trainer, CheckValEveryNEpochNoneCountsBatchesOverTheFit) {
  struct CountsPasses : volt::Callback {
    std::string state_key() const override { return "CountsPasses"; }
    void on_validation_start(volt::RunContext& run, volt::Module&) override {
      if (!run.sanity_checking()) at.push_back(run.state().total_batches_done);
    }
    std::vector<int64_t> at;
  };
  volt_test::TempDir dir;
  TinyClassifier model;
  auto passes = std::make_shared<CountsPasses>();
  volt::Trainer t(quiet(dir.path)
                      .max_epochs(3)
                      .val_check_interval(int64_t{6})
                      .check_val_every_n_epoch(c10::nullopt)
                      .callbacks({passes}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)),  // 4 batches an epoch: 12 in all
        volt_test::loader(volt_test::blobs(32, 8, 1), 16, false));
  EXPECT_EQ(passes->at, (std::vector<int64_t>{6, 12}));
  // With an epoch count the interval counts within each epoch and may not exceed it.
  EXPECT_NE(volt_test::error_of<volt::ConfigError>([&] {
              volt::Trainer(quiet(dir.path).max_epochs(1).val_check_interval(int64_t{6}))
                  .fit(model, volt_test::loader(volt_test::blobs(64)),
                       volt_test::loader(volt_test::blobs(32)));
            }).find("val_check_interval=6 is more than the 4 training batches"),
            std::string::npos);
  EXPECT_NE(volt_test::error_of<volt::ConfigError>([&] {
              volt::TrainerOptions().check_val_every_n_epoch(c10::nullopt).validate();
            }).find("is a fraction of an epoch, but check_val_every_n_epoch is unset (None)"),
            std::string::npos);
}

}  // namespace
