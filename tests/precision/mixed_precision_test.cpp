// Precision modes in the Trainer: bf16-mixed trains close to fp32 with fp32 weights, loss
// scaling skips inf steps without advancing the step and resumes exactly, bf16-true runs the
// model in bf16, 16-mixed on a CPU-only libtorch 1.13 says why it cannot run.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <volt/volt.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "requires.h"
#include "tiny.h"
#include "training_jobs.h"

namespace {

using volt_test::quiet;
using volt_test::TinyClassifier;

// Records what the forward really computed in.
class Recording : public TinyClassifier {
 public:
  using TinyClassifier::TinyClassifier;
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    input_dtype = b.input.scalar_type();
    logits_dtype = forward(b.input).scalar_type();
    return TinyClassifier::training_step(b, i);
  }
  void on_after_backward() override {
    ++backwards;
    grad_dtype = fc1->weight.grad().scalar_type();
    if (backwards == poison_at) {
      torch::NoGradGuard g;
      fc1->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    }
  }
  void on_before_optimizer_step(torch::optim::Optimizer& opt) override {
    last_lr = opt.param_groups()[0].options().get_lr();
  }
  c10::ScalarType input_dtype = c10::kFloat, logits_dtype = c10::kFloat;
  c10::ScalarType grad_dtype = c10::kDouble;
  double last_lr = 0;
  int64_t backwards = 0, poison_at = -1;
};

double val_loss(volt::Trainer& t, TinyClassifier& m, std::shared_ptr<volt::TensorDataset> val) {
  return t.validate(m, volt_test::loader(val, 64, false)).at("val_loss");
}

}  // namespace

TEST(MixedPrecision, Bf16MixedComputesInBf16KeepsFp32WeightsAndTracksFp32Training) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(512), val = volt_test::blobs(256, 8, 3);
  // The tiny model's linears are under this CPU's size rule (kept fp32 for speed), and a busy
  // machine can make the probe demote whole families: turn the CPU policy off so that
  // bf16-mixed computes in bf16 here whatever the timing.
  auto run = [&](const char* name, int64_t steps, Recording& m) {
    volt::Spec<volt::Precision> precision = name;
    if (std::string(name) == "bf16-mixed") {
      precision = std::make_shared<volt::MixedPrecision>(
          volt::MixedPrecisionOptions().read_env_lists(false).cpu_policy(false));
    }
    volt::Trainer t(quiet(dir.path).max_epochs(3).max_steps(steps).precision(precision));
    t.fit(m, volt_test::loader(train));
    return val_loss(t, m, val);
  };
  {
    // One step: the update differs from fp32 only by bf16 rounding of activations and
    // gradients (relative error ~2^-8 on a 0.1-scaled update of fp32 master weights).
    torch::manual_seed(1);
    Recording fp32;
    torch::manual_seed(1);
    Recording bf16;
    const auto w0 = fp32.flat_params();
    run("32-true", 1, fp32);
    run("bf16-mixed", 1, bf16);
    const auto d32 = fp32.flat_params() - w0, d16 = bf16.flat_params() - w0;
    const double rel = ((d32 - d16).norm() / d32.norm()).item<double>();
    EXPECT_LT(rel, 0.02);
    std::printf("[ measured ] bf16-mixed vs fp32, first update: %.4f relative L2\n", rel);
    EXPECT_EQ(fp32.logits_dtype, c10::kFloat);
    EXPECT_EQ(bf16.logits_dtype, c10::kBFloat16);
    EXPECT_EQ(bf16.input_dtype, c10::kFloat);
    for (auto& p : bf16.parameters()) EXPECT_EQ(p.scalar_type(), c10::kFloat);
    EXPECT_EQ(bf16.grad_dtype, c10::kFloat);
  }
  // 96 steps: the loss curve tracks fp32 (same seed, same batches).
  torch::manual_seed(1);
  Recording fp32;
  torch::manual_seed(1);
  Recording bf16;
  const double l32 = run("32-true", -1, fp32), l16 = run("bf16-mixed", -1, bf16);
  EXPECT_LT(l32, 0.45);  // it really learned
  EXPECT_NEAR(l16, l32, 0.03);
  std::printf("[ measured ] validation loss after 96 steps: fp32 %.4f, bf16-mixed %.4f\n", l32,
              l16);
}

