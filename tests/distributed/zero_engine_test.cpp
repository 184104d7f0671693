// ZeroEngine in one process (a group of one): the partitioned optimizer steps like the
// unpartitioned one, stage 3 releases parameters and gathers them when an op reads them inside
// a scope (forward and backward give the unpartitioned results), refuses reads outside scopes
// and in-place writes, and restores whole parameters. Several ranks: tests/strategies/
// deepspeed_test.cpp.
#include "volt/distributed/zero_engine.h"
#include "requires.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/core/impl/alloc_cpu.h>

#include <sys/resource.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <limits>

#include "build_paths.h"
#include "core/detail/state_key.h"
#include "distributed/detail/net.h"
#include "processes.h"
#include "strategies/detail/optimizer_swapper.h"
#include "tiny.h"
#include "volt/core/errors.h"
#include "volt/core/version.h"
#include "zero_testing.h"

namespace {

using volt::detail::AioOptions;
using volt::detail::OptimizerSwapper;
using volt_test::engine_step;
using volt_test::names_of;

std::shared_ptr<volt::ProcessGroup> world_of_one() {
  volt::ClusterEnvironment env;
  env.main_port = volt::detail::find_free_port();
  return std::make_shared<volt::ProcessGroup>(env);
}

torch::nn::Sequential mlp() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
}

TEST(ZeroEngine, StageThreeReleasesParametersAndGathersThemWhenAnOpReadsThem) {
  VOLT_REQUIRE_GLOO();
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
  VOLT_REQUIRE_GLOO();
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
  VOLT_REQUIRE_GLOO();
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

// A CPU allocator that counts what it hands out, standing in for an allocator that is not the
// process default (CUDA's caching allocator, a pinned one): stage 3 must give a parameter's
// storage its memory back from the allocator that made it.
class CountingAllocator final : public c10::Allocator {
 public:
#if VOLT_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t n) override {
#else
  c10::DataPtr allocate(size_t n) const override {
#endif
    ++allocations;
    void* p = c10::alloc_cpu(n);
    return {p, p, &c10::free_cpu, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &c10::free_cpu;
  }
#if VOLT_TORCH_AT_LEAST(2, 3)
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
  mutable int64_t allocations = 0;
};

TEST(ZeroEngine, StageThreeGathersIntoMemoryFromTheAllocatorThatMadeTheParameter) {
  VOLT_REQUIRE_GLOO();
  auto group = world_of_one();
  auto ref = mlp(), net = mlp();
  static CountingAllocator counting;  // outlives every tensor it allocates
  {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) {
      c10::Storage storage(c10::Storage::use_byte_size_t(), p.nbytes(), &counting,
                           /*resizable=*/false);
      at::Tensor moved = at::empty({0}, p.options()).set_(storage, 0, p.sizes(), p.strides());
      moved.copy_(p);
      p.set_data(moved);
    }
  }
  const int64_t made = counting.allocations;
  ASSERT_EQ(made, 4);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  volt::ZeroEngine engine(opt, group,
                          volt::ZeroEngineOptions().stage(3).param_persistence_threshold(0),
                          names_of(*net));
  auto* weight = net[0]->as<torch::nn::Linear>();
  ASSERT_EQ(weight->weight.storage().nbytes(), 0u);
  const auto x = torch::randn({5, 6});
  at::Tensor loss;
  {
    volt::ZeroEngine::Scope scope(engine);
    loss = net->forward(x).pow(2).sum();
    // Both Linears gathered, each storage from the counting allocator again.
    EXPECT_EQ(counting.allocations, made + 4);
    for (const auto& p : net->parameters()) {
      EXPECT_EQ(p.storage().allocator(), &counting);
      EXPECT_EQ(p.storage().data_ptr().get_deleter(), &c10::free_cpu);
    }
  }
  EXPECT_TRUE(torch::equal(loss, ref->forward(x).pow(2).sum()));
  engine.restore_parameters();
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(torch::equal(net->parameters()[i], ref->parameters()[i])) << i;
  }
}

TEST(ZeroEngine, TwoRanksWriteMasterWeightsIntoBf16ParametersWhenARankOwnsNoneOfABucket) {
  VOLT_REQUIRE_GLOO();
  // tests/support/dist_worker.cpp, run_zero_masters: before the fix, the rank without an
  // element of the last bucket sent bf16 while the other sent fp32.
  auto ranks =
      volt_test::start_local_ranks(volt_test::dist_worker(), {"zero-masters", "--devices", "2"}, 2);
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r]->exit_code(std::chrono::milliseconds(120000)), 0) << ranks[r]->output();
    EXPECT_NE(ranks[r]->output().find("rank " + std::to_string(r) + ": zero masters ok"),
              std::string::npos)
        << ranks[r]->output();
  }
}

