// FusedAdamW, FusedSGD and FusedClipNorm on CUDA tensors (libtorch's fused multi-tensor
// kernels) against torch::optim's AdamW/Adam/SGD and clip_grad_norm_ on an identical copy of
// the parameters on the same GPU, and against the CPU kernels; checkpoints moved between CPU
// and CUDA. Skipped, with the reason, where the build or the machine has no CUDA.
//
// Tolerances: the fused kernels compute in float32 with the bias corrections in another order
// than torch::optim's per-parameter ops, so float32 results agree to rtol 1e-5 / atol 1e-6
// after 8 steps (not bit for bit); SGD, whose arithmetic is the same, to rtol 1e-6.

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <volt/volt.h>
#include <sstream>

#include "error_text.h"

namespace {

using torch::Tensor;

#define VOLT_REQUIRE_CUDA()                                                                   \
  do {                                                                                        \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device in this build/machine"; \
  } while (0)

// Odd sizes: 1 and 7 exercise the kernels' tails, 70001 spans several blocks.
const std::vector<std::vector<int64_t>> kShapes = {{1}, {7}, {10, 100}, {70001}, {64, 64}};

std::vector<Tensor> make_params(const torch::Device& device, uint64_t seed = 0) {
  torch::manual_seed(seed);
  std::vector<Tensor> out;
  for (const auto& s : kShapes) out.push_back(torch::randn(s).to(device).requires_grad_());
  return out;
}

std::vector<Tensor> copies(const std::vector<Tensor>& ps, const torch::Device& device) {
  std::vector<Tensor> out;
  for (const auto& p : ps) out.push_back(p.detach().to(device).clone().requires_grad_());
  return out;
}

/// Step `k`'s gradients: the same values for every copy, whatever its device.
void set_grads(std::vector<Tensor>& ps, int k) {
  auto gen = at::detail::createCPUGenerator(1000 + k);
  for (auto& p : ps) p.mutable_grad() = at::randn(p.sizes(), gen).to(p.device());
}

void expect_close(const std::vector<Tensor>& a, const std::vector<Tensor>& b, double rtol,
                  double atol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const Tensor x = a[i].detach().cpu().to(torch::kDouble);
    const Tensor y = b[i].detach().cpu().to(torch::kDouble);
    EXPECT_TRUE(torch::allclose(x, y, rtol, atol))
        << what << ": parameter " << i << " max diff " << (x - y).abs().max().item<double>();
  }
}

template <typename Make>
void run_steps(Make& opt, std::vector<Tensor>& ps, int from, int to) {
  for (int k = from; k < to; ++k) {
    set_grads(ps, k);
    opt.step();
  }
}

TEST(FusedOptimCuda, AdamWVariantsMatchTorchOnTheSameGpuAndTheCpuKernels) {
  VOLT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA);
  struct Case {
    const char* name;
    double wd;
    bool amsgrad, decoupled;
  };
  for (const Case c :
       {Case{"adamw", 0.01, false, true}, Case{"adamw_amsgrad", 0.01, true, true},
        Case{"adam_l2", 0.01, false, false}, Case{"adam_no_decay", 0, false, true}}) {
    SCOPED_TRACE(c.name);
    auto fused = make_params(cuda);
    auto ref = copies(fused, cuda);
    auto cpu = copies(fused, torch::kCPU);
    volt::FusedAdamW f(
        fused, volt::FusedAdamWOptions(1e-2).weight_decay(c.wd).amsgrad(c.amsgrad).adam_w_mode(
                   c.decoupled));
    volt::FusedAdamW fc(
        cpu, volt::FusedAdamWOptions(1e-2).weight_decay(c.wd).amsgrad(c.amsgrad).adam_w_mode(
                 c.decoupled));
    std::unique_ptr<torch::optim::Optimizer> r;
    if (c.decoupled) {
      r = std::make_unique<torch::optim::AdamW>(
          ref, torch::optim::AdamWOptions(1e-2).weight_decay(c.wd).amsgrad(c.amsgrad));
    } else {
      r = std::make_unique<torch::optim::Adam>(
          ref, torch::optim::AdamOptions(1e-2).weight_decay(c.wd).amsgrad(c.amsgrad));
    }
    run_steps(f, fused, 0, 8);
    run_steps(*r, ref, 0, 8);
    run_steps(fc, cpu, 0, 8);
    expect_close(fused, ref, 1e-5, 1e-6, "CUDA fused vs torch::optim on CUDA");
    expect_close(fused, cpu, 1e-5, 1e-6, "CUDA fused vs CPU fused");
    for (const auto& p : fused) EXPECT_TRUE(p.is_cuda());
    // The state is on the GPU, and the step count is the host count checkpoints hold.
    auto& st = static_cast<volt::FusedAdamWParamState&>(*f.state().begin()->second);
    EXPECT_EQ(st.step(), 8);
    EXPECT_TRUE(st.exp_avg().is_cuda());
  }
}

