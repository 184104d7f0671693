// GradScaler: scale, unscale, skip on inf/NaN, growth and backoff, state round trip; DeepSpeed's
// mode (hysteresis, floor, static scale) against tools/deepspeed_loss_scale_reference.py.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <volt/volt.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "error_text.h"
#include "reread.h"

namespace {

struct OneParam {
  torch::Tensor w = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD opt{{w}, torch::optim::SGDOptions(0.5)};
  void grads(std::vector<float> g) { w.mutable_grad() = torch::tensor(g); }
};

}  // namespace

TEST(GradScaler, ScalesTheLossAndUnscalesGradientsOncePerStep) {
  volt::GradScaler s(volt::GradScalerOptions().init_scale(8.0));
  EXPECT_DOUBLE_EQ(s.scale(torch::tensor(1.5f)).item<double>(), 12.0);
  OneParam t;
  t.grads({8, 16, -8});
  s.unscale(t.opt);
  s.unscale(t.opt);  // second call before step: no-op
  EXPECT_TRUE(torch::equal(t.w.grad(), torch::tensor({1.f, 2.f, -1.f})));
  EXPECT_TRUE(s.step(t.opt));
  EXPECT_TRUE(torch::allclose(t.w.detach(), torch::tensor({0.5f, 0.f, 1.5f})));
}

// Each optimizer has its own unscale: clipping two optimizers before stepping either unscales
// both (one shared flag left the second scaled: clipped at 64x and stepped at 1/8 of its
// gradient), and one optimizer's inf skips only its own step.
TEST(GradScaler, EachOptimizerIsUnscaledOnceAndSkipsOnItsOwnFinding) {
  volt::GradScaler s(volt::GradScalerOptions().init_scale(8.0));
  s.scale(torch::tensor(1.f));  // the backward that made both optimizers' gradients
  OneParam a, b;
  a.grads({8, 16, -8});
  b.grads({16, 8, 8});
  s.unscale(a.opt);
  s.unscale(b.opt);
  s.unscale(a.opt);  // again before its step, no backward since: a no-op
  EXPECT_TRUE(torch::equal(a.w.grad(), torch::tensor({1.f, 2.f, -1.f})));
  EXPECT_TRUE(torch::equal(b.w.grad(), torch::tensor({2.f, 1.f, 1.f})));
  EXPECT_TRUE(s.step(a.opt));
  EXPECT_TRUE(s.step(b.opt));
  EXPECT_TRUE(torch::allclose(a.w.detach(), torch::tensor({0.5f, 0.f, 1.5f})));
  EXPECT_TRUE(torch::allclose(b.w.detach(), torch::tensor({0.f, 0.5f, 0.5f})));

  // a's gradients hold inf: a skips and the scale backs off to 4, b (not unscaled yet) still
  // divides by the 8 its backward used, and steps.
  s.scale(torch::tensor(1.f));
  a.grads({std::numeric_limits<float>::infinity(), 8, 8});
  b.grads({8, 8, 8});
  EXPECT_FALSE(s.step(a.opt));
  EXPECT_DOUBLE_EQ(s.current_scale(), 4.0);
  EXPECT_TRUE(s.step(b.opt));
  EXPECT_TRUE(torch::allclose(b.w.detach(), torch::tensor({-0.5f, 0.f, 0.f})));
}

// A GAN's order: the generator's loss backward, its clipping (unscale), the discriminator's loss
// backward (its own parameters), then both steps: the generator's recorded finding stands (as in
// torch's step()), the discriminator's gradients are unscaled at its step.
TEST(GradScaler, AnotherOptimizersBackwardBetweenUnscaleAndStepIsFine) {
  volt::GradScaler s(volt::GradScalerOptions().init_scale(8.0));
  OneParam g, d;
  s.scale(torch::tensor(1.f));
  g.grads({8, 16, -8});
  s.unscale(g.opt);
  s.scale(torch::tensor(1.f));
  d.grads({16, 8, 8});
  EXPECT_TRUE(s.step(g.opt));
  EXPECT_TRUE(s.step(d.opt));
  EXPECT_TRUE(torch::allclose(g.w.detach(), torch::tensor({0.5f, 0.f, 1.5f})));
  EXPECT_TRUE(torch::allclose(d.w.detach(), torch::tensor({0.f, 0.5f, 0.5f})));
}

