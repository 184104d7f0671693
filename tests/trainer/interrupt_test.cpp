// Stopping a run on request (TrainerOptions::handle_signals, volt::Interrupted,
// OnExceptionCheckpoint) and max_time as a budget for the whole run, in one process with real
// signals raised in the process. Several processes: tests/strategies/ddp_test.cpp
// (Ddp.*Stop*), the CLI's exit codes: tests/cli/cli_test.cpp.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "tiny.h"

namespace {

namespace fs = std::filesystem;
using volt_test::quiet;
using volt_test::TinyClassifier;

/// SIGINT and SIGTERM at their default action for a test's scope (restored after): a test
/// runner started in the background (`cmd &` in a script) ignores SIGINT, and volt rightly
/// leaves an ignored signal alone.
class DefaultStopSignals {
 public:
  DefaultStopSignals() {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGINT, &dfl, &saved_[0]);
    ::sigaction(SIGTERM, &dfl, &saved_[1]);
  }
  ~DefaultStopSignals() {
    ::sigaction(SIGINT, &saved_[0], nullptr);
    ::sigaction(SIGTERM, &saved_[1], nullptr);
  }

 private:
  struct sigaction saved_[2]{};
};

bool is_default(int sig) {
  struct sigaction a {};
  ::sigaction(sig, nullptr, &a);
  return (a.sa_flags & SA_SIGINFO) == 0 && a.sa_handler == SIG_DFL;
}

/// Raises `sig` at the end of training batch number `train_at` (counted over the run) or of
/// validation batch `val_at`; records whether SIGINT/SIGTERM had their default action while
/// the run trained, and how many validation batches ran.
class RaiseAt : public volt::Callback {
 public:
  RaiseAt(int sig, int64_t train_at, int64_t val_at = -1)
      : sig_(sig), train_at_(train_at), val_at_(val_at) {}
  std::string state_key() const override { return "RaiseAt"; }
  void on_train_start(volt::RunContext&, volt::Module&) override {
    default_during_run = is_default(SIGINT) && is_default(SIGTERM);
  }
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t) override {
    if (run.state().total_batches_done == train_at_) ::raise(sig_);
  }
  void on_validation_batch_end(volt::RunContext&, volt::Module&, const volt::Batch&,
                               int64_t idx) override {
    ++val_batches;
    if (idx == val_at_) ::raise(sig_);
  }
  bool default_during_run = true;
  int64_t val_batches = 0;

 private:
  int sig_;
  int64_t train_at_, val_at_;
};

volt::DataLoader train_data() {
  return volt_test::loader(volt_test::blobs(160), 16);  // 10 batches per epoch
}
volt::DataLoader val_data() {
  return volt_test::loader(volt_test::blobs(64, 8, 1), 16, false);
}

/// The weights of the uninterrupted 2-epoch fit under `root` that the interrupted fits resume
/// to (each starts again from torch::manual_seed(0)).
torch::Tensor uninterrupted_weights(const std::string& root) {
  torch::manual_seed(0);
  TinyClassifier whole;
  volt::Trainer(quiet(root).max_epochs(2)).fit(whole, train_data(), val_data());
  return whole.flat_params();
}

