// NCCL process groups on the one GPU a machine may have (world size 1: NCCL refuses two ranks
// on one device). The collectives through c10d::ProcessGroupNCCL keep each caller's device and
// values; DDP and ZeRO stages 1 to 3 over NCCL train as one device does, and so does
// ZeRO-Offload (the optimizer and its state in pinned host memory, stepped on the CPU). Every
// test skips without a GPU or without NCCL in the build (Debian's CPU libtorch).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <volt/distributed/zero_engine.h>
#include <volt/volt.h>

#include <chrono>
#include <string>
#include <vector>

#include "core/detail/state_key.h"
#include "distributed/detail/net.h"
#include "kernels/detail/state_tensors.h"
#include "requires.h"
#include "tiny.h"
#include "zero_testing.h"

namespace {

using std::chrono::seconds;

volt::ClusterEnvironment world_of_one() {
  volt::ClusterEnvironment env;
  env.main_port = volt::detail::find_free_port();
  return env;
}

void expect_same(const at::Tensor& got, const at::Tensor& want, const c10::Device& device) {
  EXPECT_EQ(got.device(), device);
  EXPECT_EQ(got.scalar_type(), want.scalar_type());
  EXPECT_TRUE(torch::equal(got.cpu(), want.cpu())) << got << want;
}

// No dropout: the runs compared must launch the same kernels on the same values.
class NcclNet : public volt::Module {
 public:
  NcclNet() {
    torch::manual_seed(0);
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 2));
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto loss =
        torch::cross_entropy_loss(fc2->forward(torch::relu(fc1->forward(b.input))), b.target);
    log("train_loss", loss);
    return loss;
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-2))};
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// A registered strategy with some of its parameters set (the others keep their defaults), as
// YAML's init_args give them.
volt::Spec<volt::Strategy> with(const std::string& name,
                                const std::map<std::string, volt::ParamValue>& set) {
  return volt::named<volt::Strategy>(name, set);
}

// Fits NcclNet for `epochs` epochs; with `checkpoints` (a folder) saving last.ckpt there after
// each epoch, and from `resume` when given.
std::vector<at::Tensor> fit(const volt::Spec<volt::Strategy>& strategy,
                            const std::string& precision = "32-true", int64_t epochs = 2,
                            const std::string& checkpoints = "", const std::string& resume = "") {
  NcclNet net;
  auto options = volt::TrainerOptions()
                     .accelerator("cuda")
                     .devices(1)
                     .precision(precision)
                     .strategy(strategy)
                     .max_epochs(epochs)
                     .enable_checkpointing(!checkpoints.empty())
                     .enable_progress_bar(false)
                     .enable_model_summary(false)
                     .num_sanity_val_steps(0)
                     .logger(false);
  if (!checkpoints.empty()) {
    options.default_root_dir(checkpoints);
    options.callbacks({std::make_shared<volt::ModelCheckpoint>(
        volt::ModelCheckpointOptions().dirpath(checkpoints).save_last(true))});
  }
  volt::Trainer trainer(options);
  // In order: a distributed sampler of one rank then yields the same batches.
  auto dl = volt_test::loader(volt_test::blobs(160), 16, /*shuffle=*/false);
  trainer.fit(net, dl, c10::nullopt, resume);
  std::vector<at::Tensor> out;
  for (const auto& p : net.parameters()) out.push_back(p.detach().cpu().clone());
  return out;
}

}  // namespace

