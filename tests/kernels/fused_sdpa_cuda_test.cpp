// FusedSDPA on CUDA tensors: routed to libtorch's fused attention kernels where the call has no
// extras they lack, checked against the reference composition on the same GPU (outputs and
// gradients); the extras fall back to the reference (or NotAvailable with require_fused).
// Skipped without a GPU, or in a build without the CUDA attention path.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>

#include "error_text.h"
#include "volt/core/errors.h"
#include "volt/kernels/fused_sdpa.h"

using volt_test::error_of;

namespace {

#define VOLT_REQUIRE_CUDA()                                                                   \
  do {                                                                                        \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device in this build/machine"; \
  } while (0)

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.detach().to(torch::kDouble) - b.detach().to(torch::kDouble)).abs().max().item<double>();
}

void check_against_reference(torch::Dtype dtype, bool causal, double tol) {
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
  torch::manual_seed(3);
  const auto q0 = torch::randn({2, 3, 64, 32}, opts), k0 = torch::randn({2, 3, 48, 32}, opts),
             v0 = torch::randn({2, 3, 48, 16}, opts), g = torch::randn({2, 3, 64, 16}, opts);
  auto q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
       v = v0.clone().requires_grad_();
  auto qr = q0.clone().requires_grad_(), kr = k0.clone().requires_grad_(),
       vr = v0.clone().requires_grad_();
  const auto o = volt::SdpaOptions().is_causal(causal);
  const at::Tensor out = volt::fused_sdpa(q, k, v, volt::SdpaOptions(o).require_fused(true)).output;
  const at::Tensor ref = volt::sdpa_reference(qr, kr, vr, o).output;
  EXPECT_LT(max_diff(out, ref), tol) << "output, causal=" << causal;
  out.backward(g);
  ref.backward(g);
  EXPECT_LT(max_diff(q.grad(), qr.grad()), tol * 4) << "dq";
  EXPECT_LT(max_diff(k.grad(), kr.grad()), tol * 4) << "dk";
  EXPECT_LT(max_diff(v.grad(), vr.grad()), tol * 4) << "dv";
}

}  // namespace

TEST(FusedSdpaCuda, LibtorchKernelsMatchTheReferenceInFloat32AndBfloat16) {
  VOLT_REQUIRE_CUDA();
  {
    const auto q = torch::randn({1, 1, 4, 8}, torch::TensorOptions().device(torch::kCUDA));
    try {
      volt::fused_sdpa(q, q, q, volt::SdpaOptions().require_fused(true));
    } catch (const volt::NotAvailable& e) {
      GTEST_SKIP() << e.what();  // a build without the CUDA attention path
    }
  }
  for (const bool causal : {false, true}) {
    check_against_reference(torch::kFloat, causal, 1e-4);
    check_against_reference(torch::kBFloat16, causal, 5e-2);
  }
}

TEST(FusedSdpaCuda, ExtrasWithoutACudaKernelFallBackOrRefuseWithRequireFused) {
  VOLT_REQUIRE_CUDA();
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  const auto q = torch::randn({2, 2, 8, 16}, opts);
  const auto lens = torch::tensor({8, 5}, torch::kLong);
  const auto o = volt::SdpaOptions().is_causal(true).valid_seq_len(lens);
  const std::string e = error_of<volt::NotAvailable>(
      [&] { volt::fused_sdpa(q, q, q, volt::SdpaOptions(o).require_fused(true)); });
  EXPECT_NE(e.find("valid_seq_len has no CUDA kernel"), std::string::npos) << e;
  // Without require_fused the reference composition answers, padded rows zero.
  const at::Tensor out = volt::fused_sdpa(q, q, q, o).output;
  EXPECT_TRUE(torch::equal(out.cpu(), volt::sdpa_reference(q, q, q, o).output.cpu()));
  EXPECT_EQ(out[1].slice(1, 5, 8).abs().sum().item<float>(), 0.0f);
  const std::string m = error_of<volt::NotAvailable>([&] {
    volt::fused_sdpa(q, q, q,
                     volt::SdpaOptions()
                         .attn_mask(torch::ones({8, 8}, opts.dtype(torch::kBool)))
                         .require_fused(true));
  });
  EXPECT_NE(m.find("attn_mask on CUDA"), std::string::npos) << m;
}
