#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <vector>

#include "build_paths.h"
#include "tiny.h"

namespace {

using volt_test::TinyClassifier;

class SaveEveryBatch : public volt::Callback {
 public:
  explicit SaveEveryBatch(std::string dir) : dir_(std::move(dir)) {}
  std::string state_key() const override { return "SaveEveryBatch"; }
  void on_train_batch_end(volt::RunContext& r, volt::Module&, const volt::Batch&,
                          int64_t) override {
    r.save_checkpoint(dir_ + "/b" + std::to_string(r.state().total_batches_done) + ".ckpt");
  }
  void on_validation_end(volt::RunContext& r, volt::Module&) override {
    r.save_checkpoint(dir_ + "/v" + std::to_string(r.state().total_batches_done) + ".ckpt");
  }
  void on_train_epoch_end(volt::RunContext& r, volt::Module&) override {
    r.save_checkpoint(dir_ + "/e" + std::to_string(r.state().epoch) + ".ckpt");
  }

 private:
  std::string dir_;
};

struct RunResult {
  torch::Tensor params;
  volt::Metrics metrics;
  int64_t steps;
};

// 3 epochs of 13 batches (200 samples / 16), accumulation 3, validation twice per epoch,
// dropout (RNG), AdamW with a per-step StepLR, one data-loader worker.
RunResult train(const std::string& root, const std::string& ckpt_dir, const std::string& resume) {
  TinyClassifier model(8, 0.05, /*adam=*/true);
  model.scheduler_step_size = 2;
  model.scheduler_interval = volt::Interval::kStep;
  std::vector<std::shared_ptr<volt::Callback>> cbs;
  if (!ckpt_dir.empty()) cbs.push_back(std::make_shared<SaveEveryBatch>(ckpt_dir));
  volt::Trainer t(volt_test::quiet(root)
                      .max_epochs(3)
                      .accumulate_grad_batches(3)
                      .val_check_interval(0.5)
                      .callbacks(cbs));
  t.fit(model, volt_test::loader(volt_test::blobs(200, 8, 1), 16, true, 1),
        volt_test::loader(volt_test::blobs(64, 8, 2), 32, false), resume);
  return {model.flat_params(), t.callback_metrics(), t.state().global_step};
}

TEST(ExactResume, FromEveryKindOfStopIsBitIdentical) {
  volt_test::TempDir dir;
  RunResult full = train(dir / "full", dir.path, "");
  EXPECT_EQ(full.steps, 3 * 5);
  // Mid-accumulation (b1, b2, b14), on an accumulation boundary (b3), just before a due
  // validation (b6), right after it (v6), the last batch (b13), an epoch end (e0), mid-epoch 3.
  for (const std::string name :
       {"b1", "b2", "b3", "b6", "v6", "b13", "e0", "b14", "v19", "e1", "b33"}) {
    SCOPED_TRACE(name);
    RunResult resumed = train(dir / ("r_" + name), "", dir / (name + ".ckpt"));
    EXPECT_TRUE(resumed.params.equal(full.params))
        << "max diff " << (resumed.params - full.params).abs().max().item<double>();
    EXPECT_EQ(resumed.steps, full.steps);
    EXPECT_EQ(resumed.metrics.at("val_loss"), full.metrics.at("val_loss"));
  }
}

// The uninterrupted fit stops right after a validation that asks it to (as Lightning's loop, which
// checks should_stop before the next batch). Resumed from the checkpoint written just before
// that validation (b6), the fit runs the validation first; the stop it asked for ended the fit
// only after one more batch (one more optimizer step).
TEST(ExactResume, AStopTheResumedValidationAsksForEndsTheFitThere) {
  class StopsAtTheValidationOfBatch6 : public volt::Callback {
   public:
    std::string state_key() const override { return "StopsAtTheValidationOfBatch6"; }
    void on_validation_end(volt::RunContext& r, volt::Module&) override {
      if (!r.sanity_checking() && r.state().total_batches_done == 6) r.request_stop();
    }
  };
  volt_test::TempDir dir;
  auto fit = [&](const std::string& root, const std::string& resume, bool save) {
    TinyClassifier model(8, 0.05, /*adam=*/true);
    std::vector<std::shared_ptr<volt::Callback>> cbs{
        std::make_shared<StopsAtTheValidationOfBatch6>()};
    if (save) cbs.push_back(std::make_shared<SaveEveryBatch>(dir.path));
    volt::Trainer t(volt_test::quiet(root).max_epochs(3).val_check_interval(0.5).callbacks(cbs));
    t.fit(model, volt_test::loader(volt_test::blobs(200, 8, 1), 16, true, 1),
          volt_test::loader(volt_test::blobs(64, 8, 2), 32, false), resume);
    return RunResult{model.flat_params(), t.callback_metrics(), t.state().global_step};
  };
  const RunResult full = fit(dir / "full", "", true);
  EXPECT_EQ(full.steps, 6);
  const RunResult resumed = fit(dir / "resumed", dir / "b6.ckpt", false);
  EXPECT_EQ(resumed.steps, 6);
  EXPECT_TRUE(resumed.params.equal(full.params));
}

// Resumed from the checkpoint written just before a due validation (b6), with a callback asking
// to stop in on_train_epoch_start (which a mid-epoch resume runs again): the owed validation
// still runs first, as the uninterrupted fit ran it before any such request; the stop skipped
// it, so nothing monitoring val_loss saw the weights the fit ended with.
TEST(ExactResume, AStopAskedAtTheResumedEpochStartStillRunsTheDueValidation) {
  class Stopper : public volt::Callback {
   public:
    explicit Stopper(bool stop) : stop_(stop) {}
    std::string state_key() const override { return "Stopper"; }
    void on_train_epoch_start(volt::RunContext& r, volt::Module&) override {
      if (stop_) r.request_stop();
    }
    void on_validation_end(volt::RunContext& r, volt::Module&) override {
      if (!r.sanity_checking()) validated_at.push_back(r.state().total_batches_done);
    }
    std::vector<int64_t> validated_at;

   private:
    bool stop_;
  };
  volt_test::TempDir dir;
  auto fit = [&](const std::string& root, const std::string& resume, bool stop) {
    TinyClassifier model(8, 0.05, /*adam=*/true);
    auto stopper = std::make_shared<Stopper>(stop);
    std::vector<std::shared_ptr<volt::Callback>> cbs{stopper};
    if (resume.empty()) cbs.push_back(std::make_shared<SaveEveryBatch>(dir.path));
    volt::Trainer t(volt_test::quiet(root).max_epochs(1).val_check_interval(0.5).callbacks(cbs));
    t.fit(model, volt_test::loader(volt_test::blobs(200, 8, 1), 16, true, 1),
          volt_test::loader(volt_test::blobs(64, 8, 2), 32, false), resume);
    return std::make_pair(stopper->validated_at, t.state().global_step);
  };
  const auto full = fit(dir / "full", "", false);
  EXPECT_EQ(full.first, (std::vector<int64_t>{6, 12}));
  const auto resumed = fit(dir / "resumed", dir / "b6.ckpt", true);
  EXPECT_EQ(resumed.first, (std::vector<int64_t>{6}));
  EXPECT_EQ(resumed.second, 6);
}

// A fit ended by max_steps mid-epoch, resumed with a larger max_steps, trains the rest of that
// epoch and ends as the fit given the larger max_steps from the start (an epoch-interval
// scheduler included, which steps at real epoch ends only). The resumed fit took the next epoch
// instead: it skipped the epoch's remaining batches and ended an epoch later.
TEST(ExactResume, AFitEndedByMaxStepsMidEpochGoesOnWithThatEpoch) {
  volt_test::TempDir dir;
  auto fit = [&](int64_t max_steps, const std::string& resume, const std::string& save) {
    torch::manual_seed(3);  // the same initial weights for the two fits from scratch
    TinyClassifier model(8, 0.05, /*adam=*/true);
    model.scheduler_step_size = 1;
    model.scheduler_interval = volt::Interval::kEpoch;
    volt::Trainer t(volt_test::quiet(dir.path).max_steps(max_steps));
    // 160 rows at batch 16: 10 batches an epoch.
    t.fit(model, volt_test::loader(volt_test::blobs(160, 8, 1), 16, true),
          volt_test::loader(volt_test::blobs(32, 8, 2), 16, false), resume);
    if (!save.empty()) t.save_checkpoint(save);
    return std::make_pair(model.flat_params(), t.state());
  };
  const auto whole = fit(30, "", "");
  EXPECT_EQ(whole.second.epoch, 2);
  const auto first = fit(15, "", dir / "at15.ckpt");
  EXPECT_EQ(first.second.epoch, 1);
  EXPECT_FALSE(first.second.epoch_finished);
  const auto resumed = fit(30, dir / "at15.ckpt", "");
  EXPECT_EQ(resumed.second.global_step, 30);
  EXPECT_EQ(resumed.second.epoch, 2);
  EXPECT_TRUE(resumed.first.equal(whole.first))
      << "max diff " << (resumed.first - whole.first).abs().max().item<double>();
}

// The process is really killed (SIGKILL) while training (held at batch 17 by --wait-at so the
// point is known); the run resumed from its last.ckpt ends bit-identical to an uninterrupted
// process. On CUDA the runs are deterministic (deterministic=true) and the checkpoint carries
// the GPU generator (dropout draws on it).
void expect_sigkill_resume_bit_identical(const std::string& accelerator) {
  volt_test::TempDir dir;
  auto run_worker = [&](std::vector<std::string> args, int kill_after_batch) {
    args.push_back("--accelerator");
    args.push_back(accelerator);
    const std::string worker = volt_test::resume_worker();  // before fork: no malloc after it
    int fds[2], in_fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    EXPECT_EQ(::pipe(in_fds), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(fds[1], 1);
      ::dup2(in_fds[0], 0);
      ::close(fds[0]);
      ::close(in_fds[1]);
      std::vector<char*> argv{const_cast<char*>(worker.c_str())};
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(worker.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    ::close(in_fds[0]);
    FILE* out = ::fdopen(fds[0], "r");
    char line[256];
    bool killed = false;
    while (std::fgets(line, sizeof line, out)) {
      int n = 0;
      if (kill_after_batch > 0 && std::sscanf(line, "batch %d", &n) == 1 && n >= kill_after_batch) {
        ::kill(pid, SIGKILL);
        killed = true;
        break;
      }
    }
    std::fclose(out);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(in_fds[1]);
    if (killed) {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    } else {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
  };
  run_worker({"--root", dir / "ref", "--out", dir / "ref.pt"}, 0);
  // Batch 17 of 39 is mid-epoch (epoch 1) and mid-accumulation (17 = 13 + 4).
  run_worker({"--root", dir / "run", "--out", dir / "unused.pt", "--wait-at", "17"}, 17);
  ASSERT_EQ(::access((dir / "unused.pt").c_str(), F_OK), -1)
      << "the worker finished before the kill";
  run_worker(
      {"--root", dir / "run", "--out", dir / "resumed.pt", "--resume", dir / "run/last.ckpt"}, 0);
  torch::Tensor ref, resumed;
  torch::load(ref, dir / "ref.pt");
  torch::load(resumed, dir / "resumed.pt");
  EXPECT_TRUE(ref.equal(resumed)) << "max diff " << (ref - resumed).abs().max().item<double>();
}

TEST(ExactResume, AfterSigkill) {
  expect_sigkill_resume_bit_identical("cpu");
}

TEST(ExactResume, AfterSigkillOnCuda) {
  if (!volt::CudaAccelerator::available()) GTEST_SKIP() << "no CUDA device in this build/machine";
  expect_sigkill_resume_bit_identical("cuda");
}

// The checkpoint holds the GPU generator: a state saved, drawn from and restored gives the
// same draws again.
TEST(ExactResume, CudaGeneratorStateRoundTrips) {
  if (!volt::CudaAccelerator::available()) GTEST_SKIP() << "no CUDA device in this build/machine";
  volt::CudaAccelerator acc;
  acc.setup_device(acc.device(0));
  const auto states = acc.rng_states();
  ASSERT_EQ(states.count("torch_cuda_0"), 1u);
  const auto a = torch::rand({1000}, torch::kCUDA);
  acc.set_rng_states(states);
  const auto b = torch::rand({1000}, torch::kCUDA);
  EXPECT_TRUE(a.equal(b));
}

}  // namespace