TEST(FusedOptimCuda, SgdVariantsMatchTorchOnTheSameGpu) {
  VOLT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA);
  struct Case {
    const char* name;
    double momentum, dampening, wd;
    bool nesterov;
  };
  for (const Case c :
       {Case{"plain", 0, 0, 0, false}, Case{"momentum", 0.9, 0, 0, false},
        Case{"nesterov_decay", 0.9, 0, 1e-3, true}, Case{"dampening", 0.9, 0.1, 1e-3, false}}) {
    SCOPED_TRACE(c.name);
    auto fused = make_params(cuda);
    auto ref = copies(fused, cuda);
    volt::FusedSGD f(fused, volt::FusedSGDOptions(0.05)
                                .momentum(c.momentum)
                                .dampening(c.dampening)
                                .weight_decay(c.wd)
                                .nesterov(c.nesterov));
    torch::optim::SGD r(ref, torch::optim::SGDOptions(0.05)
                                 .momentum(c.momentum)
                                 .dampening(c.dampening)
                                 .weight_decay(c.wd)
                                 .nesterov(c.nesterov));
    run_steps(f, fused, 0, 8);
    run_steps(r, ref, 0, 8);
    expect_close(fused, ref, 1e-6, 1e-7, "CUDA fused SGD vs torch::optim::SGD");
  }
}

TEST(FusedOptimCuda, ClipNormMatchesTorchForEveryNormType) {
  VOLT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA);
  for (const double norm_type : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(norm_type);
    auto a = make_params(cuda);
    auto b = copies(a, cuda);
    set_grads(a, 0);
    set_grads(b, 0);
    ASSERT_EQ(volt::FusedClipNorm::unsupported_reason(a), "");
    const double got = volt::fused_clip_grad_norm_(a, 0.5, norm_type);
    const double want = torch::nn::utils::clip_grad_norm_(b, 0.5, norm_type);
    EXPECT_NEAR(got, want, 1e-5 * want);
    std::vector<Tensor> ga, gb;
    for (size_t i = 0; i < a.size(); ++i) {
      ga.push_back(a[i].grad());
      gb.push_back(b[i].grad());
    }
    expect_close(ga, gb, 1e-5, 1e-7, "clipped gradients");
  }
  // Below max_norm nothing changes; error_if_nonfinite throws before scaling.
  auto a = make_params(cuda);
  set_grads(a, 1);
  const Tensor before = a[3].grad().clone();
  volt::fused_clip_grad_norm_(a, 1e9);
  EXPECT_TRUE(a[3].grad().equal(before));
  a[2].mutable_grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(volt::fused_clip_grad_norm_(a, 1.0, 2.0, /*error_if_nonfinite=*/true),
               volt::ValueError);
  EXPECT_TRUE(a[3].grad().equal(before));
}

// The learning rate lives on the device (a float32 scalar the kernels read): a change between
// steps is followed, as torch::optim follows it.
TEST(FusedOptimCuda, LearningRateChangesBetweenStepsAreFollowed) {
  VOLT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA);
  auto fa = make_params(cuda), fs = make_params(cuda);
  auto ra = copies(fa, cuda), rs = copies(fs, cuda);
  volt::FusedAdamW adam(fa, volt::FusedAdamWOptions(1e-2).weight_decay(0.01));
  torch::optim::AdamW radam(ra, torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  volt::FusedSGD sgd(fs, volt::FusedSGDOptions(0.05).momentum(0.9));
  torch::optim::SGD rsgd(rs, torch::optim::SGDOptions(0.05).momentum(0.9));
  const std::vector<double> lrs = {1e-2, 3e-3, 3e-3, 2e-2, 1e-3, 0.0, 5e-3, 1e-2};
  for (int k = 0; k < static_cast<int>(lrs.size()); ++k) {
    for (auto* o : std::initializer_list<torch::optim::Optimizer*>{&adam, &radam, &sgd, &rsgd}) {
      o->param_groups()[0].options().set_lr(lrs[k] * (o == &sgd || o == &rsgd ? 5 : 1));
    }
    run_steps(adam, fa, k, k + 1);
    run_steps(radam, ra, k, k + 1);
    run_steps(sgd, fs, k, k + 1);
    run_steps(rsgd, rs, k, k + 1);
  }
  expect_close(fa, ra, 1e-5, 1e-6, "FusedAdamW vs torch::optim::AdamW, lr changing");
  expect_close(fs, rs, 1e-6, 1e-7, "FusedSGD vs torch::optim::SGD, lr changing");
}