// Unscaled, then another backward before the step (a step skipped after clipping, or clipping
// every micro-batch of an accumulation): the new gradients came scaled on top of unscaled ones.
// torch's GradScaler raises here; a shared flag let the scaled sum through to the step.
TEST(GradScaler, AnotherBackwardAfterUnscalingWithoutAStepIsAValueError) {
  volt::GradScaler s(volt::GradScalerOptions().init_scale(8.0));
  OneParam t;
  s.scale(torch::tensor(1.f));
  t.grads({8, 8, 8});
  s.unscale(t.opt);
  s.scale(torch::tensor(1.f));
  t.w.mutable_grad().add_(torch::full({3}, 8.f));
  try {
    s.unscale(t.opt);
    ADD_FAILURE() << "no error";
  } catch (const volt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[GradScaler] an optimizer's gradients were unscaled"),
              std::string::npos)
        << e.what();
  }
  // After a step the next backward starts afresh.
  volt::GradScaler fresh(volt::GradScalerOptions().init_scale(8.0));
  fresh.scale(torch::tensor(1.f));
  t.grads({8, 8, 8});
  EXPECT_TRUE(fresh.step(t.opt));
  fresh.scale(torch::tensor(1.f));
  t.grads({8, 8, 8});
  fresh.unscale(t.opt);
  EXPECT_TRUE(torch::equal(t.w.grad(), torch::ones({3})));
}

TEST(GradScaler, InfOrNanGradientsSkipTheStepAndBackOff) {
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    volt::GradScaler s(volt::GradScalerOptions().init_scale(1024.0).growth_interval(2));
    OneParam t;
    t.grads({1, bad, 1});
    EXPECT_FALSE(s.step(t.opt));
    EXPECT_TRUE(torch::equal(t.w.detach(), torch::ones({3})));  // untouched
    EXPECT_DOUBLE_EQ(s.current_scale(), 512.0);
    EXPECT_EQ(s.skipped_steps(), 1);
    EXPECT_EQ(s.growth_tracker(), 0);
  }
}

TEST(GradScaler, SparseGradientsAreUnscaledAndCheckedByTheirValues) {
  // An Embedding(sparse=true)'s gradient: at::isfinite has no sparse kernel, so unscale()
  // threw a c10::Error at the first step. As torch's GradScaler, its values are unscaled and
  // checked (duplicate indices stay, summed by the optimizer as without loss scaling).
  for (float bad : {1.0f, std::numeric_limits<float>::infinity()}) {
    volt::GradScaler s(volt::GradScalerOptions().init_scale(4.0));
    auto w = torch::ones({4, 2}, torch::requires_grad());
    torch::optim::SGD opt({w}, torch::optim::SGDOptions(1.0));
    const auto indices = torch::tensor({{1, 3, 1}}, torch::kLong);
    const auto values = torch::tensor({{4.f, 8.f}, {bad * 4, 4.f}, {4.f, 4.f}});
    w.mutable_grad() = torch::sparse_coo_tensor(indices, values, {4, 2});
    const bool stepped = s.step(opt);
    EXPECT_EQ(stepped, bad == 1.0f);
    if (stepped) {  // rows 1 (twice) and 3 at a quarter of the scaled values
      const auto want = torch::tensor({{1.f, 1.f}, {-1.f, -2.f}, {1.f, 1.f}, {0.f, 0.f}});
      EXPECT_TRUE(torch::allclose(w.detach(), want)) << w;
    } else {
      EXPECT_TRUE(torch::equal(w.detach(), torch::ones({4, 2})));
      EXPECT_DOUBLE_EQ(s.current_scale(), 2.0);
    }
  }
}

