// DataModule hooks against Lightning 2.6's LightningDataModule: on_exception, hyper-parameters
// logged with the module's, checkpoint state read by its own type only; and what the Trainer does
// with a module that has no validation_step / test_step.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "error_text.h"
#include "log_capture.h"
#include "tiny.h"

namespace {

using volt_test::capture_logs;
using volt_test::error_of;
using volt_test::has;
using volt_test::quiet;
using volt_test::TempDir;
using volt_test::TinyClassifier;

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Blobs of 64 rows in batches of 16; records its hooks into `calls` and its state into
/// checkpoints (a counter it writes and reads back).
class RecordingData : public volt::DataModule {
 public:
  explicit RecordingData(std::vector<std::string>* calls = nullptr,
                         bool fail_in_on_exception = false)
      : calls_(calls), fail_(fail_in_on_exception) {}
  volt::DataLoader train_dataloader() override { return volt_test::loader(volt_test::blobs(64)); }
  c10::optional<volt::DataLoader> val_dataloader() override {
    return volt_test::loader(volt_test::blobs(32, 8, 1), 16, false);
  }
  c10::optional<volt::DataLoader> test_dataloader() override { return val_dataloader(); }
  void teardown(volt::Stage) override { record("teardown"); }
  void on_exception(const std::exception& e) override {
    record(std::string("on_exception: ") + e.what());
    if (fail_) throw std::runtime_error("cleanup failed");
  }
  void save_state(torch::serialize::OutputArchive& ar) const override {
    ar.write("seen", c10::IValue(int64_t{41}));
  }
  void load_state(torch::serialize::InputArchive& ar) override {
    c10::IValue v;
    ar.read("seen", v);
    loaded = v.toInt();
  }
  int64_t loaded = -1;

 private:
  void record(const std::string& what) {
    if (calls_ != nullptr) calls_->push_back(what);
  }
  std::vector<std::string>* calls_;
  bool fail_;
};

/// Another DataModule type: reads a key RecordingData never writes (it would throw on its state).
class OtherData : public RecordingData {
 public:
  void load_state(torch::serialize::InputArchive& ar) override {
    c10::IValue v;
    ar.read("other_key", v);
    ++loads;
  }
  int loads = 0;
};

class FailsAtBatch2 : public TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    if (i == 2) throw std::runtime_error("boom at batch 2");
    return TinyClassifier::training_step(b, i);
  }
};

class RecordsException : public volt::Callback {
 public:
  explicit RecordsException(std::vector<std::string>* calls) : calls_(calls) {}
  std::string state_key() const override { return "RecordsException"; }
  void on_exception(volt::RunContext&, volt::Module&, const std::exception&) override {
    calls_->push_back("callback on_exception");
  }

 private:
  std::vector<std::string>* calls_;
};