// A step captured in a CUDA graph reads the learning rate of each replay once
// sync_lrs_to_device() wrote it: bit for bit the eager steps with the same lrs. A change not
// written before capturing is refused inside the capture (it would be replayed forever).
TEST(FusedOptimCuda, AStepCapturedInAGraphReadsTheLearningRateOfEachReplay) {
  VOLT_REQUIRE_CUDA();
  if (!volt::CudaGraph::available()) GTEST_SKIP() << volt::CudaGraph::unavailable_reason();
  const torch::Device cuda(torch::kCUDA);
  auto graphed = make_params(cuda);
  auto eager = copies(graphed, cuda);
  set_grads(graphed, 0);  // the same gradients at every step
  set_grads(eager, 0);
  volt::FusedSGD g(graphed, volt::FusedSGDOptions(0.1).momentum(0.9));
  volt::FusedSGD e(eager, volt::FusedSGDOptions(0.1).momentum(0.9));
  g.step();  // eager warm-up: the momentum buffers and the device lr exist
  e.step();
  const auto set_lr = [](volt::FusedSGD& o, double lr) {
    o.param_groups()[0].options().set_lr(lr);
  };
  set_lr(g, 0.05);
  volt::CudaGraph refused("stale lr");
  const std::string err =
      volt_test::error_of<volt::NotAvailable>([&] { refused.capture([&] { g.step(); }); });
  EXPECT_NE(err.find("sync_lrs_to_device"), std::string::npos) << err;
  g.sync_lrs_to_device();
  volt::CudaGraph graph("FusedSGD step");
  graph.capture([&] { g.step(); });
  for (const double lr : {0.05, 0.02, 0.02, 0.2}) {
    set_lr(g, lr);
    set_lr(e, lr);
    g.sync_lrs_to_device();
    graph.replay();
    e.step();
  }
  for (size_t i = 0; i < graphed.size(); ++i) {
    EXPECT_TRUE(torch::equal(graphed[i], eager[i]))
        << "parameter " << i << " max diff " << (graphed[i] - eager[i]).abs().max().item<double>();
  }
}

// A run on the GPU saves its optimizer, a CPU run loads it (and the other way round); both then
// continue like the run that never moved.
TEST(FusedOptimCuda, CheckpointsMoveBetweenCpuAndCuda) {
  VOLT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA);
  for (const bool to_cpu : {true, false}) {
    SCOPED_TRACE(to_cpu ? "cuda -> cpu" : "cpu -> cuda");
    const torch::Device from = to_cpu ? cuda : torch::Device(torch::kCPU);
    const torch::Device to = to_cpu ? torch::Device(torch::kCPU) : cuda;
    auto ps = make_params(from);
    auto still = copies(ps, from);
    volt::FusedAdamW a(ps, volt::FusedAdamWOptions(1e-2).amsgrad(true));
    volt::FusedAdamW s(still, volt::FusedAdamWOptions(1e-2).amsgrad(true));
    run_steps(a, ps, 0, 4);
    run_steps(s, still, 0, 4);
    std::ostringstream bytes;
    torch::save(a, bytes);

    auto moved = copies(ps, to);
    volt::FusedAdamW b(moved, volt::FusedAdamWOptions(1e-2).amsgrad(true));
    std::istringstream in(bytes.str());
    torch::load(b, in);
    run_steps(b, moved, 4, 8);
    run_steps(s, still, 4, 8);
    expect_close(moved, still, 1e-5, 1e-6, "moved run vs the run that stayed");
    for (const auto& p : moved) EXPECT_EQ(p.device().type(), to.type());
  }
}

TEST(FusedOptimCuda, BadTensorsAreTypedErrorsBeforeAnyUpdate) {
  VOLT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA);
  auto p = torch::randn({4}, cuda).requires_grad_();
  p.mutable_grad() = torch::randn({4});  // gradient on the CPU
  volt::FusedAdamW a({p}, volt::FusedAdamWOptions(1e-2));
  const Tensor before = p.detach().clone();
  EXPECT_NE(volt_test::error_of<volt::ValueError>([&] {
              a.step();
            }).find("gradients must match their parameter"),
            std::string::npos);
  EXPECT_TRUE(p.detach().equal(before));
  p.mutable_grad() = torch::randn({4}, cuda);
  volt::FusedAdamW nobc({p}, volt::FusedAdamWOptions(1e-2).bias_correction(false));
  EXPECT_NE(volt_test::error_of<volt::NotAvailable>([&] {
              nobc.step();
            }).find("bias_correction=false has no fused CUDA kernel"),
            std::string::npos);
  EXPECT_TRUE(p.detach().equal(before));
}

// bf16 parameters (what bf16-true training steps): the fused kernel computes in float32 and
// rounds once, like torch::optim::AdamW's bf16 arithmetic to within one bf16 ulp.
TEST(FusedOptimCuda, Bf16ParametersStepLikeTorch) {
  VOLT_REQUIRE_CUDA();
  const torch::Device cuda(torch::kCUDA);
  auto fused = make_params(cuda);
  for (auto& p : fused) p = p.detach().to(torch::kBFloat16).requires_grad_();
  auto ref = copies(fused, cuda);
  for (auto& p : ref) p = p.detach().to(torch::kFloat).requires_grad_();
  volt::FusedAdamW f(fused, volt::FusedAdamWOptions(1e-2));
  torch::optim::AdamW r(ref, torch::optim::AdamWOptions(1e-2));
  for (int k = 0; k < 4; ++k) {
    set_grads(ref, k);
    for (size_t i = 0; i < fused.size(); ++i) {
      fused[i].mutable_grad() = ref[i].grad().to(torch::kBFloat16);
    }
    f.step();
    r.step();
  }
  expect_close(fused, ref, 2e-2, 2e-2, "bf16 fused vs fp32 torch::optim::AdamW");
}

}  // namespace
