// FusedSDPA on CUDA tensors: routed to libtorch's fused attention kernels where the call has no
// extras they lack, checked against the reference composition on the same GPU (outputs and
// gradients); the extras fall back to the reference (or NotAvailable with require_fused).
// Skipped without a GPU, or in a build without the CUDA attention path.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

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
  // FlashAttention's variable-length kernel takes float16 / bfloat16 only.
  const std::string e = error_of<volt::NotAvailable>(
      [&] { volt::fused_sdpa(q, q, q, volt::SdpaOptions(o).require_fused(true)); });
  EXPECT_NE(e.find("valid_seq_len on CUDA (FlashAttention's variable-length kernel) needs "
                   "float16 or bfloat16, not Float"),
            std::string::npos)
      << e;
  const auto none = volt::SdpaOptions(o).valid_seq_len(torch::tensor({0, 0}, torch::kLong));
  const auto qb = q.to(torch::kBFloat16);
  const std::string z = error_of<volt::NotAvailable>(
      [&] { volt::fused_sdpa(qb, qb, qb, volt::SdpaOptions(none).require_fused(true)); });
  EXPECT_NE(z.find("valid_seq_len is 0 for every batch item"), std::string::npos) << z;
  EXPECT_EQ(volt::fused_sdpa(qb, qb, qb, none).output.abs().sum().item<float>(), 0.0f);
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

// valid_seq_len on CUDA: FlashAttention's variable-length kernel over the packed valid tokens,
// against the reference composition (a mask over every position) in float32 on the same GPU
// from the same bf16 inputs: outputs and gradients, right and left padding, with a full item, a
// partial one, an empty one and a short one. Padded output rows are exactly zero, and the padded
// positions of q, k and v get exactly zero gradient.
TEST(FusedSdpaCuda, ValidSeqLenRunsTheVariableLengthKernelAndMatchesTheReference) {
  VOLT_REQUIRE_CUDA();
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const int64_t kB = 4, kH = 3, kL = 96, kD = 64;
  const auto lens = torch::tensor({96, 37, 0, 5}, torch::kLong);
  {
    const auto q = torch::randn({kB, kH, kL, kD}, opts);
    try {
      volt::fused_sdpa(q, q, q,
                       volt::SdpaOptions().is_causal(true).valid_seq_len(lens).require_fused(true));
    } catch (const volt::NotAvailable& e) {
      GTEST_SKIP() << e.what();  // no CUDA attention path, or a GPU older than sm80
    }
  }
  auto rel = [](const at::Tensor& a, const at::Tensor& ref) {
    return max_diff(a, ref) / std::max(1e-6, ref.detach().abs().max().item<double>());
  };
  for (const bool left : {false, true}) {
    SCOPED_TRACE(left ? "left padding" : "right padding");
    torch::manual_seed(7);
    const auto q0 = torch::randn({kB, kH, kL, kD}, opts), k0 = torch::randn({kB, kH, kL, kD}, opts),
               v0 = torch::randn({kB, kH, kL, kD}, opts), g = torch::randn({kB, kH, kL, kD}, opts);
    auto q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
         v = v0.clone().requires_grad_();
    auto qr = q0.to(torch::kFloat).requires_grad_(), kr = k0.to(torch::kFloat).requires_grad_(),
         vr = v0.to(torch::kFloat).requires_grad_();
    const auto o = volt::SdpaOptions().is_causal(true).valid_seq_len(lens).seq_padding(
        left ? volt::SeqPadding::kLeft : volt::SeqPadding::kRight);
    const at::Tensor out =
        volt::fused_sdpa(q, k, v, volt::SdpaOptions(o).require_fused(true)).output;
    const at::Tensor ref = volt::sdpa_reference(qr, kr, vr, o).output;
    ASSERT_EQ(out.sizes(), ref.sizes());
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
    EXPECT_LT(rel(out, ref), 1e-2) << "output";
    out.backward(g);
    ref.backward(g.to(torch::kFloat));
    EXPECT_LT(rel(q.grad(), qr.grad()), 2e-2) << "dq";
    EXPECT_LT(rel(k.grad(), kr.grad()), 2e-2) << "dk";
    EXPECT_LT(rel(v.grad(), vr.grad()), 2e-2) << "dv";
    // Exact zeros at the padded positions, item by item.
    for (int64_t b = 0; b < kB; ++b) {
      const int64_t n = lens[b].item<int64_t>();
      const int64_t lo = left ? 0 : n, hi = left ? kL - n : kL;  // the padded rows
      if (lo == hi) continue;
      EXPECT_EQ(out[b].slice(1, lo, hi).abs().sum().item<float>(), 0.0f) << "item " << b;
      for (const at::Tensor* t : {&q, &k, &v}) {
        EXPECT_EQ(t->grad()[b].slice(1, lo, hi).abs().sum().item<float>(), 0.0f)
            << "gradient at padding, item " << b;
      }
    }
  }
}

// The packing reads q, k and v in whatever layout they come: here views of one [B, L, 3, H, D]
// projection (a strided, non-dense [B, H, L, D] each), as attention layers produce them. Output
// and gradients are bitwise those of the same values as contiguous [B, H, L, D] tensors, and the
// projection's gradient is zero at every padded position.
TEST(FusedSdpaCuda, ValidSeqLenTakesProjectionViewsBitwiseAsContiguousInputs) {
  VOLT_REQUIRE_CUDA();
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const int64_t kB = 3, kH = 2, kL = 80, kD = 32;
  const auto lens = torch::tensor({80, 19, 41}, torch::kLong);
  const auto o = volt::SdpaOptions().is_causal(true).valid_seq_len(lens).require_fused(true);
  torch::manual_seed(11);
  const auto qkv = torch::randn({kB, kL, 3, kH, kD}, opts).requires_grad_();
  const auto g = torch::randn({kB, kH, kL, kD}, opts);
  const auto view = [&](int64_t i) { return qkv.select(2, i).transpose(1, 2); };
  at::Tensor out;
  try {
    out = volt::fused_sdpa(view(0), view(1), view(2), o).output;
  } catch (const volt::NotAvailable& e) {
    GTEST_SKIP() << e.what();  // no CUDA attention path, or a GPU older than sm80
  }
  out.backward(g);
  std::vector<at::Tensor> dense;
  for (int64_t i = 0; i < 3; ++i) {
    dense.push_back(view(i).detach().contiguous().requires_grad_());
  }
  const at::Tensor ref = volt::fused_sdpa(dense[0], dense[1], dense[2], o).output;
  ref.backward(g);
  EXPECT_TRUE(torch::equal(out, ref));
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(torch::equal(qkv.grad().select(2, i).transpose(1, 2), dense[i].grad()))
        << "gradient " << i;
  }
  for (int64_t b = 1; b < kB; ++b) {
    const int64_t n = lens[b].item<int64_t>();
    EXPECT_EQ(qkv.grad()[b].slice(0, n).abs().sum().item<float>(), 0.0f) << "item " << b;
  }
}