// Lightning's _interrupt: the callbacks' on_exception, then the DataModule's; teardown after.
TEST(DataHooks, OnExceptionRunsAfterTheCallbacksAndBeforeTeardown) {
  for (const bool fail : {false, true}) {
    TempDir dir;
    std::vector<std::string> calls;
    RecordingData data(&calls, fail);
    FailsAtBatch2 model;
    volt::Trainer t(
        quiet(dir.path).max_epochs(1).callbacks({std::make_shared<RecordsException>(&calls)}));
    std::string error;
    const auto logs = capture_logs([&] {
      try {
        t.fit(model, data);
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    // The original error goes on when the DataModule's hook itself fails (logged).
    EXPECT_NE(error.find("boom at batch 2"), std::string::npos) << error;
    ASSERT_EQ(calls.size(), 3u) << fail;
    EXPECT_EQ(calls[0], "callback on_exception");
    EXPECT_NE(calls[1].find("on_exception: "), std::string::npos) << calls[1];
    EXPECT_NE(calls[1].find("boom at batch 2"), std::string::npos) << calls[1];
    EXPECT_EQ(calls[2], "teardown");
    EXPECT_EQ(has(logs, "the DataModule's on_exception failed: cleanup failed"), fail) << fail;
  }
}

class WithHparams : public TinyClassifier {
 public:
  explicit WithHparams(std::map<std::string, std::string> hp) { save_hyperparameters(hp); }
};

// Lightning's _log_hyperparams: the module's and the DataModule's hparams in one hparams.yaml; a
// key both hold with different values is an error.
TEST(DataHooks, TheDataModulesHparamsAreLoggedWithTheModules) {
  TempDir dir;
  const auto csv = [&](const std::string& sub) {
    return std::make_shared<volt::CSVLogger>(volt::CSVLoggerOptions(dir / sub));
  };
  WithHparams model({{"lr", "0.1"}, {"batch_size", "16"}});
  RecordingData data;
  data.save_hyperparameters({{"batch_size", "16"}, {"root", "/data/blobs"}});
  volt::Trainer t(quiet(dir.path).max_epochs(1).logger(true).loggers({csv("a")}));
  t.fit(model, data);
  const std::string yaml = text_of(t.log_dir() + "/hparams.yaml");
  EXPECT_NE(yaml.find("lr: 0.1\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("root: /data/blobs\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("batch_size: 16\n"), std::string::npos) << yaml;

  RecordingData other;
  other.save_hyperparameters({{"batch_size", "32"}});
  volt::Trainer t2(quiet(dir.path).max_epochs(1).logger(true).loggers({csv("b")}));
  const std::string err = error_of<volt::ConfigError>([&] { t2.fit(model, other); });
  EXPECT_NE(err.find("both hold \"batch_size\" (16 / 32)"), std::string::npos) << err;
  // Without loggers nothing is merged (Lightning's _log_hyperparams returns first).
  volt::Trainer t3(quiet(dir.path).max_epochs(1));
  EXPECT_NO_THROW(t3.fit(model, other));
}

// Lightning restores a DataModule only from its own class's entry: a fit with one DataModule
// and a test with another leaves the second's load_state alone.
TEST(DataHooks, ACheckpointsDataModuleStateIsReadByItsOwnTypeOnly) {
  TempDir dir;
  TinyClassifier model;
  RecordingData data;
  volt::Trainer t(quiet(dir.path).max_epochs(1).enable_checkpointing(true).callbacks(
      {std::make_shared<volt::ModelCheckpoint>(
          volt::ModelCheckpointOptions().dirpath(dir / "ckpt").filename("fit"))}));
  t.fit(model, data);
  const std::string ckpt = dir / "ckpt/fit.ckpt";

  RecordingData same;
  volt::Trainer t2(quiet(dir.path));
  t2.test(model, same, ckpt);
  EXPECT_EQ(same.loaded, 41);

  OtherData other;
  volt::Trainer t3(quiet(dir.path));
  const auto logs = capture_logs([&] { t3.test(model, other, ckpt); });
  EXPECT_EQ(other.loads, 0);
  EXPECT_TRUE(has(logs, "RecordingData's, not")) << logs.size();
}

/// Trains and configures its optimizer; no validation_step or test_step.
class TrainsOnly : public volt::Module {
 public:
  TrainsOnly() { fc = register_module("fc", torch::nn::Linear(8, 2)); }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    return torch::cross_entropy_loss(fc->forward(b.input), b.target);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {volt::OptimizerConfig(
        std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1)))};
  }
  torch::nn::Linear fc{nullptr};
};

class CountsValidations : public volt::Callback {
 public:
  std::string state_key() const override { return "CountsValidations"; }
  void on_validation_start(volt::RunContext&, volt::Module&) override { ++starts; }
  void on_validation_batch_end(volt::RunContext&, volt::Module&, const volt::Batch&,
                               int64_t) override {
    ++batches;
  }
  int starts = 0, batches = 0;
};

// Lightning: "You passed in a val_dataloader but have no validation_step. Skipping val loop.",
// and validate()/test() without the step raise. volt sees the default at the first step.
TEST(DataHooks, AModuleWithoutValidationStepSkipsValidationInFitAndCannotValidate) {
  for (const int64_t sanity : {2, 0}) {
    TempDir dir;
    TrainsOnly model;
    RecordingData data;
    auto counts = std::make_shared<CountsValidations>();
    auto ckpt = std::make_shared<volt::ModelCheckpoint>(
        volt::ModelCheckpointOptions().dirpath(dir / "ckpt").save_top_k(-1));
    volt::Trainer t(quiet(dir.path)
                        .max_epochs(3)
                        .num_sanity_val_steps(sanity)
                        .enable_checkpointing(true)
                        .callbacks({counts, ckpt}));
    const auto logs = capture_logs([&] { t.fit(model, data); });
    int warnings = 0;
    for (const auto& l : logs) warnings += has(l, "does not override validation_step; skipping");
    EXPECT_EQ(warnings, 1) << sanity;
    // The pass that found it (the sanity check's, else the first epoch's) stopped after its
    // first step (before that batch's end hooks); none ran after it.
    EXPECT_EQ(counts->starts, 1) << sanity;
    EXPECT_EQ(counts->batches, 0) << sanity;
    EXPECT_EQ(t.state().global_step, 12) << sanity;  // 3 epochs of 4 batches
    // Checkpoints at each epoch's end, as in a fit without validation.
    int files = 0;
    for (const auto& f : std::filesystem::directory_iterator(dir / "ckpt"))
      files += f.is_regular_file();
    EXPECT_EQ(files, 3) << sanity;
    // The same Trainer given a module with the step validates it.
    TinyClassifier validating;
    const volt::Metrics m = t.validate(validating, data);
    EXPECT_EQ(m.count("val_loss"), 1u) << sanity;
  }
  // A module with test_step only: fit skips validation, and test() on the same Trainer tests
  // (the finding is the fit's, not the Trainer's).
  {
    class TestsOnly : public TrainsOnly {
     public:
      void test_step(const volt::Batch& b, int64_t) override {
        log("test_loss", torch::cross_entropy_loss(fc->forward(b.input), b.target));
      }
    } tests_only;
    TempDir dir;
    RecordingData data;
    volt::Trainer t(quiet(dir.path).max_epochs(1));
    t.fit(tests_only, data);
    EXPECT_EQ(t.test(tests_only, data).count("test_loss"), 1u);
  }
  TempDir dir;
  TrainsOnly model;
  RecordingData data;
  volt::Trainer t(quiet(dir.path));
  const std::string v = error_of<volt::ConfigError>([&] { t.validate(model, data); });
  EXPECT_NE(v.find("validate() needs the module's validation_step"), std::string::npos) << v;
  const std::string s = error_of<volt::ConfigError>([&] { t.test(model, data); });
  EXPECT_NE(s.find("test() needs the module's test_step"), std::string::npos) << s;
}

}  // namespace
