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
