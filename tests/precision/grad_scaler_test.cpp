// GradScaler: scale, unscale, skip on inf/NaN, growth and backoff, state round trip.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <volt/volt.h>

#include <limits>

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
  std::stringstream buf;
  out.save_to(buf);
  torch::serialize::InputArchive in;
  in.load_from(buf);
  volt::GradScaler b;
  b.load_state(in);
  EXPECT_DOUBLE_EQ(b.current_scale(), 32.0);
  EXPECT_EQ(b.growth_tracker(), 1);
  EXPECT_EQ(b.skipped_steps(), 1);
  torch::serialize::InputArchive empty;
  EXPECT_THROW(b.load_state(empty), volt::CheckpointError);
}

TEST(GradScaler, BadOptionsAreConfigErrors) {
  EXPECT_THROW(volt::GradScaler(volt::GradScalerOptions().init_scale(0)), volt::ConfigError);
  EXPECT_THROW(volt::GradScaler(volt::GradScalerOptions().growth_factor(1.0)), volt::ConfigError);
  EXPECT_THROW(volt::GradScaler(volt::GradScalerOptions().backoff_factor(1.0)), volt::ConfigError);
  EXPECT_THROW(volt::GradScaler(volt::GradScalerOptions().growth_interval(0)), volt::ConfigError);
}