TEST(ZeroEngine, SeveralBackwardsInOneWindowReduceTheirSumAtEveryStage) {
  VOLT_REQUIRE_GLOO();
  // tests/support/dist_worker.cpp, run_zero_resync.
  auto ranks =
      volt_test::start_local_ranks(volt_test::dist_worker(), {"zero-resync", "--devices", "2"}, 2);
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r]->exit_code(std::chrono::milliseconds(120000)), 0) << ranks[r]->output();
    EXPECT_NE(ranks[r]->output().find("rank " + std::to_string(r) + ": zero resync ok"),
              std::string::npos)
        << ranks[r]->output();
  }
}

TEST(ZeroEngine, MasterWeightsStepBf16ParametersLikeAHandWrittenFp32MasterLoop) {
  VOLT_REQUIRE_GLOO();
  // DeepSpeed's BF16Optimizer by hand: bf16 model, fp32 copies of its weights stepped by Adam
  // with the bf16 gradients made fp32, then rounded into the model. The engine must give the
  // same bits in every stage (a group of one: the reduction changes nothing).
  auto group = world_of_one();
  for (int stage : {1, 2, 3}) {
    auto ref = mlp(), net = mlp();
    ref->to(torch::kBFloat16);
    net->to(torch::kBFloat16);
    const auto ref_params = ref->parameters();
    std::vector<at::Tensor> masters;
    int64_t numel = 0;
    for (const auto& p : ref_params) {
      masters.push_back(p.detach().to(torch::kFloat).clone());
      numel += p.numel();
    }
    torch::optim::Adam ref_opt(masters, torch::optim::AdamOptions(1e-2));
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-2));
    volt::ZeroEngine engine(opt, group,
                            volt::ZeroEngineOptions().stage(stage).param_persistence_threshold(0),
                            names_of(*net));
    ASSERT_TRUE(engine.has_master_weights());
    EXPECT_EQ(engine.memory().master_weights, 4 * numel);
    for (const auto& c : engine.chunks()) {
      EXPECT_EQ(c.master.scalar_type(), torch::kFloat);
      EXPECT_TRUE(c.stepped().is_same(c.master));
    }
    torch::manual_seed(11);
    for (int step = 0; step < 4; ++step) {
      const auto x = torch::randn({5, 6}).to(torch::kBFloat16);
      for (auto& p : ref_params) p.mutable_grad().reset();
      ref->forward(x).to(torch::kFloat).pow(2).sum().backward();
      for (size_t i = 0; i < masters.size(); ++i) {
        masters[i].mutable_grad() = ref_params[i].grad().to(torch::kFloat);
      }
      ref_opt.step();
      {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < masters.size(); ++i) ref_params[i].copy_(masters[i]);
      }
      engine_step(
          engine, opt, [&](const at::Tensor& in) { return net->forward(in); }, x);
    }
    // The fp32 gradients of the masters live only from prepare_step to the step.
    for (const auto& c : engine.chunks()) EXPECT_FALSE(c.master.grad().defined()) << c.name;
    for (size_t i = 0; i < masters.size(); ++i) {
      EXPECT_TRUE(torch::equal(engine.chunks()[i].master, masters[i].reshape({-1})))
          << "stage " << stage << " master " << i;
    }
    engine.restore_parameters();
    const auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].scalar_type(), torch::kBFloat16);
      EXPECT_TRUE(torch::equal(params[i], ref_params[i])) << "stage " << stage << " param " << i;
    }
    // At the end of a bf16-mixed run the module (cast back to fp32) gets the masters.
    net->to(torch::kFloat);
    engine.write_master_weights();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::equal(net->parameters()[i], masters[i])) << "stage " << stage;
    }
  }
}