TEST(NcclCuda, CollectivesAtWorldSizeOneKeepEachCallersDeviceAndValues) {
  VOLT_REQUIRE_NCCL();
  EXPECT_EQ(volt::resolve_backend("auto", c10::DeviceType::CUDA), volt::Backend::kNccl);
  volt::ProcessGroup pg(
      world_of_one(),
      volt::ProcessGroupOptions().backend(volt::Backend::kNccl).timeout(seconds(60)));
  const c10::Device cuda(c10::kCUDA, 0), cpu(c10::kCPU);
  const at::Tensor x = torch::arange(12, torch::kFloat).reshape({4, 3});
  for (const auto& device : {cuda, cpu}) {
    SCOPED_TRACE(device.str());
    const at::Tensor v = x.to(device);
    expect_same(pg.all_reduce(v, volt::Reduce::kSum), x, device);
    expect_same(pg.all_reduce(v, volt::Reduce::kMean), x, device);
    expect_same(pg.all_reduce(v.to(torch::kBFloat16), volt::Reduce::kMax), x.to(torch::kBFloat16),
                device);
    expect_same(pg.reduce_scatter(v, volt::Reduce::kSum), x, device);
    const auto gathered = pg.all_gather(v);
    ASSERT_EQ(gathered.size(), 1u);
    expect_same(gathered[0], x, device);
    expect_same(pg.all_gather_flat(v.to(torch::kBFloat16)), x.to(torch::kBFloat16), device);
  }
  // One broadcast over tensors on both devices and of two dtypes, one of them a view.
  std::vector<at::Tensor> state{x.to(cuda), x.to(cpu), x.to(cuda).to(torch::kBFloat16),
                                x.to(cuda).t()};
  pg.broadcast_(state, 0);
  expect_same(state[0], x, cuda);
  expect_same(state[1], x, cpu);
  expect_same(state[2], x.to(torch::kBFloat16), cuda);
  expect_same(state[3], x.t(), cuda);
  pg.barrier();
  EXPECT_TRUE(pg.all_of(true));
  EXPECT_FALSE(pg.all_of(false));
  EXPECT_FALSE(pg.any_of(false));
  auto sub = pg.new_group({0}, "solo");
  expect_same(sub->all_reduce(x.to(cuda), volt::Reduce::kSum), x, cuda);
  // Bad input stays a typed error before anything reaches NCCL.
  EXPECT_THROW(pg.all_reduce(torch::ones({3}, torch::kLong).to(cuda), volt::Reduce::kMean),
               volt::ValueError);
}

TEST(NcclCuda, DdpOnOneRankOverNcclEqualsTheSingleDeviceFitBitForBit) {
  VOLT_REQUIRE_NCCL();
  const auto single = fit("auto");
  const auto ddp = fit("ddp");
  ASSERT_EQ(single.size(), ddp.size());
  for (size_t i = 0; i < single.size(); ++i) {
    EXPECT_TRUE(torch::equal(single[i], ddp[i]))
        << "parameter " << i << " max diff " << (single[i] - ddp[i]).abs().max().item<double>();
  }
}

TEST(NcclCuda, ZeroStages1And2OnOneRankOverNcclEqualTheSingleDeviceFit) {
  VOLT_REQUIRE_NCCL();
  const auto single = fit("auto");
  for (const char* strategy : {"deepspeed_stage_1", "deepspeed_stage_2"}) {
    SCOPED_TRACE(strategy);
    const auto zero = fit(strategy);
    ASSERT_EQ(single.size(), zero.size());
    for (size_t i = 0; i < single.size(); ++i) {
      EXPECT_TRUE(torch::allclose(single[i], zero[i], 1e-5, 1e-6))
          << "parameter " << i << " max diff " << (single[i] - zero[i]).abs().max().item<double>();
    }
  }
}

TEST(NcclCuda, ZeroStage3OnOneRankOverNcclEqualsTheSingleDeviceFit) {
  VOLT_REQUIRE_NCCL();
  // Persistence threshold 0: every parameter is partitioned, its CUDA memory released after
  // each use and gathered (all-gathered over NCCL, written with copy_ from memory of the CUDA
  // caching allocator) when an op reads it.
  const auto single = fit("auto");
  const auto zero = fit(with("deepspeed_stage_3", {{"param_persistence_threshold", int64_t{0}}}));
  ASSERT_EQ(single.size(), zero.size());
  for (size_t i = 0; i < single.size(); ++i) {
    EXPECT_TRUE(torch::allclose(single[i], zero[i], 1e-5, 1e-6))
        << "parameter " << i << " max diff " << (single[i] - zero[i]).abs().max().item<double>();
  }
}