TEST(GradScaler, TheAgreedFindingDecidesTheStep) {
  // ZeRO: each process checked only its own gradients; the agreed finding is what counts, both
  // ways (another rank's NaN skips this rank's finite step; the reduction says what happened).
  for (bool others_found : {true, false}) {
    volt::GradScaler s(volt::GradScalerOptions().init_scale(8.0));
    OneParam t;
    t.grads({8, 8, 8});
    s.unscale(t.opt);
    bool asked = false;
    s.agree_on_found_inf([&](bool mine) {
      asked = true;
      EXPECT_FALSE(mine);  // this rank's gradients are finite
      return others_found;
    });
    EXPECT_TRUE(asked);
    EXPECT_EQ(s.step(t.opt), !others_found);
    EXPECT_DOUBLE_EQ(s.current_scale(), others_found ? 4.0 : 8.0);
  }
  // Before unscale there is no finding to agree on.
  volt::GradScaler s;
  EXPECT_THROW(s.agree_on_found_inf([](bool b) { return b; }), volt::InternalError);
  // The precisions that own a scaler forward it; the others scale nothing.
  volt::MixedPrecision scaled(volt::MixedPrecisionOptions().loss_scaling(true));
  volt::Fp8Precision fp8(
      volt::Fp8PrecisionOptions().mixed(volt::MixedPrecisionOptions().loss_scaling(true)));
  EXPECT_TRUE(scaled.scales_loss());
  EXPECT_TRUE(fp8.scales_loss());
  EXPECT_FALSE(
      volt::MixedPrecision(volt::MixedPrecisionOptions().loss_scaling(false)).scales_loss());
  OneParam t;
  t.grads({1, 1, 1});
  fp8.unscale_gradients(t.opt);
  fp8.agree_on_found_inf([](bool) { return true; });
  EXPECT_FALSE(fp8.optimizer_step(t.opt));
}