TEST(ZeroEngine, AnOffloadedOptimizerStepsHostCopiesAndGivesTheSameBits) {
  VOLT_REQUIRE_GLOO();
  // ZeRO-Offload: the optimizer steps copies of the chunks kept in host memory and the engine
  // copies the results back. Here the parameters are in host memory already, so what this
  // checks is the bookkeeping: the optimizer holds the copies (its state is keyed on them),
  // gradients reach them, clipping scales them, and every stage gives the bits of the engine
  // without offload, in fp32 (plain copies) and bf16 (fp32 masters either way).
  auto group = world_of_one();
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (int stage : {1, 2, 3}) {
      auto plain = mlp(), offloaded = mlp();
      plain->to(dtype);
      offloaded->to(dtype);
      torch::optim::AdamW plain_opt(plain->parameters(), torch::optim::AdamWOptions(1e-2));
      torch::optim::AdamW off_opt(offloaded->parameters(), torch::optim::AdamWOptions(1e-2));
      const auto options = volt::ZeroEngineOptions().stage(stage).param_persistence_threshold(0);
      volt::ZeroEngine plain_engine(plain_opt, group, options, names_of(*plain));
      volt::ZeroEngine off_engine(off_opt, group,
                                  volt::ZeroEngineOptions(options).offload_optimizer(true),
                                  names_of(*offloaded));
      const std::string where =
          std::string(c10::toString(dtype)) + " stage " + std::to_string(stage);
      ASSERT_TRUE(off_engine.has_master_weights()) << where;
      int64_t numel = 0;
      for (const auto& c : off_engine.chunks()) {
        ASSERT_TRUE(c.master.defined()) << where;
        EXPECT_TRUE(c.master.device().is_cpu());
        EXPECT_EQ(c.master.scalar_type(), torch::kFloat) << where;  // fp32 for bf16 too
        EXPECT_NE(c.master.storage().data(), c.view.storage().data()) << where;
        EXPECT_TRUE(c.stepped().is_same(c.master));
        numel += c.length;
      }
      EXPECT_EQ(off_engine.memory().master_weights, 4 * numel) << where;
      torch::manual_seed(5);
      for (int step = 0; step < 3; ++step) {
        const auto x = torch::randn({5, 6}).to(dtype);
        for (auto* e : {&plain_engine, &off_engine}) {
          auto& net = e == &plain_engine ? plain : offloaded;
          volt_test::engine_step(
              *e, e == &plain_engine ? plain_opt : off_opt,
              [&](const at::Tensor& in) { return net->forward(in); }, x,
              [&] { e->clip_grad_norm(0.5, 2.0); });  // small enough to scale every step
        }
      }
      // The optimizer's state belongs to the host copies.
      for (const auto& c : off_engine.chunks()) {
        EXPECT_EQ(off_opt.state().count(volt::detail::state_key_for(c.master)), 1u) << where;
      }
      plain_engine.restore_parameters();
      off_engine.restore_parameters();
      const auto a = plain->parameters(), b = offloaded->parameters();
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(torch::equal(a[i], b[i])) << where << " param " << i;
      }
    }
  }
}

TEST(ZeroEngine, ANonFiniteNormClipsAsTorchsClipGradNorm) {
  VOLT_REQUIRE_GLOO();
  // torch's clip_grad_norm_ clamps the coefficient, so a NaN norm makes every gradient NaN and
  // an infinite one scales them by 0. ZeRO's clip (like the tensor-parallel and pipeline ones)
  // skipped a NaN coefficient: the gradients stayed unclipped, unlike one process's.
  auto group = world_of_one();
  auto net = mlp();
  torch::optim::SGD opt(net->parameters(), 0.1);
  volt::ZeroEngine engine(opt, group, volt::ZeroEngineOptions().stage(2), names_of(*net));
  // The infinity norm too: its NaN was dropped by std::max (the gradients stayed unclipped).
  for (double norm_type : {2.0, std::numeric_limits<double>::infinity()})
    for (double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
      SCOPED_TRACE("norm_type " + std::to_string(norm_type));
      std::vector<at::Tensor> grads, reference;
      for (const auto& c : engine.chunks()) {
        if (c.length == 0) continue;
        at::Tensor g = torch::full_like(c.stepped(), 0.5);
        if (grads.empty()) g.view(-1)[0] = bad;
        c.stepped().mutable_grad() = g;
        grads.push_back(g);
        reference.push_back(torch::zeros_like(g).requires_grad_());
        reference.back().mutable_grad() = g.clone();
      }
      ASSERT_FALSE(grads.empty());
      engine.clip_grad_norm(1.0, norm_type);
      torch::nn::utils::clip_grad_norm_(reference, 1.0, norm_type);
      for (size_t i = 0; i < grads.size(); ++i) {
        EXPECT_TRUE(torch::allclose(grads[i], reference[i].grad(), 0, 0, /*equal_nan=*/true))
            << bad << " chunk " << i << ": " << grads[i] << " vs " << reference[i].grad();
      }
      if (std::isnan(bad)) {
        for (const auto& g : grads) EXPECT_TRUE(g.isnan().all().item<bool>()) << g;
      }
    }
}