TEST(NcclCuda, ZeroOffloadOnOneRankOverNcclEqualsTheSingleDeviceFit) {
  VOLT_REQUIRE_NCCL();
  // ZeRO-Offload with CUDA parameters: Adam steps pinned host copies of the chunks on the CPU;
  // the gradients go to the host and the stepped chunks come back each step. Stages 1 to 3, and
  // the state swapped to files (offload_optimizer_device "nvme").
  const auto single = fit("auto");
  volt_test::TempDir dir;
  const std::vector<std::pair<std::string, std::map<std::string, volt::ParamValue>>> runs{
      {"deepspeed_stage_1", {{"offload_optimizer", true}}},
      {"deepspeed_stage_2_offload", {}},
      {"deepspeed_stage_3",
       {{"offload_optimizer", true}, {"param_persistence_threshold", int64_t{0}}}},
      // The parameter chunks in pinned host memory too, copied to the GPU when gathered.
      {"deepspeed_stage_3_offload", {{"param_persistence_threshold", int64_t{0}}}},
      {"deepspeed_stage_2_offload",
       {{"offload_optimizer_device", std::string("nvme")}, {"nvme_path", dir.path}}}};
  for (const auto& run : runs) {
    SCOPED_TRACE(run.first + (run.second.count("nvme_path") ? " to nvme" : ""));
    const auto zero = fit(with(run.first, run.second));
    ASSERT_EQ(single.size(), zero.size());
    for (size_t i = 0; i < single.size(); ++i) {
      // The CPU's Adam and CUDA's round differently (fused multiply-adds): close, not equal.
      EXPECT_TRUE(torch::allclose(single[i], zero[i], 1e-5, 1e-6))
          << "parameter " << i << " max diff " << (single[i] - zero[i]).abs().max().item<double>();
    }
  }
}

TEST(NcclCuda, ZeroOffloadWithBf16MixedEqualsZeroWithMastersOnTheDevice) {
  VOLT_REQUIRE_NCCL();
  // bf16-mixed with ZeRO: bf16 parameters, fp32 masters. Offloaded, the masters are pinned host
  // memory stepped on the CPU; the weights written back at the end must be those of the masters
  // stepped on the GPU.
  for (int64_t stage : {int64_t{2}, int64_t{3}}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::map<std::string, volt::ParamValue> base{{"stage", stage},
                                                       {"param_persistence_threshold", int64_t{0}}};
    auto offloaded = base;
    offloaded["offload_optimizer"] = true;
    const auto on_device = fit(with("deepspeed", base), "bf16-mixed");
    const auto on_host = fit(with("deepspeed", offloaded), "bf16-mixed");
    const auto fp32 = fit("auto");
    ASSERT_EQ(on_device.size(), on_host.size());
    double vs_fp32 = 0.0;
    for (size_t i = 0; i < on_device.size(); ++i) {
      EXPECT_EQ(on_host[i].scalar_type(), torch::kFloat);  // cast back at the end
      EXPECT_TRUE(torch::allclose(on_device[i], on_host[i], 1e-5, 1e-6))
          << "parameter " << i << " max diff "
          << (on_device[i] - on_host[i]).abs().max().item<double>();
      vs_fp32 = std::max(vs_fp32, (on_host[i] - fp32[i]).abs().max().item<double>());
    }
    EXPECT_GT(vs_fp32, 1e-5) << "bf16-mixed must really differ from fp32";
  }
}