TEST(GradScaler, GrowsAfterGrowthIntervalFiniteStepsAndStaysFinite) {
  volt::GradScaler s(volt::GradScalerOptions().init_scale(4.0).growth_interval(3));
  OneParam t;
  for (int i = 0; i < 3; ++i) {
    t.grads({1, 1, 1});
    EXPECT_TRUE(s.step(t.opt));
  }
  EXPECT_DOUBLE_EQ(s.current_scale(), 8.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  volt::GradScaler huge(volt::GradScalerOptions().init_scale(3e38).growth_interval(1));
  t.grads({1, 1, 1});
  huge.step(t.opt);
  EXPECT_DOUBLE_EQ(huge.current_scale(), 3e38);  // 6e38 would overflow fp32
}

TEST(GradScaler, StateRoundTripsThroughAnArchive) {
  volt::GradScaler a(volt::GradScalerOptions().init_scale(64.0).growth_interval(5));
  OneParam t;
  t.grads({1, 1, 1});
  a.step(t.opt);
  t.grads({std::numeric_limits<float>::infinity(), 1, 1});
  a.step(t.opt);
  t.grads({1, 1, 1});
  a.step(t.opt);
  torch::serialize::OutputArchive out;
  a.save_state(out);
  auto in = volt_test::reread(out);
  volt::GradScaler b;
  b.load_state(in);
  EXPECT_DOUBLE_EQ(b.current_scale(), 32.0);
  EXPECT_EQ(b.growth_tracker(), 1);
  EXPECT_EQ(b.skipped_steps(), 1);
  torch::serialize::InputArchive empty;
  EXPECT_THROW(b.load_state(empty), volt::CheckpointError);
}

// DeepSpeed's DynamicLossScaler: the scales after each step of an overflow (O) / finite (G)
// pattern, printed by tools/deepspeed_loss_scale_reference.py.
TEST(GradScaler, HysteresisAndTheFloorFollowDeepSpeedsDynamicLossScaler) {
  struct Case {
    const char* name;
    double init;
    int64_t window, hysteresis;
    bool consecutive;
    std::string pattern;
    std::vector<double> scales;  // after each step; fewer than the pattern: the next one throws
  };
  const double inf = std::numeric_limits<float>::infinity();
  for (const Case& c : {Case{"hysteresis",
                             16,
                             3,
                             2,
                             false,
                             "OOGGGOGOOGGGOGO",
                             {16, 8, 8, 8, 16, 16, 16, 8, 4, 4, 4, 8, 8, 8, 4}},
                        Case{"consecutive",
                             16,
                             3,
                             2,
                             true,
                             "OOGGGOGOOGGGOGO",
                             {16, 8, 8, 8, 16, 16, 16, 16, 8, 8, 8, 16, 16, 16, 16}},
                        Case{"floor", 4, 4, 1, false, "OOGOO", {2, 1, 1}}}) {
    volt::GradScaler s(volt::GradScalerOptions()
                           .init_scale(c.init)
                           .growth_interval(c.window)
                           .hysteresis(c.hysteresis)
                           .consecutive_hysteresis(c.consecutive)
                           .min_scale(1)
                           .error_at_min_scale(true));
    OneParam t;
    for (size_t i = 0; i < c.pattern.size(); ++i) {
      const bool overflow = c.pattern[i] == 'O';
      t.grads({1, overflow ? static_cast<float>(inf) : 1.f, 1});
      if (i == c.scales.size()) {
        const auto before = t.w.detach().clone();
        try {
          s.step(t.opt);
          FAIL() << c.name << ": no error at the floor";
        } catch (const volt::ValueError& e) {
          EXPECT_NE(std::string(e.what()).find("at its floor (min_scale=1"), std::string::npos)
              << e.what();
        }
        EXPECT_TRUE(torch::equal(t.w.detach(), before)) << c.name;
        break;
      }
      EXPECT_EQ(s.step(t.opt), !overflow) << c.name << " step " << i;
      EXPECT_DOUBLE_EQ(s.current_scale(), c.scales[i]) << c.name << " step " << i;
    }
  }
  // Without error_at_min_scale the floor holds and the steps are skipped.
  volt::GradScaler floor(volt::GradScalerOptions().init_scale(2).min_scale(1));
  OneParam t;
  for (int i = 0; i < 3; ++i) {
    t.grads({static_cast<float>(inf), 1, 1});
    EXPECT_FALSE(floor.step(t.opt));
  }
  EXPECT_DOUBLE_EQ(floor.current_scale(), 1.0);
  EXPECT_EQ(floor.skipped_steps(), 3);
}

TEST(GradScaler, AStaticScaleNeverMovesButStillSkipsInfSteps) {
  volt::GradScaler s(volt::GradScalerOptions().init_scale(128).dynamic(false).growth_interval(1));
  OneParam t;
  for (const char c : std::string("GOGGO")) {
    t.grads({128, c == 'O' ? std::numeric_limits<float>::infinity() : 128.f, 128});
    EXPECT_EQ(s.step(t.opt), c == 'G');
    EXPECT_DOUBLE_EQ(s.current_scale(), 128.0);
  }
  EXPECT_EQ(s.skipped_steps(), 2);
  EXPECT_TRUE(torch::allclose(t.w.detach(), torch::full({3}, -0.5f)));  // 3 steps of lr 0.5
}

TEST(GradScaler, PendingHysteresisIsCheckpointed) {
  const auto opts = volt::GradScalerOptions().init_scale(64).hysteresis(3);
  volt::GradScaler a(opts);
  OneParam t;
  t.grads({std::numeric_limits<float>::infinity(), 1, 1});
  a.step(t.opt);
  EXPECT_EQ(a.hysteresis_left(), 2);
  EXPECT_DOUBLE_EQ(a.current_scale(), 64.0);
  const auto saved = [&](const std::function<void(torch::serialize::OutputArchive&)>& write) {
    torch::serialize::OutputArchive out;
    write(out);
    auto buf = std::make_shared<std::stringstream>();
    out.save_to(*buf);
    return buf;
  };
  const auto load = [](volt::GradScaler& s, std::stringstream& buf) {
    torch::serialize::InputArchive in;
    in.load_from(buf);
    s.load_state(in);
  };
  auto buf = saved([&](auto& out) { a.save_state(out); });
  volt::GradScaler b(opts);
  load(b, *buf);
  EXPECT_EQ(b.hysteresis_left(), 2);
  // Two more overflows: the first spends the hysteresis, the second backs off.
  for (double expect : {64.0, 32.0}) {
    t.grads({std::numeric_limits<float>::infinity(), 1, 1});
    b.step(t.opt);
    EXPECT_DOUBLE_EQ(b.current_scale(), expect);
  }
  // A checkpoint from before hysteresis existed has none pending.
  auto old = saved([](auto& out) {
    out.write("scale", torch::tensor(8.0, torch::kFloat64));
    out.write("growth_tracker", torch::tensor(int64_t{0}));
    out.write("skipped_steps", torch::tensor(int64_t{0}));
  });
  volt::GradScaler c(opts);
  load(c, *old);
  EXPECT_EQ(c.hysteresis_left(), 3);
  // More pending than these settings allow: resumed with other settings.
  buf->seekg(0);
  volt::GradScaler d(volt::GradScalerOptions().hysteresis(1));
  EXPECT_THROW(load(d, *buf), volt::CheckpointError);
}

TEST(GradScaler, ACorruptStateIsACheckpointErrorAndLeavesTheScalerAsItWas) {
  // Each bad entry alone: a tensor of several values (item() would throw libtorch's raw error),
  // a negative count, a NaN scale, an out-of-range hysteresis. Nothing is assigned before the
  // checks, so the scaler goes on with its own state.
  struct Bad {
    const char* key;
    at::Tensor value;
    const char* phrase;
  };
  const std::vector<Bad> bad = {
      {"scale", torch::ones({2}, torch::kFloat64), "scale holds 2 values"},
      {"scale", torch::tensor(std::nan(""), torch::kFloat64), "must be finite"},
      {"growth_tracker", torch::tensor(int64_t{-1}), "must be >= 0"},
      {"skipped_steps", torch::tensor(int64_t{-3}), "must be >= 0"},
      {"hysteresis_left", torch::zeros({0}, torch::kInt64), "hysteresis_left holds 0 values"},
  };
  for (const Bad& b : bad) {
    torch::serialize::OutputArchive out;
    const std::map<std::string, at::Tensor> good = {{"scale", torch::tensor(8.0, torch::kFloat64)},
                                                    {"growth_tracker", torch::tensor(int64_t{2})},
                                                    {"skipped_steps", torch::tensor(int64_t{1})},
                                                    {"hysteresis_left", torch::tensor(int64_t{1})}};
    for (const auto& [key, value] : good) out.write(key, key == b.key ? b.value : value);
    auto in = volt_test::reread(out);
    volt::GradScaler s(volt::GradScalerOptions().init_scale(64.0));
    const std::string what = volt_test::error_of<volt::CheckpointError>([&] { s.load_state(in); });
    EXPECT_NE(what.find(b.phrase), std::string::npos) << b.key << ": " << what;
    EXPECT_DOUBLE_EQ(s.current_scale(), 64.0) << b.key;
    EXPECT_EQ(s.growth_tracker(), 0) << b.key;
    EXPECT_EQ(s.skipped_steps(), 0) << b.key;
  }
}

TEST(GradScaler, BadOptionsAreConfigErrors) {
  EXPECT_THROW(volt::GradScaler(volt::GradScalerOptions().init_scale(0)), volt::ConfigError);
  EXPECT_THROW(volt::GradScaler(volt::GradScalerOptions().growth_factor(1.0)), volt::ConfigError);
  EXPECT_THROW(volt::GradScaler(volt::GradScalerOptions().backoff_factor(1.0)), volt::ConfigError);
  EXPECT_THROW(volt::GradScaler(volt::GradScalerOptions().growth_interval(0)), volt::ConfigError);
  EXPECT_THROW(volt::GradScaler(volt::GradScalerOptions().hysteresis(0)), volt::ConfigError);
  EXPECT_THROW(volt::GradScaler(volt::GradScalerOptions().min_scale(-1)), volt::ConfigError);
  EXPECT_THROW(volt::GradScaler(volt::GradScalerOptions().init_scale(4).min_scale(8)),
               volt::ConfigError);
  EXPECT_THROW(volt::GradScaler(volt::GradScalerOptions().error_at_min_scale(true)),
               volt::ConfigError);
}