TEST(ZeroEngine, MasterWeightsKeepTheUpdatesThatBf16WeightsRoundAway) {
  VOLT_REQUIRE_GLOO();
  // Adam at lr 1e-4 moves each weight by about 1e-4 per step, far below bf16's spacing near
  // 0.3 (2e-3): stepped directly, most bf16 weights never move; the fp32 masters accumulate
  // the updates and stay close to fp32 training.
  auto group = world_of_one();
  auto fp32 = mlp(), with = mlp(), without = mlp();
  with->to(torch::kBFloat16);
  without->to(torch::kBFloat16);
  const auto start = torch::cat({without->parameters()[0].reshape({-1})}).clone();
  torch::optim::Adam fp32_opt(fp32->parameters(), torch::optim::AdamOptions(1e-4));
  torch::optim::Adam with_opt(with->parameters(), torch::optim::AdamOptions(1e-4));
  torch::optim::Adam without_opt(without->parameters(), torch::optim::AdamOptions(1e-4));
  volt::ZeroEngine with_engine(with_opt, group, volt::ZeroEngineOptions().stage(2),
                               names_of(*with));
  volt::ZeroEngine without_engine(without_opt, group,
                                  volt::ZeroEngineOptions().stage(2).master_weights(false),
                                  names_of(*without));
  EXPECT_FALSE(without_engine.has_master_weights());
  EXPECT_EQ(without_engine.memory().master_weights, 0);
  torch::manual_seed(5);
  for (int step = 0; step < 100; ++step) {
    const auto x = torch::randn({8, 6});
    fp32_opt.zero_grad();
    fp32->forward(x).pow(2).sum().backward();
    fp32_opt.step();
    engine_step(
        with_engine, with_opt, [&](const at::Tensor& in) { return with->forward(in); },
        x.to(torch::kBFloat16));
    engine_step(
        without_engine, without_opt, [&](const at::Tensor& in) { return without->forward(in); },
        x.to(torch::kBFloat16));
  }
  auto flat = [](torch::nn::Sequential& m) {
    std::vector<at::Tensor> v;
    for (const auto& p : m->parameters()) v.push_back(p.detach().to(torch::kFloat).reshape({-1}));
    return torch::cat(v);
  };
  const at::Tensor ref = flat(fp32);
  const double err_with = (flat(with) - ref).abs().mean().item<double>();
  const double err_without = (flat(without) - ref).abs().mean().item<double>();
  const double unmoved =
      (without->parameters()[0].reshape({-1}) == start).to(torch::kFloat).mean().item<double>();
  std::printf(
      "[ measured ] mean |w - fp32| after 100 Adam steps at lr 1e-4: master weights "
      "%.2e, bf16 stepped directly %.2e (%.0f%% of its first layer never moved)\n",
      err_with, err_without, 100 * unmoved);
  EXPECT_LT(err_with * 4, err_without);
  EXPECT_GT(unmoved, 0.5);
}

// ZeRO-Inference: without an optimizer, stage 3 partitions every weight (a frozen one too),
// gathers a module's weights while an op reads them inside a scope, reduces nothing, and gives
// the module back whole and unchanged.
TEST(ZeroEngine, WithoutAnOptimizerStageThreePartitionsTheWeightsForInference) {
  VOLT_REQUIRE_GLOO();
  auto group = world_of_one();
  auto ref = mlp(), net = mlp();
  auto* first = net[0]->as<torch::nn::Linear>();
  first->bias.set_requires_grad(false);  // frozen: partitioned all the same
  const auto x = torch::randn({5, 6});
  const auto want = ref->forward(x);
  volt::ZeroEngine engine(net->parameters(), group,
                          volt::ZeroEngineOptions().stage(3).param_persistence_threshold(0),
                          names_of(*net));
  EXPECT_FALSE(engine.trains());
  ASSERT_EQ(engine.chunks().size(), 4u);
  for (const auto& c : engine.chunks()) EXPECT_TRUE(c.partitioned) << c.name;
  EXPECT_EQ(first->weight.storage().nbytes(), 0u);
  EXPECT_EQ(first->bias.storage().nbytes(), 0u);
  const volt::ZeroMemory m = engine.memory();
  EXPECT_EQ(m.parameters, static_cast<int64_t>(sizeof(float)) * (6 * 8 + 8 + 8 * 3 + 3));
  EXPECT_EQ(m.gradients, 0);
  EXPECT_EQ(m.optimizer_state, 0);
  EXPECT_EQ(m.master_weights, 0);
  {
    volt::ZeroEngine::Scope scope(engine);
    c10::InferenceMode inference;
    EXPECT_TRUE(torch::equal(net->forward(x), want));
  }
  EXPECT_EQ(first->weight.storage().nbytes(), 0u);  // released again
  // Nothing to reduce: a backward through it is a misuse, named.
  try {
    engine.backward([] {}, /*sync=*/true);
    FAIL() << "an inference engine ran a backward";
  } catch (const volt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("without an optimizer"), std::string::npos) << e.what();
  }
  engine.restore_parameters();
  const auto ref_params = ref->parameters(), params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], ref_params[i]));
  EXPECT_FALSE(first->bias.requires_grad());
}

