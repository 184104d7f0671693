// NCCL process groups on the one GPU a machine may have (world size 1: NCCL refuses two ranks
// on one device). The collectives through c10d::ProcessGroupNCCL keep each caller's device and
// values, and DDP and ZeRO stages 1 and 2 over NCCL train exactly as one device does (stage 3
// on CUDA parameters is NotAvailable: ZeroEngine's gather copies host memory). Every
// test skips without a GPU or without NCCL in the build (Debian's CPU libtorch).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <volt/volt.h>

#include <chrono>
#include <string>
#include <vector>

#include "distributed/detail/net.h"
#include "requires.h"
#include "tiny.h"

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

std::vector<at::Tensor> fit(const volt::Spec<volt::Strategy>& strategy) {
  NcclNet net;
  volt::Trainer trainer(volt::TrainerOptions()
                            .accelerator("cuda")
                            .devices(1)
                            .strategy(strategy)
                            .max_epochs(2)
                            .enable_checkpointing(false)
                            .enable_progress_bar(false)
                            .enable_model_summary(false)
                            .num_sanity_val_steps(0)
                            .logger(false));
  // In order: a distributed sampler of one rank then yields the same batches.
  auto dl = volt_test::loader(volt_test::blobs(160), 16, /*shuffle=*/false);
  trainer.fit(net, dl);
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