TEST(MixedPrecision, LossScalingSkipsAnInfStepWithoutAdvancingStepOrScheduler) {
  volt_test::TempDir dir;
  auto precision = std::make_shared<volt::MixedPrecision>(
      volt::MixedPrecisionOptions().loss_scaling(true).scaler(
          volt::GradScalerOptions().init_scale(256.0).growth_interval(100)));
  Recording m;
  m.poison_at = 3;
  m.scheduler_step_size = 1;
  m.scheduler_interval = volt::Interval::kStep;
  volt::Trainer t(quiet(dir.path).max_epochs(1).precision(precision));
  t.fit(m, volt_test::loader(volt_test::blobs(128)));  // 8 batches
  EXPECT_EQ(t.state().global_step, 7);
  ASSERT_NE(precision->scaler(), nullptr);
  EXPECT_EQ(precision->scaler()->skipped_steps(), 1);
  EXPECT_DOUBLE_EQ(precision->scaler()->current_scale(), 128.0);
  EXPECT_TRUE(torch::isfinite(m.flat_params()).all().item<bool>());
  // StepLR(step 1, gamma 0.5) steps once per real optimizer step: the 8th batch sees the
  // 6 real steps before it (0.5^7 if the skipped one had counted).
  EXPECT_DOUBLE_EQ(m.last_lr, 0.1 * std::pow(0.5, 6));
}

// Lightning's MixedPrecision unscales "after the closure is executed, but before the
// on_before_optimizer_step hook": the module's and the callbacks' hook see the true gradients
// (on_after_backward still sees the scaled ones), automatic and manual optimization alike.
class GradsSeen : public TinyClassifier {
 public:
  explicit GradsSeen(bool manual) {
    if (manual) set_automatic_optimization(false);
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    if (automatic_optimization()) return TinyClassifier::training_step(b, i);
    auto opt = optimizers().front();
    opt.zero_grad();
    manual_backward(torch::cross_entropy_loss(forward(b.input), b.target));
    opt.step();
    return {};
  }
  void on_after_backward() override {
    if (after_backward.empty()) after_backward.push_back(fc1->weight.grad().clone());
  }
  void on_before_optimizer_step(torch::optim::Optimizer&) override {
    if (before_step.empty()) before_step.push_back(fc1->weight.grad().clone());
  }
  std::vector<at::Tensor> after_backward, before_step;
};

class CallbackGradsSeen : public volt::Callback {
 public:
  std::string state_key() const override { return "CallbackGradsSeen"; }
  void on_before_optimizer_step(volt::RunContext&, volt::Module&,
                                torch::optim::Optimizer& opt) override {
    if (!seen.defined()) seen = opt.param_groups()[0].params()[0].grad().clone();
  }
  at::Tensor seen;
};

TEST(MixedPrecision, OnBeforeOptimizerStepSeesUnscaledGradients) {
  for (bool manual : {false, true}) {
    SCOPED_TRACE(manual ? "manual optimization" : "automatic optimization");
    volt_test::TempDir dir;
    // The policy off: both runs below compute in bf16 whatever the probe's timing says.
    const auto options = volt::MixedPrecisionOptions().read_env_lists(false).cpu_policy(false);
    auto precision = std::make_shared<volt::MixedPrecision>(
        volt::MixedPrecisionOptions(options).loss_scaling(true).scaler(
            volt::GradScalerOptions().init_scale(256.0)));
    torch::manual_seed(3);
    GradsSeen m(manual);
    auto cb = std::make_shared<CallbackGradsSeen>();
    volt::Trainer t(quiet(dir.path).max_steps(2).precision(precision).callbacks({cb}));
    t.fit(m, volt_test::loader(volt_test::blobs(128)));
    ASSERT_EQ(t.state().global_step, 2);
    ASSERT_EQ(m.before_step.size(), 1u);
    ASSERT_EQ(m.after_backward.size(), 1u);
    const at::Tensor seen = m.before_step[0];
    EXPECT_GT(seen.abs().max().item<double>(), 0);
    // Multiplying by 1/256 is exact: the hook's gradients are the backward's over 256.
    EXPECT_TRUE(at::equal(seen, m.after_backward[0] / 256.0));
    ASSERT_TRUE(cb->seen.defined());
    EXPECT_TRUE(at::equal(cb->seen, seen)) << "the callbacks' hook saw other gradients";
    // And the same step without a scaler sees the same gradients (a fresh run from the seed).
    volt_test::TempDir dir2;
    torch::manual_seed(3);
    GradsSeen plain(manual);
    volt::Trainer t2(
        quiet(dir2.path).max_steps(2).precision(std::make_shared<volt::MixedPrecision>(options)));
    t2.fit(plain, volt_test::loader(volt_test::blobs(128)));
    ASSERT_EQ(plain.before_step.size(), 1u);
    EXPECT_TRUE(at::allclose(seen, plain.before_step[0], 1e-5, 1e-7))
        << (seen - plain.before_step[0]).abs().max().item<double>();
  }
}