TEST(ZeroEngine, InferenceWithoutStageThreeIsAConfigError) {
  VOLT_REQUIRE_GLOO();
  auto group = world_of_one();
  auto net = mlp();
  for (int64_t stage : {1, 2}) {
    try {
      volt::ZeroEngine engine(net->parameters(), group, volt::ZeroEngineOptions().stage(stage),
                              names_of(*net));
      FAIL() << "stage " << stage << " without an optimizer was accepted";
    } catch (const volt::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("needs stage 3"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(volt::ZeroEngine(std::vector<at::Tensor>{}, group,
                                volt::ZeroEngineOptions().stage(3), names_of(*net)),
               volt::ConfigError);
}

TEST(ZeroEngine, BadOptionsAndASteppedOptimizerAreConfigErrors) {
  VOLT_REQUIRE_GLOO();
  auto group = world_of_one();
  auto net = mlp();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THROW(volt::ZeroEngine(opt, group, volt::ZeroEngineOptions().stage(4), names_of(*net)),
               volt::ConfigError);
  EXPECT_THROW(
      volt::ZeroEngine(opt, group, volt::ZeroEngineOptions().reduce_bucket_size(0), names_of(*net)),
      volt::ConfigError);
  EXPECT_THROW(volt::ZeroEngine(opt, group, volt::ZeroEngineOptions(), {}), volt::ConfigError);
  EXPECT_THROW(volt::ZeroEngine(opt, group, volt::ZeroEngineOptions().prefetch_bucket_size(-1),
                                names_of(*net)),
               volt::ConfigError);
}

// Four square layers (each its own gather unit in stage 3).
torch::nn::Sequential square_mlp() {
  torch::manual_seed(5);
  torch::nn::Sequential s;
  for (int i = 0; i < 4; ++i) s->push_back(torch::nn::Linear(6, 6));
  return s;
}

TEST(ZeroEngine, Stage3PrefetchFollowsTheLearnedOrderAndAMispredictionOnlyCostsTime) {
  VOLT_REQUIRE_GLOO();
  // Stage 3 learns the order modules are read in (per direction: forward and backward read
  // them in opposite orders) and, from the second step on, starts gathering the next modules
  // when one is read. Results are those of the unpartitioned model whatever is read: a forward
  // that leaves after two layers (an early exit, mispredicted) drops the prefetches it did not
  // read when its scope closes.
  auto group = world_of_one();
  auto ref = square_mlp(), net = square_mlp();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
  volt::ZeroEngine engine(opt, group,
                          volt::ZeroEngineOptions().stage(3).param_persistence_threshold(0),
                          names_of(*net));
  const auto x = torch::randn({3, 6});
  auto forward = [&](torch::nn::Sequential& m, const std::vector<int>& order) {
    at::Tensor h = x;
    for (int i : order) h = torch::tanh(m[i]->as<torch::nn::Linear>()->forward(h));
    return h.pow(2).sum();
  };
  const std::vector<int> in_order{0, 1, 2, 3}, early_exit{0, 1};
  int64_t per_step = 0;
  for (int step = 0; step < 3; ++step) {
    const auto& order = step == 2 ? early_exit : in_order;
    const auto before = engine.comm_stats();
    engine.zero_grad();
    ref_opt.zero_grad();
    at::Tensor loss;
    {
      volt::ZeroEngine::Scope scope(engine);
      loss = forward(net, order);
    }
    engine.backward([&] { loss.backward(); }, /*sync=*/true);
    opt.step();
    engine.gather_parameters();
    auto ref_loss = forward(ref, order);
    ref_loss.backward();
    ref_opt.step();
    EXPECT_TRUE(torch::equal(loss, ref_loss)) << "step " << step;
    const auto& after = engine.comm_stats();
    const int64_t prefetched = after.prefetched - before.prefetched;
    // Forward reads the 4 units; backward those whose weights it needs (not the first layer's:
    // x needs no gradient).
    const int64_t gathers = after.gathers - before.gathers;
    if (step == 0) {
      per_step = gathers;
      EXPECT_GE(gathers, 7);
      EXPECT_EQ(prefetched, 0) << "nothing is known before the first step";
    } else if (step == 1) {
      EXPECT_EQ(gathers, per_step);
      // Every read but the first of each direction was predicted and gathered ahead.
      EXPECT_EQ(prefetched, gathers - 2);
      EXPECT_EQ(after.prefetch_discarded, before.prefetch_discarded);
    } else {
      EXPECT_GT(after.prefetch_discarded, before.prefetch_discarded) << "a misprediction";
    }
  }
  engine.restore_parameters();
  for (size_t i = 0; i < ref->parameters().size(); ++i) {
    EXPECT_TRUE(torch::allclose(net->parameters()[i], ref->parameters()[i], 1e-6, 1e-7)) << i;
  }
  // Off: no prefetch at all.
  auto off_net = square_mlp();
  torch::optim::SGD off_opt(off_net->parameters(), torch::optim::SGDOptions(0.1));
  volt::ZeroEngine off(
      off_opt, group,
      volt::ZeroEngineOptions().stage(3).param_persistence_threshold(0).prefetch_bucket_size(0),
      names_of(*off_net));
  for (int step = 0; step < 2; ++step) {
    at::Tensor loss;
    {
      volt::ZeroEngine::Scope scope(off);
      loss = forward(off_net, in_order);
    }
    off.backward([&] { loss.backward(); }, /*sync=*/true);
  }
  EXPECT_EQ(off.comm_stats().prefetched, 0);
  EXPECT_EQ(off.comm_stats().gathers, 2 * per_step);
}

// Two stage-3 engines (a group of one) over the same square MLP and Adam: one keeps this rank's
// chunks in memory, the other in the swap file `file`.
struct InMemoryAndSwapped {
  explicit InMemoryAndSwapped(const std::string& file)
      : in_memory(mem_opt, group, base(), names_of(*mem_net)),
        swapped(file_opt, group, base().param_swap_file(file), names_of(*file_net)) {}
  static volt::ZeroEngineOptions base() {
    return volt::ZeroEngineOptions().stage(3).param_persistence_threshold(0);
  }
  std::shared_ptr<volt::ProcessGroup> group = world_of_one();
  torch::nn::Sequential mem_net = square_mlp(), file_net = square_mlp();
  torch::optim::Adam mem_opt{mem_net->parameters(), torch::optim::AdamOptions(0.01)};
  torch::optim::Adam file_opt{file_net->parameters(), torch::optim::AdamOptions(0.01)};
  volt::ZeroEngine in_memory;
  volt::ZeroEngine swapped;
};

TEST(ZeroEngine, ParameterChunksInASwapFileStepLikeChunksInMemory) {
  VOLT_REQUIRE_GLOO();
  // param_swap_file (ZeRO-Infinity's offload_param to NVMe): between steps this rank's chunks
  // are in the file, not in memory; gathers read them from it, the step reads them in and
  // writes them back. Bitwise the same training as the chunks in memory (Adam, 3 steps).
  volt_test::TempDir dir;
  const std::string file = dir / "params.swp";
  InMemoryAndSwapped pair(file);
  auto &mem_net = pair.mem_net, &file_net = pair.file_net;
  auto &mem_opt = pair.mem_opt, &file_opt = pair.file_opt;
  auto &in_memory = pair.in_memory, &swapped = pair.swapped;
  const int64_t bytes = 4 * 4 * (6 * 6 + 6);
  EXPECT_FALSE(swapped.parameters_resident());
  EXPECT_EQ(swapped.memory().parameters, 0);
  EXPECT_EQ(swapped.memory().parameters_in_files, bytes);
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(file)), bytes);
  EXPECT_EQ(in_memory.memory().parameters, bytes);
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({4, 6});
    engine_step(
        in_memory, mem_opt, [&](const at::Tensor& t) { return mem_net->forward(t); }, x);
    engine_step(
        swapped, file_opt, [&](const at::Tensor& t) { return file_net->forward(t); }, x);
    EXPECT_FALSE(swapped.parameters_resident()) << "written back after the step";
    EXPECT_EQ(swapped.memory().parameters, 0);
    for (size_t i = 0; i < in_memory.chunks().size(); ++i) {
      volt::ZeroEngine::Resident resident(swapped);
      EXPECT_TRUE(swapped.parameters_resident());
      EXPECT_TRUE(torch::equal(in_memory.chunks()[i].view, swapped.chunks()[i].view))
          << "step " << step << " chunk " << i;
    }
  }
  // From the second step on, prefetches read their chunks from the file asynchronously; the
  // engines make the same prefetch decisions either way.
  EXPECT_GT(swapped.comm_stats().prefetch_reads, 0);
  EXPECT_EQ(in_memory.comm_stats().prefetch_reads, 0);
  EXPECT_EQ(swapped.comm_stats().prefetched, in_memory.comm_stats().prefetched);
  EXPECT_GT(swapped.comm_stats().prefetched, 0);
  swapped.restore_parameters();
  in_memory.restore_parameters();
  EXPECT_FALSE(std::filesystem::exists(file)) << "the swap file outlived the partitioning";
  for (size_t i = 0; i < mem_net->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(mem_net->parameters()[i], file_net->parameters()[i])) << i;
  }
}