TEST(Interrupt, SigintStopsAtTheBatchBoundaryAndTheCheckpointResumesExactly) {
  DefaultStopSignals defaults;
  volt_test::TempDir dir;
  const torch::Tensor whole = uninterrupted_weights(dir / "whole");

  torch::manual_seed(0);
  TinyClassifier cut;
  auto raise_at = std::make_shared<RaiseAt>(SIGINT, 13);
  auto oe = std::make_shared<volt::OnExceptionCheckpoint>(
      volt::OnExceptionCheckpointOptions().dirpath(dir / "oe"));
  volt::Trainer t(quiet(dir / "cut").max_epochs(2).callbacks({raise_at, oe}));
  try {
    t.fit(cut, train_data(), val_data());
    FAIL() << "fit returned after SIGINT";
  } catch (const volt::Interrupted& e) {
    EXPECT_EQ(e.signal(), SIGINT);
    EXPECT_NE(std::string(e.what()).find("[Trainer] stopped by SIGINT at epoch 1 after 3 of 10 "
                                         "training batches (global step 13)"),
              std::string::npos)
        << e.what();
  }
  // Stopped at the end of the batch that got the signal, not at once and not at the epoch end.
  EXPECT_EQ(t.state().status, volt::RunStatus::kInterrupted);
  EXPECT_EQ(t.state().total_batches_done, 13);
  EXPECT_FALSE(raise_at->default_during_run);
  EXPECT_TRUE(is_default(SIGINT) && is_default(SIGTERM)) << "the default action is back";
  ASSERT_EQ(oe->saved_path(), dir / "oe/on_exception.ckpt");
  ASSERT_TRUE(fs::exists(oe->saved_path()));

  TinyClassifier resumed;
  volt::Trainer r(quiet(dir / "resumed").max_epochs(2));
  r.fit(resumed, train_data(), val_data(), oe->saved_path());
  EXPECT_EQ(r.state().global_step, 20);
  EXPECT_TRUE(resumed.flat_params().equal(whole))
      << "max diff " << (resumed.flat_params() - whole).abs().max().item<double>();
}

// ckpt_path="last" takes the newest of ModelCheckpoint's last checkpoints and
// OnExceptionCheckpoint's file, as Lightning's _parse_ckpt_path: a run preempted mid-epoch 1
// resumes from its on_exception.ckpt. It took the last.ckpt of epoch 0's end and trained three
// batches again.
TEST(Interrupt, CkptPathLastTakesTheNewerOnExceptionCheckpoint) {
  DefaultStopSignals defaults;
  volt_test::TempDir dir;
  auto callbacks = [&](std::shared_ptr<volt::Callback> extra) {
    std::vector<std::shared_ptr<volt::Callback>> cbs{
        std::make_shared<volt::ModelCheckpoint>(
            volt::ModelCheckpointOptions().dirpath(dir / "ckpt").save_last(true).save_top_k(0)),
        std::make_shared<volt::OnExceptionCheckpoint>(
            volt::OnExceptionCheckpointOptions().dirpath(dir / "ckpt"))};
    if (extra) cbs.push_back(extra);
    return cbs;
  };
  TinyClassifier cut;
  volt::Trainer t(
      quiet(dir.path).max_epochs(2).callbacks(callbacks(std::make_shared<RaiseAt>(SIGINT, 13))));
  EXPECT_THROW(t.fit(cut, train_data(), val_data()), volt::Interrupted);
  ASSERT_TRUE(fs::exists(dir / "ckpt/last.ckpt"));
  ASSERT_TRUE(fs::exists(dir / "ckpt/on_exception.ckpt"));
  class StartsAt : public volt::Callback {
   public:
    std::string state_key() const override { return "StartsAt"; }
    void on_train_start(volt::RunContext& run, volt::Module&) override {
      from = run.ckpt_path();
      step = run.state().global_step;
    }
    std::string from;
    int64_t step = -1;
  };
  auto starts = std::make_shared<StartsAt>();
  TinyClassifier resumed;
  volt::Trainer r(quiet(dir.path).max_epochs(2).callbacks(callbacks(starts)));
  r.fit(resumed, train_data(), val_data(), "last");
  EXPECT_EQ(starts->from, dir / "ckpt/on_exception.ckpt");
  EXPECT_EQ(starts->step, 13);
  EXPECT_EQ(r.state().global_step, 20);
  // That run finished, so its OnExceptionCheckpoint removed the file (Lightning's teardown): a
  // later "last" takes the finished run's last.ckpt, not the interruption's state again (it
  // took the stale file, newer than nothing else, and trained epochs 1 and 2 from step 13).
  EXPECT_FALSE(fs::exists(dir / "ckpt/on_exception.ckpt"));
  auto again = std::make_shared<StartsAt>();
  TinyClassifier next;
  volt::Trainer n(quiet(dir.path).max_epochs(3).callbacks(callbacks(again)));
  n.fit(next, train_data(), val_data(), "last");
  EXPECT_EQ(again->from, dir / "ckpt/last.ckpt");
  EXPECT_EQ(again->step, 20);
}