std::shared_ptr<volt::MixedPrecision> scaled(double init, int64_t interval) {
  return std::make_shared<volt::MixedPrecision>(
      volt::MixedPrecisionOptions().loss_scaling(true).scaler(
          volt::GradScalerOptions().init_scale(init).growth_interval(interval)));
}

std::shared_ptr<volt::ModelCheckpoint> last_to(const std::string& dir) {
  return std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir).save_last(true).save_top_k(0));
}

TEST(MixedPrecision, ResumeRestoresTheLossScalerAndIsBitExact) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(128);
  auto straight_p = scaled(64.0, 3);
  torch::manual_seed(1);
  Recording straight;
  straight.poison_at = 5;
  volt::Trainer a(quiet(dir.path).max_epochs(2).precision(straight_p));
  a.fit(straight, volt_test::loader(train));

  {
    torch::manual_seed(1);
    Recording first;
    first.poison_at = 5;
    volt::Trainer b(quiet(dir.path)
                        .max_epochs(1)
                        .precision(scaled(64.0, 3))
                        .callbacks({last_to(dir / "ckpt")}));
    b.fit(first, volt_test::loader(train));
  }
  auto resumed_p = scaled(64.0, 3);
  Recording resumed;
  volt::Trainer c(
      quiet(dir.path).max_epochs(2).precision(resumed_p).callbacks({last_to(dir / "ckpt")}));
  c.fit(resumed, volt_test::loader(train), c10::nullopt, "last");
  EXPECT_EQ(c.state().global_step, a.state().global_step);
  EXPECT_DOUBLE_EQ(resumed_p->scaler()->current_scale(), straight_p->scaler()->current_scale());
  EXPECT_EQ(resumed_p->scaler()->growth_tracker(), straight_p->scaler()->growth_tracker());
  EXPECT_EQ(resumed_p->scaler()->skipped_steps(), 1);
  EXPECT_TRUE(torch::equal(resumed.flat_params(), straight.flat_params()));

  // The same checkpoint under a precision without a scaler loads (nothing to restore), but a
  // scaler asked to resume from a checkpoint without its state is a CheckpointError.
  volt_test::TempDir plain;
  {
    TinyClassifier m;
    volt::Trainer t(quiet(plain.path)
                        .max_epochs(1)
                        .precision("bf16-mixed")
                        .callbacks({last_to(plain / "ckpt")}));
    t.fit(m, volt_test::loader(train));
  }
  TinyClassifier m;
  volt::Trainer t(quiet(plain.path)
                      .max_epochs(2)
                      .precision(scaled(64.0, 3))
                      .callbacks({last_to(plain / "ckpt")}));
  EXPECT_THROW(t.fit(m, volt_test::loader(train), c10::nullopt, "last"), volt::CheckpointError);
}