// The swap file's first write fails (the file size limit stands in for a full disk): the
// engine's constructor throws before it released anything or registered the parameters, so
// they keep their values and every op reads them (before, the chunks' only copy had been
// freed with the engine, and the parameters still pointed at it).
TEST(ZeroEngine, AFailedFirstSwapWriteLeavesTheParametersWhole) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  auto group = world_of_one();
  auto net = square_mlp();
  std::vector<at::Tensor> before;
  for (const auto& p : net->parameters()) before.push_back(p.detach().clone());
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(0.01));
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 64;  // bytes; the shard is 672
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  try {
    volt::ZeroEngine engine(
        opt, group,
        volt::ZeroEngineOptions().stage(3).param_persistence_threshold(0).param_swap_file(
            dir / "params.swp"),
        names_of(*net));
  } catch (const volt::Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find("params.swp"), std::string::npos) << e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_TRUE(threw);
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(net->parameters()[i], before[i])) << i;
  }
  EXPECT_NO_THROW(net->forward(torch::randn({2, 6})));
  // And a new engine partitions them as if the failed one never was.
  volt::ZeroEngine again(opt, group, InMemoryAndSwapped::base(), names_of(*net));
  again.restore_parameters();
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(torch::equal(net->parameters()[i], before[i])) << i;
  }
}