TEST(Interrupt, SigtermDuringValidateStopsAtTheNextBatch) {
  DefaultStopSignals defaults;
  volt_test::TempDir dir;
  TinyClassifier model;
  auto raise_at = std::make_shared<RaiseAt>(SIGTERM, -1, 1);
  volt::Trainer t(quiet(dir.path).callbacks({raise_at}));
  try {
    t.validate(model, val_data());
    FAIL() << "validate returned after SIGTERM";
  } catch (const volt::Interrupted& e) {
    EXPECT_EQ(e.signal(), SIGTERM);
    EXPECT_NE(std::string(e.what()).find("stopped by SIGTERM during validate"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(raise_at->val_batches, 2) << "of 4";
  EXPECT_EQ(t.state().status, volt::RunStatus::kInterrupted);
  EXPECT_TRUE(is_default(SIGTERM));
}

std::atomic<int> g_own_handler_calls{0};
extern "C" void own_handler(int) {
  g_own_handler_calls.fetch_add(1);
}

TEST(Interrupt, AProgramsOwnHandlerIsLeftAlone) {
  DefaultStopSignals defaults;
  volt_test::TempDir dir;
  struct sigaction own {};
  own.sa_handler = own_handler;
  sigemptyset(&own.sa_mask);
  ASSERT_EQ(::sigaction(SIGINT, &own, nullptr), 0);
  g_own_handler_calls = 0;
  TinyClassifier model;
  volt::Trainer t(quiet(dir.path).max_epochs(1).callbacks({std::make_shared<RaiseAt>(SIGINT, 3)}));
  t.fit(model, train_data());
  EXPECT_EQ(t.state().status, volt::RunStatus::kFinished);
  EXPECT_EQ(t.state().global_step, 10);
  EXPECT_EQ(g_own_handler_calls.load(), 1);
  struct sigaction after {};
  ::sigaction(SIGINT, nullptr, &after);
  EXPECT_EQ(after.sa_handler, own_handler);
  signal(SIGINT, SIG_DFL);
}

TEST(Interrupt, HandleSignalsFalseKeepsTheDefaultAction) {
  DefaultStopSignals defaults;
  volt_test::TempDir dir;
  for (bool handle : {true, false}) {
    TinyClassifier model;
    // train_at -1: never raises; it only records the dispositions during the run.
    auto probe = std::make_shared<RaiseAt>(SIGINT, -1);
    volt::Trainer t(quiet(dir.path).max_epochs(1).handle_signals(handle).callbacks({probe}));
    t.fit(model, train_data());
    EXPECT_EQ(probe->default_during_run, !handle) << "handle_signals=" << handle;
    EXPECT_TRUE(is_default(SIGINT) && is_default(SIGTERM));
  }
}

/// Sleeps in every training batch, so that a fit takes a known least time.
class Slow : public volt::Callback {
 public:
  std::string state_key() const override { return "Slow"; }
  void on_train_batch_end(volt::RunContext&, volt::Module&, const volt::Batch&, int64_t) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
};

TEST(Interrupt, MaxTimeIsABudgetForTheWholeRunAcrossResumes) {
  // As Lightning's Timer (which implements its max_time): the time trained before a resume
  // counts. The first run trains >= 0.3 s; resumed with max_time 0.2 s it trains no more (the
  // epoch boundary checks the budget before a batch); without the budget it would train its
  // 0.2 s, far more than the 40 batches left.
  volt_test::TempDir dir;
  TinyClassifier model;
  volt::Trainer first(quiet(dir.path).max_epochs(1).callbacks({std::make_shared<Slow>()}));
  first.fit(model, train_data());
  first.save_checkpoint(dir / "one_epoch.ckpt");
  volt::Trainer second(quiet(dir.path).max_epochs(5).max_time(0.2));
  second.fit(model, train_data(), c10::nullopt, dir / "one_epoch.ckpt");
  EXPECT_EQ(second.state().global_step, 10);
  EXPECT_EQ(second.state().status, volt::RunStatus::kFinished);
}

TEST(Interrupt, MaxTimeCountsTrainingNotWhatComesBeforeIt) {
  // As Lightning's Timer, which starts in on_train_start: on_fit_start (where the tuner
  // callbacks run their trials) and the sanity check do not spend the budget. 0.3 s there, then
  // 20 tiny batches well inside 0.25 s of training.
  struct SlowStart : volt::Callback {
    std::string state_key() const override { return "SlowStart"; }
    void on_fit_start(volt::RunContext&, volt::Module&) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  };
  volt_test::TempDir dir;
  TinyClassifier model;
  volt::Trainer t(
      quiet(dir.path).max_epochs(2).max_time(0.25).callbacks({std::make_shared<SlowStart>()}));
  t.fit(model, train_data());
  EXPECT_EQ(t.state().global_step, 20);
  EXPECT_EQ(t.state().status, volt::RunStatus::kFinished);
}

TEST(OnExceptionCheckpoint, RejectsAFileNameThatIsNotOne) {
  for (const char* bad : {"", "a/b", ".", ".."}) {
    EXPECT_THROW(volt::OnExceptionCheckpoint(volt::OnExceptionCheckpointOptions().filename(bad)),
                 volt::ConfigError)
        << bad;
  }
}

/// Fails in training_step on batch `train_at` and in validation_step on batch `val_at`.
class FailsAt : public TinyClassifier {
 public:
  FailsAt(int64_t train_at, int64_t val_at) : train_at_(train_at), val_at_(val_at) {}
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    VOLT_CHECK(i != train_at_, volt::ValueError, "[FailsAt] batch ", i, " is bad");
    return TinyClassifier::training_step(b, i);
  }
  void validation_step(const volt::Batch& b, int64_t i) override {
    VOLT_CHECK(i != val_at_, volt::ValueError, "[FailsAt] validation batch ", i, " is bad");
    TinyClassifier::validation_step(b, i);
  }

 private:
  int64_t train_at_, val_at_;
};

TEST(OnExceptionCheckpoint, SavesAFailedFitInOneProcessWithAWarningAndNothingOutsideFit) {
  volt_test::TempDir dir;
  FailsAt model(4, 1);
  auto oe = std::make_shared<volt::OnExceptionCheckpoint>();
  volt::Trainer t(quiet(dir.path).logger(true).callbacks({oe}));
  EXPECT_THROW(t.fit(model, train_data()), volt::ValueError);
  EXPECT_EQ(t.state().status, volt::RunStatus::kFailed);
  // The default folder: the run's checkpoint folder.
  ASSERT_EQ(oe->saved_path(), t.log_dir() + "/checkpoints/on_exception.ckpt");
  EXPECT_TRUE(fs::exists(oe->saved_path()));
  fs::remove(oe->saved_path());

  EXPECT_THROW(t.validate(model, val_data()), volt::ValueError);
  EXPECT_EQ(oe->saved_path(), "");
  EXPECT_FALSE(fs::exists(t.log_dir() + "/checkpoints/on_exception.ckpt"));
}

TEST(OnExceptionCheckpoint, WarnsThatAFailedStateIsForInspection) {
  volt_test::TempDir dir;
  FailsAt model(2, -1);
  auto oe = std::make_shared<volt::OnExceptionCheckpoint>(
      volt::OnExceptionCheckpointOptions().dirpath(dir / "oe").filename("crash"));
  volt::Trainer t(quiet(dir.path).callbacks({oe}));
  std::vector<std::string> lines;
  volt::set_log_sink([&](volt::LogLevel, const std::string& l) { lines.push_back(l); });
  EXPECT_THROW(t.fit(model, train_data()), volt::ValueError);
  volt::set_log_sink(nullptr);
  EXPECT_TRUE(fs::exists(dir / "oe/crash.ckpt"));
  bool warned = false;
  for (const auto& l : lines) {
    warned = warned ||
             l.find("use it to inspect the failure rather than to resume") != std::string::npos;
  }
  EXPECT_TRUE(warned);
}

// Lightning's ModelCheckpoint(save_on_exception=True): the filename template's file and
// last.ckpt, written when fit is interrupted (every rank at the same batch boundary) or fails in
// one process; not ranked among the top k; nothing outside fit or when off.
TEST(ModelCheckpoint, SaveOnExceptionWritesTheTemplatesFileAndLastThatResumeExactly) {
  DefaultStopSignals defaults;
  volt_test::TempDir dir;
  const torch::Tensor whole = uninterrupted_weights(dir / "whole");

  torch::manual_seed(0);
  TinyClassifier cut;
  auto mc = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "c").save_last(true).save_on_exception(true));
  volt::Trainer t(
      quiet(dir / "cut").max_epochs(2).callbacks({std::make_shared<RaiseAt>(SIGINT, 13), mc}));
  EXPECT_THROW(t.fit(cut, train_data(), val_data()), volt::Interrupted);
  EXPECT_TRUE(fs::exists(dir / "c/epoch=0-step=10.ckpt"));  // epoch 0's own
  EXPECT_TRUE(fs::exists(dir / "c/epoch=1-step=13.ckpt"));  // on the exception
  // Not ranked: best_model_path stays epoch 0's (without a monitor no score is kept at all).
  EXPECT_EQ(mc->best_model_path(), dir / "c/epoch=0-step=10.ckpt");
  EXPECT_TRUE(mc->best_k_models().empty());
  EXPECT_EQ(mc->last_model_path(), dir / "c/last.ckpt");
  TinyClassifier resumed;
  volt::Trainer r(quiet(dir / "resumed").max_epochs(2));
  r.fit(resumed, train_data(), val_data(), dir / "c/last.ckpt");
  EXPECT_EQ(r.state().global_step, 20);
  EXPECT_TRUE(resumed.flat_params().equal(whole));

  // Another failure in one process: saved (the state as the failure left it), with the warning
  // OnExceptionCheckpoint gives; validate saves nothing; off by default.
  FailsAt failing(4, 1);
  auto on = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "f").save_on_exception(true));
  volt::Trainer f(quiet(dir / "f_run").callbacks({on}));
  std::vector<std::string> lines;
  volt::set_log_sink([&](volt::LogLevel, const std::string& l) { lines.push_back(l); });
  EXPECT_THROW(f.fit(failing, train_data()), volt::ValueError);
  EXPECT_THROW(f.validate(failing, val_data()), volt::ValueError);
  volt::set_log_sink(nullptr);
  EXPECT_TRUE(fs::exists(dir / "f/epoch=0-step=4.ckpt"));
  EXPECT_FALSE(fs::exists(dir / "f/last.ckpt"));
  bool warned = false;
  for (const auto& l : lines) {
    warned =
        warned || (l.find("[ModelCheckpoint] saved") != std::string::npos &&
                   l.find("after the fit failed ([FailsAt] batch 4 is bad)") != std::string::npos);
  }
  EXPECT_TRUE(warned);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir / "f")) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
  FailsAt failing_again(4, 1);
  auto off =
      std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions().dirpath(dir / "g"));
  volt::Trainer g(quiet(dir / "g_run").callbacks({off}));
  EXPECT_THROW(g.fit(failing_again, train_data()), volt::ValueError);
  EXPECT_FALSE(fs::exists(dir / "g/epoch=0-step=4.ckpt"));
}

}  // namespace