TEST(NcclCuda, AnOffloadedEngineKeepsPinnedHostMastersAndStateAndStepsLikeTheDevice) {
  VOLT_REQUIRE_NCCL();
  // The engine alone, CUDA parameters, a NCCL group of one: with offload_optimizer the masters
  // (fp32 for bf16), their gradients and AdamW's state are pinned host memory, clipping scales
  // them, and every stage's masters match those stepped on the GPU without offload.
  auto group = std::make_shared<volt::ProcessGroup>(
      world_of_one(),
      volt::ProcessGroupOptions().backend(volt::Backend::kNccl).timeout(seconds(60)));
  const c10::Device cuda(c10::kCUDA, 0);
  auto make = [&](torch::Dtype dtype) {
    torch::manual_seed(3);
    torch::nn::Sequential net(torch::nn::Linear(6, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 3));
    net->to(cuda, dtype);
    return net;
  };
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (int stage : {1, 2, 3}) {
      const std::string where =
          std::string(c10::toString(dtype)) + " stage " + std::to_string(stage);
      SCOPED_TRACE(where);
      auto plain = make(dtype), offloaded = make(dtype);
      torch::optim::AdamW plain_opt(plain->parameters(), torch::optim::AdamWOptions(1e-2));
      torch::optim::AdamW off_opt(offloaded->parameters(), torch::optim::AdamWOptions(1e-2));
      const auto options = volt::ZeroEngineOptions().stage(stage).param_persistence_threshold(0);
      volt::ZeroEngine plain_engine(plain_opt, group, options, volt_test::names_of(*plain));
      volt::ZeroEngine off_engine(off_opt, group,
                                  volt::ZeroEngineOptions(options).offload_optimizer(true),
                                  volt_test::names_of(*offloaded));
      ASSERT_TRUE(off_engine.has_master_weights());
      for (const auto& c : off_engine.chunks()) {
        ASSERT_TRUE(c.master.defined());
        EXPECT_TRUE(c.master.device().is_cpu());
        EXPECT_TRUE(c.master.is_pinned());
        EXPECT_EQ(c.master.scalar_type(), torch::kFloat);
        EXPECT_TRUE(c.view.is_cuda());
      }
      torch::manual_seed(5);
      for (int step = 0; step < 3; ++step) {
        const auto x = torch::randn({5, 6}).to(cuda, dtype);
        for (auto* e : {&plain_engine, &off_engine}) {
          auto& net = e == &plain_engine ? plain : offloaded;
          volt_test::engine_step(
              *e, e == &plain_engine ? plain_opt : off_opt,
              [&](const at::Tensor& in) { return net->forward(in); }, x,
              [&] {
                if (e == &off_engine) {
                  for (const auto& c : off_engine.chunks()) {
                    ASSERT_TRUE(c.master.grad().defined());
                    EXPECT_TRUE(c.master.grad().is_pinned());
                  }
                }
                e->clip_grad_norm(0.5, 2.0);  // small enough to scale every step
              });
        }
      }
      // The optimizer's state belongs to the host copies and lives there.
      for (const auto& c : off_engine.chunks()) {
        const auto it = off_opt.state().find(volt::detail::state_key_for(c.master));
        ASSERT_NE(it, off_opt.state().end());
        for (const auto& t : volt::detail::state_tensors(*it->second)) {
          if (t.numel() > 1) EXPECT_TRUE(t.device().is_cpu());
        }
      }
      const auto& a = plain_engine.chunks();
      const auto& b = off_engine.chunks();
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        // Against the GPU's masters (bf16: fp32 masters on the device too) or its chunks.
        const at::Tensor want = a[i].stepped().detach().to(torch::kCPU, torch::kFloat);
        EXPECT_TRUE(torch::allclose(b[i].master, want, 1e-5, 1e-6))
            << b[i].name << " max diff " << (b[i].master - want).abs().max().item<double>();
      }
      plain_engine.restore_parameters();
      off_engine.restore_parameters();
    }
  }
}

