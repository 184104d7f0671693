// ZeroEngine in one process (a group of one): the partitioned optimizer steps like the
// unpartitioned one, stage 3 releases parameters and gathers them when an op reads them inside
// a scope (forward and backward give the unpartitioned results), refuses reads outside scopes
// and in-place writes, and restores whole parameters. Several ranks: tests/strategies/
// deepspeed_test.cpp.
#include "volt/distributed/zero_engine.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "distributed/detail/net.h"
#include "volt/core/errors.h"

namespace {

std::shared_ptr<volt::ProcessGroup> world_of_one() {
  volt::ClusterEnvironment env;
  env.main_port = volt::detail::find_free_port();
  return std::make_shared<volt::ProcessGroup>(env);
}

std::map<const c10::TensorImpl*, std::string> names_of(const torch::nn::Module& m) {
  std::map<const c10::TensorImpl*, std::string> out;
  for (const auto& p : m.named_parameters(true)) out[p.value().unsafeGetTensorImpl()] = p.key();
  return out;
}

torch::nn::Sequential mlp() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
}

TEST(ZeroEngine, StageThreeReleasesParametersAndGathersThemWhenAnOpReadsThem) {
  auto group = world_of_one();
  auto ref = mlp(), net = mlp();
  const auto x = torch::randn({5, 6});
  auto ref_loss = ref->forward(x).pow(2).sum();
  ref_loss.backward();

  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  volt::ZeroEngine engine(opt, group,
                          volt::ZeroEngineOptions().stage(3).param_persistence_threshold(0),
                          names_of(*net));
  auto* weight = net[0]->as<torch::nn::Linear>();
  for (const auto& c : engine.chunks()) EXPECT_TRUE(c.partitioned) << c.name;
  // Released: the module keeps the TensorImpl, not the memory.
  EXPECT_EQ(weight->weight.storage().nbytes(), 0u);
  EXPECT_EQ(engine.memory().parameters,
            static_cast<int64_t>(sizeof(float)) * (6 * 8 + 8 + 8 * 3 + 3));

  // Outside a scope a read would need a collective the other ranks do not join: an error.
  try {
    weight->weight.sum();
    FAIL() << "a partitioned parameter was read outside a scope";
  } catch (const volt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("outside a training, validation, test or predict step"),
              std::string::npos)
        << e.what();
  }

  at::Tensor loss;
  {
    volt::ZeroEngine::Scope scope(engine);
    loss = net->forward(x).pow(2).sum();
    EXPECT_GT(weight->weight.storage().nbytes(), 0u);  // gathered for the forward
  }
  EXPECT_EQ(weight->weight.storage().nbytes(), 0u);  // released when the scope closed
  EXPECT_TRUE(torch::equal(loss, ref_loss));
  // The backward regathers what its saved tensors point at.
  engine.backward([&] { loss.backward(); }, /*sync=*/true);
  ASSERT_EQ(engine.chunks().size(), 4u);
  const auto ref_params = ref->parameters();
  for (size_t i = 0; i < 4; ++i) {
    const auto& c = engine.chunks()[i];
    ASSERT_TRUE(c.view.grad().defined()) << c.name;
    EXPECT_TRUE(torch::allclose(c.view.grad(), ref_params[i].grad().reshape({-1}), 1e-6, 1e-7))
        << c.name;
  }

  // In-place writes to a partitioned parameter would be lost: refused inside scopes too.
  {
    volt::ZeroEngine::Scope scope(engine);
    torch::NoGradGuard no_grad;
    EXPECT_THROW(weight->weight.add_(1.0), volt::ValueError);
  }

  // A step updates the chunks; restoring gives the module whole, updated parameters.
  opt.step();
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
  ref_opt.step();
  engine.restore_parameters();
  EXPECT_GT(weight->weight.storage().nbytes(), 0u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(torch::allclose(net->parameters()[i], ref_params[i], 1e-6, 1e-7)) << i;
  }
  torch::NoGradGuard no_grad;
  EXPECT_NO_THROW(weight->weight.add_(0.0));  // an ordinary parameter again
}

TEST(ZeroEngine, ALiveBoundReleasesTheLeastRecentlyGatheredModule) {
  auto group = world_of_one();
  auto net = mlp();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  // 8 live elements: the second Linear (27 elements) cannot stay next to the first (56).
  volt::ZeroEngine engine(
      opt, group,
      volt::ZeroEngineOptions().stage(3).param_persistence_threshold(0).max_live_parameters(8),
      names_of(*net));
  auto* first = net[0]->as<torch::nn::Linear>();
  auto* second = net[2]->as<torch::nn::Linear>();
  volt::ZeroEngine::Scope scope(engine);
  const auto x = torch::randn({2, 6});
  const auto y = net->forward(x);
  EXPECT_EQ(first->weight.storage().nbytes(), 0u);   // evicted for the second layer
  EXPECT_GT(second->weight.storage().nbytes(), 0u);  // the last one gathered stays
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 3}));
}

TEST(ZeroEngine, SmallParametersStayWholeBelowThePersistenceThreshold) {
  auto group = world_of_one();
  auto net = mlp();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  volt::ZeroEngine engine(opt, group,
                          volt::ZeroEngineOptions().stage(3).param_persistence_threshold(10),
                          names_of(*net));
  for (const auto& c : engine.chunks()) EXPECT_EQ(c.partitioned, c.numel > 10) << c.name;
  EXPECT_GT(net[0]->as<torch::nn::Linear>()->bias.storage().nbytes(), 0u);  // 8 elements
  EXPECT_NO_THROW(net[0]->as<torch::nn::Linear>()->bias.sum());
}

TEST(ZeroEngine, BadOptionsAndASteppedOptimizerAreConfigErrors) {
  auto group = world_of_one();
  auto net = mlp();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THROW(volt::ZeroEngine(opt, group, volt::ZeroEngineOptions().stage(4), names_of(*net)),
               volt::ConfigError);
  EXPECT_THROW(
      volt::ZeroEngine(opt, group, volt::ZeroEngineOptions().reduce_bucket_size(0), names_of(*net)),
      volt::ConfigError);
  EXPECT_THROW(volt::ZeroEngine(opt, group, volt::ZeroEngineOptions(), {}), volt::ConfigError);
}

}  // namespace
