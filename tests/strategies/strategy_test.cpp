// The Strategy seam's single-process defaults.
#include <gtest/gtest.h>

#include "reread.h"
#include "tiny.h"

namespace {

volt::SingleDeviceStrategy cpu_strategy() {
  return volt::SingleDeviceStrategy(c10::Device(c10::kCPU),
                                    std::make_shared<volt::CpuAccelerator>(),
                                    std::make_shared<volt::Fp32Precision>());
}

TEST(Strategy, SingleProcessCollectivesAreIdentities) {
  auto s = cpu_strategy();
  auto t = torch::arange(4.0);
  EXPECT_TRUE(torch::equal(s.reduce(t, volt::Reduce::kSum), t));
  EXPECT_TRUE(torch::equal(s.broadcast(t, 0), t));
  auto all = s.all_gather(t);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_TRUE(torch::equal(all[0], t));
  EXPECT_TRUE(s.reduce_boolean_decision(true));
  EXPECT_FALSE(s.reduce_boolean_decision(false, /*all=*/false));
  EXPECT_EQ(s.data_shard().rank, 0);
  EXPECT_EQ(s.data_shard().world_size, 1);
  EXPECT_TRUE(s.is_global_zero());
}

TEST(Strategy, RngStatesRoundTripAndRequireTheCpuGenerator) {
  auto s = cpu_strategy();
  torch::manual_seed(5);
  auto states = s.rng_states();
  ASSERT_EQ(states.count("torch_cpu"), 1u);
  auto a = torch::rand({3});
  s.set_rng_states(states);
  EXPECT_TRUE(torch::equal(a, torch::rand({3})));
  try {
    s.set_rng_states({});
    FAIL() << "expected CheckpointError";
  } catch (const volt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("no torch_cpu generator state"), std::string::npos);
  }
}

TEST(Strategy, AccumulatedGradientsRoundTripByName) {
  auto s = cpu_strategy();
  volt_test::TinyClassifier a, b;
  for (auto& p : a.parameters()) p.mutable_grad() = torch::full_like(p, 0.5);
  torch::serialize::OutputArchive out;
  s.save_accumulated_gradients(a, out);
  auto in = volt_test::reread(out);
  s.load_accumulated_gradients(b, in);
  for (auto& p : b.parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_TRUE(torch::equal(p.grad(), torch::full_like(p, 0.5)));
  }
}

}  // namespace