TEST(NcclCuda, ZeroOffloadResumesExactlyFromItsCheckpoint) {
  VOLT_REQUIRE_NCCL();
  // The checkpoint holds the host state and masters; a run resumed from the first epoch's
  // checkpoint ends with the weights of the run that never stopped.
  for (const auto& strategy :
       {with("deepspeed_stage_2_offload", {}),
        with("deepspeed_stage_3",
             {{"offload_optimizer", true}, {"param_persistence_threshold", int64_t{0}}}),
        with("deepspeed_stage_3_offload", {{"param_persistence_threshold", int64_t{0}}})}) {
    volt_test::TempDir dir;
    const auto straight = fit(strategy, "32-true", 2);
    fit(strategy, "32-true", 1, dir.path);
    const auto resumed = fit(strategy, "32-true", 2, dir.path, dir / "last.ckpt");
    ASSERT_EQ(straight.size(), resumed.size());
    for (size_t i = 0; i < straight.size(); ++i) {
      EXPECT_TRUE(torch::equal(straight[i], resumed[i]))
          << strategy.name() << " parameter " << i << " max diff "
          << (straight[i] - resumed[i]).abs().max().item<double>();
    }
  }
}

TEST(NcclCuda, OffloadedParameterChunksLiveInPinnedHostMemoryAndGatherOntoTheGpu) {
  VOLT_REQUIRE_NCCL();
  // Stage 3 with offload_parameters: the shard (this rank's chunks) is pinned host memory, a
  // released parameter holds no GPU memory, and an op reading it gathers it onto the GPU; the
  // results equal the engine that keeps its shard on the GPU. Without offload_optimizer it is a
  // ConfigError.
  auto group = std::make_shared<volt::ProcessGroup>(
      world_of_one(),
      volt::ProcessGroupOptions().backend(volt::Backend::kNccl).timeout(seconds(60)));
  const c10::Device cuda(c10::kCUDA, 0);
  auto make = [&] {
    torch::manual_seed(3);
    torch::nn::Sequential net(torch::nn::Linear(6, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 3));
    net->to(cuda);
    return net;
  };
  {
    auto net = make();
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    EXPECT_THROW(
        volt::ZeroEngine(opt, group, volt::ZeroEngineOptions().stage(3).offload_parameters(true),
                         volt_test::names_of(*net)),
        volt::ConfigError);
  }
  auto on_gpu = make(), on_host = make();
  torch::optim::Adam gpu_opt(on_gpu->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam host_opt(on_host->parameters(), torch::optim::AdamOptions(1e-2));
  const auto options = volt::ZeroEngineOptions().stage(3).param_persistence_threshold(0);
  volt::ZeroEngine gpu_engine(gpu_opt, group, options, volt_test::names_of(*on_gpu));
  volt::ZeroEngine host_engine(
      host_opt, group,
      volt::ZeroEngineOptions(options).offload_optimizer(true).offload_parameters(true),
      volt_test::names_of(*on_host));
  for (const auto& c : host_engine.chunks()) {
    ASSERT_TRUE(c.partitioned);
    EXPECT_TRUE(c.view.device().is_cpu());
    EXPECT_TRUE(c.view.is_pinned());
    EXPECT_TRUE(c.parameter.is_cuda());
    EXPECT_EQ(c.parameter.storage().nbytes(), 0u);  // released: no GPU memory
  }
  torch::manual_seed(5);
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({5, 6}).to(cuda);
    for (auto* e : {&gpu_engine, &host_engine}) {
      auto& net = e == &gpu_engine ? on_gpu : on_host;
      volt_test::engine_step(
          *e, e == &gpu_engine ? gpu_opt : host_opt,
          [&](const at::Tensor& in) { return net->forward(in); }, x);
    }
  }
  for (const auto& c : host_engine.chunks()) EXPECT_EQ(c.parameter.storage().nbytes(), 0u);
  gpu_engine.restore_parameters();
  host_engine.restore_parameters();
  const auto a = on_gpu->parameters(), b = on_host->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(b[i].is_cuda());
    EXPECT_TRUE(torch::allclose(a[i].cpu(), b[i].cpu(), 1e-5, 1e-6))
        << "parameter " << i << " max diff " << (a[i] - b[i]).abs().max().item<double>();
  }
}