// 16-mixed on CUDA: autocast to fp16 with the dynamic loss scaler. The forward computes in
// fp16, weights and gradients stay fp32, and training tracks fp32 (same seed and batches);
// an inf gradient skips its step (global_step, the scheduler and the scale as on the CPU
// scaler tests).
TEST(MixedPrecisionCuda, Fp16MixedComputesInHalfAndTracksFp32Training) {
  VOLT_REQUIRE_CUDA();
  volt_test::TempDir dir;
  auto train = volt_test::blobs(512), val = volt_test::blobs(256, 8, 3);
  auto run = [&](const char* name, Recording& m) {
    volt::Trainer t(quiet(dir.path).accelerator("cuda").max_epochs(3).precision(name));
    t.fit(m, volt_test::loader(train));
    return val_loss(t, m, val);
  };
  torch::manual_seed(1);
  Recording fp32;
  torch::manual_seed(1);
  Recording fp16;
  const double l32 = run("32-true", fp32), l16 = run("16-mixed", fp16);
  EXPECT_LT(l32, 0.45);  // it really learned
  EXPECT_NEAR(l16, l32, 0.03);
  std::printf("[ measured ] CUDA validation loss after 96 steps: fp32 %.4f, 16-mixed %.4f\n", l32,
              l16);
  EXPECT_EQ(fp32.logits_dtype, c10::kFloat);
  EXPECT_EQ(fp16.logits_dtype, c10::kHalf);
  EXPECT_EQ(fp16.input_dtype, c10::kFloat);
  for (auto& p : fp16.parameters()) EXPECT_EQ(p.scalar_type(), c10::kFloat);
  EXPECT_EQ(fp16.grad_dtype, c10::kFloat);
}

TEST(MixedPrecisionCuda, Fp16LossScalingSkipsAnInfStepWithoutAdvancingStepOrScheduler) {
  VOLT_REQUIRE_CUDA();
  volt_test::TempDir dir;
  auto precision =
      std::make_shared<volt::MixedPrecision>(volt::MixedPrecisionOptions().dtype("fp16").scaler(
          volt::GradScalerOptions().init_scale(256.0).growth_interval(100)));
  Recording m;
  m.poison_at = 3;
  m.scheduler_step_size = 1;
  m.scheduler_interval = volt::Interval::kStep;
  volt::Trainer t(quiet(dir.path).accelerator("cuda").max_epochs(1).precision(precision));
  t.fit(m, volt_test::loader(volt_test::blobs(128)));  // 8 batches
  EXPECT_EQ(precision->name(), "16-mixed");
  EXPECT_EQ(t.state().global_step, 7);
  ASSERT_NE(precision->scaler(), nullptr);
  EXPECT_EQ(precision->scaler()->skipped_steps(), 1);
  EXPECT_DOUBLE_EQ(precision->scaler()->current_scale(), 128.0);
  EXPECT_TRUE(torch::isfinite(m.flat_params()).all().item<bool>());
  EXPECT_DOUBLE_EQ(m.last_lr, 0.1 * std::pow(0.5, 6));
}

TEST(MixedPrecision, Bf16TrueRunsTheModelAndItsInputsInBf16) {
  volt_test::TempDir dir;
  Recording m;
  volt::Trainer t(quiet(dir.path).max_epochs(2).precision("bf16-true"));
  t.fit(m, volt_test::loader(volt_test::blobs(256)));
  EXPECT_EQ(m.input_dtype, c10::kBFloat16);
  EXPECT_EQ(m.logits_dtype, c10::kBFloat16);
  EXPECT_EQ(m.grad_dtype, c10::kBFloat16);
  for (auto& p : m.parameters()) EXPECT_EQ(p.scalar_type(), c10::kBFloat16);
  const double acc =
      t.validate(m, volt_test::loader(volt_test::blobs(256, 8, 3), 64, false)).at("val_acc");
  EXPECT_GT(acc, 0.8);
}