// A layer used inside volt::checkpoint and again outside it: the recomputation backpropagates
// the checkpointed use apart, so its parameters get a second gradient after their bucket was
// reduced. Each stage says so, naming them (before, that gradient was silently lost).
// ignore_unused_parameters=false refuses a parameter without a gradient in the whole accumulation
// window, checked at its synced backward: one another micro-batch used has one (stage 2 refused
// it whenever a micro-batch skipped it; stage 1 looked at the synced backward alone).
TEST(ZeroEngine, AParameterUsedEarlierInTheWindowIsNotUnused) {
  VOLT_REQUIRE_GLOO();
  auto group = world_of_one();
  for (int64_t stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    torch::manual_seed(1);
    auto net = mlp();
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    volt::ZeroEngine engine(opt, group,
                            volt::ZeroEngineOptions().stage(stage).ignore_unused_parameters(false),
                            names_of(*net));
    const auto x = torch::randn({4, 6});
    const auto first_layer = [&] { return net[0]->as<torch::nn::Linear>()->forward(x).sum(); };
    engine.zero_grad();
    at::Tensor whole = net->forward(x).pow(2).sum();
    engine.backward([&] { whole.backward(); }, /*sync=*/false);
    at::Tensor part = first_layer();
    EXPECT_NO_THROW(engine.backward([&] { part.backward(); }, /*sync=*/true));
    // Used only by a later micro-batch of the window: not unused either.
    engine.zero_grad();
    at::Tensor early = first_layer();
    EXPECT_NO_THROW(engine.backward([&] { early.backward(); }, /*sync=*/false));
    at::Tensor late = net->forward(x).pow(2).sum();
    EXPECT_NO_THROW(engine.backward([&] { late.backward(); }, /*sync=*/true));
    // A new window in which the later layers get nothing: refused.
    engine.zero_grad();
    at::Tensor only = first_layer();
    std::string error = "no error";
    try {
      engine.backward([&] { only.backward(); }, /*sync=*/true);
    } catch (const volt::ValueError& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("got no gradient in this backward nor earlier in its accumulation window"),
              std::string::npos)
        << error;
  }
}

TEST(ZeroEngine, ASecondGradientAfterItsBucketWasReducedIsAValueError) {
  VOLT_REQUIRE_GLOO();
  auto group = world_of_one();
  for (int64_t stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    torch::manual_seed(1);
    torch::nn::Linear lin(6, 6);
    torch::optim::SGD opt(lin->parameters(), torch::optim::SGDOptions(0.1));
    volt::ZeroEngine engine(opt, group,
                            volt::ZeroEngineOptions().stage(stage).param_persistence_threshold(0),
                            names_of(*lin));
    const auto x = torch::randn({4, 6});
    at::Tensor loss;
    {
      volt::ZeroEngine::Scope scope(engine);
      const auto h =
          volt::checkpoint([&](const at::Tensor& t) { return torch::relu(lin->forward(t)); }, x);
      loss = lin->forward(h).sum();
    }
    std::string error = "no error";
    try {
      engine.backward([&] { loss.backward(); }, /*sync=*/true);
    } catch (const volt::ValueError& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("got a second gradient in one backward after its bucket was reduced"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("'weight'"), std::string::npos) << error;
    engine.restore_parameters();
  }
}

TEST(ZeroEngine, SwappedChunksStepSubGroupBySubGroupAndAFailedStepLeavesNoneHeld) {
  VOLT_REQUIRE_GLOO();
  // With the optimizer state on NVMe too, DeepSpeedStrategy steps sub-group by sub-group and
  // the engine brings each sub-group's parameter chunks in with its state (wired here as the
  // strategy wires them): bitwise the in-memory training, at most two sub-groups' chunks in
  // memory. A step that throws mid-way (the fourth sub-group's) leaves no chunk pointed at a
  // buffer once finish_step_chunks ran: what stepped is in the file, the rest unchanged, as
  // the in-memory engine failing at the same point, and training goes on.
  volt_test::TempDir dir;
  const std::string file = dir / "params.swp";
  InMemoryAndSwapped pair(file);
  auto &mem_net = pair.mem_net, &file_net = pair.file_net;
  auto &mem_opt = pair.mem_opt, &file_opt = pair.file_opt;
  auto &in_memory = pair.in_memory, &swapped = pair.swapped;
  // Sub-groups of at most 40 elements: each 6x6 weight (36) and each bias (6) alone.
  OptimizerSwapper mem_state(mem_opt, dir / "m.swp", AioOptions(), 40);
  OptimizerSwapper file_state(file_opt, dir / "f.swp", AioOptions(), 40);
  auto step = [](volt::ZeroEngine& e, OptimizerSwapper& sw, torch::optim::Optimizer& opt,
                 torch::nn::Module& net, const at::Tensor& x, int fail_at) {
    e.zero_grad();
    at::Tensor loss;
    {
      volt::ZeroEngine::Scope scope(e);
      loss = net.as<torch::nn::Sequential>()->forward(x).pow(2).sum();
    }
    e.backward([&] { loss.backward(); }, /*sync=*/true);
    e.prepare_step(/*by_sub_group=*/true);
    OptimizerSwapper::SubGroupHooks hooks;
    hooks.read = [&](const std::vector<at::Tensor>& g) { e.read_step_chunks(g); };
    hooks.ready = [&](const std::vector<at::Tensor>&) { e.hold_step_chunks(); };
    hooks.after = [&](const std::vector<at::Tensor>& g) { e.write_step_chunks(g); };
    int n = 0;
    try {
      sw.step(
          [&] {
            if (n++ == fail_at) throw volt::ValueError("a failing optimizer step");
            opt.step();
            return true;
          },
          hooks);
    } catch (const volt::ValueError&) {
      e.finish_step_chunks();
      return false;
    }
    e.gather_parameters();
    return true;
  };
  auto expect_equal = [&](const std::string& when) {
    EXPECT_EQ(swapped.memory().parameters, 0) << when << ": a chunk stayed in memory";
    volt::ZeroEngine::Resident resident(swapped);
    for (size_t i = 0; i < in_memory.chunks().size(); ++i) {
      EXPECT_TRUE(torch::equal(in_memory.chunks()[i].view, swapped.chunks()[i].view))
          << when << " chunk " << i;
    }
  };
  for (int s = 0; s < 3; ++s) {
    torch::manual_seed(20 + s);
    const auto x = torch::randn({4, 6});
    const int fail_at = s == 1 ? 3 : -1;
    EXPECT_EQ(step(in_memory, mem_state, mem_opt, *mem_net, x, fail_at), fail_at < 0);
    EXPECT_EQ(step(swapped, file_state, file_opt, *file_net, x, fail_at), fail_at < 0);
    expect_equal("step " + std::to_string(s));
    if (fail_at < 0) {
      EXPECT_EQ(file_state.sub_groups(), 8);
      EXPECT_GT(swapped.comm_stats().step_chunk_peak, 0);
      EXPECT_LE(swapped.comm_stats().step_chunk_peak, 36 + 6) << "two sub-groups at most";
    }
  }
  swapped.restore_parameters();
  in_memory.restore_parameters();
  for (size_t i = 0; i < mem_net->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(mem_net->parameters()[i], file_net->parameters()[i])) << i;
  }
}

}  // namespace