TEST(MixedPrecision, Fp16OnACpuOnlyLibtorch113IsNotAvailableWithTheReason) {
#if VOLT_TORCH_AT_LEAST(2, 4)
  GTEST_SKIP() << "libtorch >= 2.4 has fp16 CPU autocast";
#endif
  volt_test::TempDir dir;
  TinyClassifier m;
  volt::Trainer t(quiet(dir.path).max_epochs(1).precision("16-mixed"));
  try {
    t.fit(m, volt_test::loader(volt_test::blobs(64)));
    FAIL() << "expected NotAvailable";
  } catch (const volt::NotAvailable& e) {
    EXPECT_NE(std::string(e.what()).find("use at::kBFloat16 on CPU"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(volt::MixedPrecision(volt::MixedPrecisionOptions().dtype("fp8")), volt::ConfigError);
}

TEST(MixedPrecision, CpuPolicyKeepsOnlyTheFamiliesThisCpuRunsSlowerInFp32) {
  using Probe = volt::MixedPrecision::CpuProbe;
  auto has = [](const std::vector<std::string>& v, const char* op) {
    return std::find(v.begin(), v.end(), op) != v.end();
  };
  EXPECT_TRUE(volt::MixedPrecision::cpu_fp32_ops(Probe{2.8, 2.3}).empty());
  auto slow_mm = volt::MixedPrecision::cpu_fp32_ops(Probe{0.85, 1.4});
  EXPECT_TRUE(has(slow_mm, "addmm") && has(slow_mm, "linear") && has(slow_mm, "mm"));
  EXPECT_FALSE(has(slow_mm, "conv2d"));
  auto slow_conv = volt::MixedPrecision::cpu_fp32_ops(Probe{1.2, 0.7});
  EXPECT_TRUE(has(slow_conv, "conv2d") && !has(slow_conv, "mm"));
  // Every name in the policy is a real functional aten op (else setup would throw).
  volt::AutocastOpLists check(c10::kCPU, at::kBFloat16, {},
                              volt::MixedPrecision::cpu_fp32_ops(Probe{0.5, 0.5}));
  EXPECT_GE(check.fp32_overloads().size(), 15u);

  // The real probe ran once and measured something; its figures decide this machine's policy.
  const auto& p = volt::MixedPrecision::cpu_probe();
  EXPECT_GT(p.matmul_speedup, 0.0);
  EXPECT_GT(p.conv_speedup, 0.0);
  EXPECT_EQ(&p, &volt::MixedPrecision::cpu_probe());
  std::printf("[ measured ] this CPU: bf16 matmul %.2fx, conv %.2fx fp32 speed\n", p.matmul_speedup,
              p.conv_speedup);
  volt::MixedPrecision mp(volt::MixedPrecisionOptions().read_env_lists(false));
  mp.setup(torch::kCPU);
  const size_t expected = volt::MixedPrecision::cpu_fp32_ops(p).size();
  EXPECT_EQ(mp.op_lists() == nullptr, expected == 0);
}

// A user's lower list wins over the policy: where this CPU's probe demotes "mm" to fp32, it stays
// bf16 with lower_ops({"mm"}). On a CPU whose bf16 matmuls are fast the policy demotes nothing
// and the check would hold whatever the lists' priority: skipped there, saying so.
TEST(MixedPrecision, TheUsersLowerListWinsOverTheCpuPolicy) {
  const auto mm = [] { return torch::mm(torch::randn({4, 8}), torch::randn({8, 2})); };
  volt::MixedPrecision policy(volt::MixedPrecisionOptions().read_env_lists(false));
  policy.setup(torch::kCPU);
  {
    auto ctx = policy.forward_context();
    if (mm().scalar_type() != at::kFloat) {
      GTEST_SKIP() << "this CPU's policy keeps mm in bf16 (fast bf16 matmuls): nothing to override";
    }
  }
  policy.teardown();
  volt::MixedPrecision user(volt::MixedPrecisionOptions().read_env_lists(false).lower_ops({"mm"}));
  user.setup(torch::kCPU);
  auto ctx = user.forward_context();
  EXPECT_EQ(mm().scalar_type(), at::kBFloat16);
}

// A second precision set up and torn down while the first is installed (a tuner callback's
// trial Trainer inside the fit) leaves the first's size rule in force: its teardown set the
// process-wide threshold to 0, and every linear of the fit ran in bf16 from then on.
TEST(MixedPrecision, ATrialsTeardownLeavesTheFitsSizeRule) {
  const auto x_small = torch::randn({4, 8}), w_small = torch::randn({2, 8});  // 64 MACs
  const auto opts = volt::MixedPrecisionOptions().read_env_lists(false).linear_min_macs(1000);
  volt::MixedPrecision fit(opts);
  fit.setup(torch::kCPU);
  {
    volt::MixedPrecision trial(opts);
    trial.setup(torch::kCPU);
    trial.teardown();
  }
  {
    auto ctx = fit.forward_context();
    EXPECT_EQ(torch::linear(x_small, w_small).scalar_type(), at::kFloat);
    EXPECT_EQ(torch::nn::Linear(8, 2)(x_small).scalar_type(), at::kFloat);
  }
  fit.teardown();
  auto ctx = fit.forward_context();
  EXPECT_EQ(torch::linear(x_small, w_small).scalar_type(), at::kBFloat16);
}

TEST(MixedPrecision, CpuSizeRuleKeepsSmallLinearsInFp32AndTheUsersListsWin) {
  // An explicit linear_min_macs replaces the measured matmul decision, so this holds on any CPU.
  const auto x_small = torch::randn({4, 8}), w_small = torch::randn({2, 8});  // 64 MACs
  const auto x_big = torch::randn({4, 32}), w_big = torch::randn({32, 32});   // 4096 MACs
  auto opts = volt::MixedPrecisionOptions().read_env_lists(false);
  EXPECT_THROW(volt::MixedPrecision(volt::MixedPrecisionOptions(opts).linear_min_macs(-1)),
               volt::ConfigError);
  {
    volt::MixedPrecision p(volt::MixedPrecisionOptions(opts).linear_min_macs(1000));
    p.setup(torch::kCPU);
    auto ctx = p.forward_context();
    const auto small = torch::linear(x_small, w_small);
    EXPECT_EQ(small.scalar_type(), at::kFloat);
    {
      volt::AutocastGuard off(c10::kCPU, at::kBFloat16, false);
      EXPECT_TRUE(torch::equal(small, torch::linear(x_small, w_small)));  // exactly fp32
    }
    EXPECT_EQ(torch::linear(x_big, w_big).scalar_type(), at::kBFloat16);
    // torch::nn::Linear reaches the dispatcher as addmm / matmul: the rule covers both.
    torch::nn::Linear small_layer(8, 2), big_layer(32, 32);
    EXPECT_EQ(small_layer(x_small).scalar_type(), at::kFloat);
    EXPECT_EQ(small_layer(x_small.reshape({2, 2, 8})).scalar_type(), at::kFloat);
    EXPECT_EQ(big_layer(x_big).scalar_type(), at::kBFloat16);
    EXPECT_EQ(big_layer(x_big.reshape({2, 2, 32})).scalar_type(), at::kBFloat16);
    p.teardown();
    // Back to libtorch's policy: every linear in bf16.
    EXPECT_EQ(torch::linear(x_small, w_small).scalar_type(), at::kBFloat16);
  }
  for (auto o : {volt::MixedPrecisionOptions(opts).linear_min_macs(0),
                 volt::MixedPrecisionOptions(opts).linear_min_macs(1000).lower_ops({"linear"}),
                 volt::MixedPrecisionOptions(opts).linear_min_macs(1000).cpu_policy(false)}) {
    volt::MixedPrecision p(o);
    p.setup(torch::kCPU);
    auto ctx = p.forward_context();
    EXPECT_EQ(torch::linear(x_small, w_small).scalar_type(), at::kBFloat16) << o;
  }
  // The measured threshold is one of the probe's sizes (64 x n x n + 1) or 0 (bf16 wins at all).
  const int64_t m = volt::MixedPrecision::cpu_probe().matmul_min_macs;
  bool on_ladder = m == 0;
  for (int64_t n : {768, 512, 362, 256, 181, 128}) on_ladder = on_ladder || m == 64 * n * n + 1;
  EXPECT_TRUE(on_ladder) << m;
  std::printf("[ measured ] this CPU's size rule: linears under %lld multiply-adds stay fp32\n",
              static_cast<long long>(m));
}

namespace {

// The bf16 speed probe is measured once per machine and read by every later process, so the
// ranks of a job and a resumed job make the same fp32/bf16 decisions whatever their load.
TEST(MixedPrecisionProbe, ProcessesReadTheOneCachedMeasurement) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const std::map<std::string, std::string> env{{"VOLT_CACHE_DIR", dir / "cache"}};
  auto run = [&](const std::string& out) {
    volt_test::Process p(volt_test::kTrainingWorker,
                         {"--root", dir / out, "--out", dir / (out + "/w"), "--devices", "1",
                          "--batch", "8", "--epochs", "1", "--precision", "bf16-mixed"},
                         env);
    const int code = p.exit_code(std::chrono::seconds(120));
    EXPECT_EQ(code, 0) << p.output();
    return p.output();
  };
  auto cache_file = [&] {
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(dir / "cache")) {
      const std::string name = e.path().filename().string();
      if (name.rfind("bf16_probe_", 0) == 0 && name.size() > 4 &&
          name.substr(name.size() - 4) == ".txt") {
        files.push_back(e.path().string());
      }
    }
    EXPECT_EQ(files.size(), 1u);
    return files.empty() ? std::string() : files[0];
  };
  std::string out = run("a");
  EXPECT_NE(out.find("bf16 speed probe measured and cached"), std::string::npos) << out;
  const std::string file = cache_file();
  ASSERT_FALSE(file.empty());
  std::string key;
  {
    std::ifstream in(file);
    std::getline(in, key);
  }
  EXPECT_EQ(key.rfind("bf16 probe v1|", 0), 0u) << key;
  // Figures planted in the file are what the next process decides by: convolutions "slower".
  {
    std::ofstream f(file, std::ios::trunc);
    f << key << "\nmatmul_speedup 2.5\nconv_speedup 0.25\nmatmul_min_macs 0\n";
  }
  out = run("b");
  EXPECT_NE(out.find("bf16 speed probe read from"), std::string::npos) << out;
  EXPECT_NE(out.find("bf16 matmuls at 2.50x and convolutions at 0.25x"), std::string::npos) << out;
  // A damaged file is measured again and rewritten whole.
  {
    std::ofstream f(file, std::ios::trunc);
    f << key << "\nmatmul_speedup nonsense\n";
  }
  out = run("c");
  EXPECT_NE(out.find("bf16 speed probe measured and cached"), std::string::npos) << out;
  std::ifstream in(file);
  std::string line, word;
  std::getline(in, line);
  double v = 0;
  EXPECT_TRUE(static_cast<bool>(in >> word >> v)) << "the rewritten cache does not parse";
  EXPECT_EQ(word, "matmul_speedup");
  EXPECT_GT(v, 0.0);
}

}  // namespace

// The autocast region spans a whole training_step: a lowered weight cast under no_grad (a target
// network, a metric) or before a manual optimizer.step() must not be reused after it. With
// autocast's cast cache the forward after the no_grad one had no grad_fn to the weight, and the
// forward after the step computed with the old weights (Lightning #20921).
TEST(MixedPrecision, NoCastMadeUnderNoGradOrBeforeAStepIsReusedInTheStep) {
  volt::MixedPrecision p(volt::MixedPrecisionOptions().read_env_lists(false).cpu_policy(false));
  p.setup(torch::kCPU);
  torch::manual_seed(0);
  torch::nn::Linear lin(16, 16);
  const auto x = torch::randn({4, 16});
  {
    auto ctx = p.forward_context();
    {
      torch::NoGradGuard no_grad;
      EXPECT_EQ(lin(x).scalar_type(), at::kBFloat16);
    }
    const auto y = lin(x);
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    ASSERT_TRUE(y.requires_grad());
    y.sum().backward();
    ASSERT_TRUE(lin->weight.grad().defined());
    EXPECT_GT(lin->weight.grad().abs().sum().item<double>(), 0);

    torch::optim::SGD opt(lin->parameters(), torch::optim::SGDOptions(0.5));
    const auto before = lin(x).detach();
    opt.step();
    EXPECT_FALSE(torch::equal(lin(x).detach(), before));
  }
  p.teardown();
}
