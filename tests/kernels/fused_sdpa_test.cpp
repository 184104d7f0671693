// FusedSDPA against the plain composition (sdpa_reference, itself checked against libtorch's
// own attention op) for values and gradients. Tolerances: float32 kernel vs float64 reference
// 2e-5 (values) / 1e-4 (gradients); bfloat16 vs a float32 reference on the same inputs 2e-2.

#include <torch/torch.h>

#include <gtest/gtest.h>
#include <volt/volt.h>

#include <dlfcn.h>

#include <atomic>
#include <cmath>
#include <iostream>
#include <thread>

#include "kernels/detail/sdpa_cpu.h"

namespace {

using volt::SdpaOptions;

struct Qkv {
  at::Tensor q, k, v;
};

Qkv make_qkv(int64_t b, int64_t h, int64_t lq, int64_t lk, int64_t d, int64_t dv = -1,
             at::ScalarType dtype = at::kFloat, uint64_t seed = 1) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto opt = at::TensorOptions().dtype(at::kFloat);
  Qkv r;
  r.q = at::randn({b, h, lq, d}, gen, opt).to(dtype);
  r.k = at::randn({b, h, lk, d}, gen, opt).to(dtype);
  r.v = at::randn({b, h, lk, dv < 0 ? d : dv}, gen, opt).to(dtype);
  return r;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

struct Grads {
  at::Tensor out, dq, dk, dv;
};

// Runs fn(q, k, v) with gradients under a fixed upstream gradient.
template <typename Fn>
Grads run_with_grad(const Qkv& x, at::ScalarType dtype, Fn fn, uint64_t seed = 7) {
  auto q = x.q.to(dtype).detach().requires_grad_(true);
  auto k = x.k.to(dtype).detach().requires_grad_(true);
  auto v = x.v.to(dtype).detach().requires_grad_(true);
  at::Tensor out = fn(q, k, v);
  auto gen = at::detail::createCPUGenerator(seed);
  at::Tensor g = at::randn(out.sizes(), gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
  out.backward(g);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

void expect_grads_close(const Grads& a, const Grads& b, double tol_out, double tol_grad) {
  EXPECT_LT(max_diff(a.out, b.out), tol_out);
  EXPECT_LT(max_diff(a.dq, b.dq), tol_grad);
  EXPECT_LT(max_diff(a.dk, b.dk), tol_grad);
  EXPECT_LT(max_diff(a.dv, b.dv), tol_grad);
}

void check_against_reference(const Qkv& x, const SdpaOptions& opts) {
  auto fused = run_with_grad(x, at::kFloat, [&](auto q, auto k, auto v) {
    return volt::fused_sdpa(q, k, v, SdpaOptions(opts).require_fused(true)).output;
  });
  auto ref = run_with_grad(x, at::kDouble, [&](auto q, auto k, auto v) {
    return volt::sdpa_reference(q, k, v, opts).output;
  });
  EXPECT_FALSE(fused.out.isnan().any().item<bool>());
  EXPECT_FALSE(fused.dq.isnan().any().item<bool>());
  expect_grads_close(fused, ref, 2e-5, 1e-4);
}

struct Shape {
  int64_t b, h, lq, lk, d, dv;
};

class FusedSdpaShapes : public ::testing::TestWithParam<std::tuple<Shape, bool, bool>> {};

TEST_P(FusedSdpaShapes, MatchesReferenceValuesAndGradients) {
  const auto [s, causal, recompute] = GetParam();
  Qkv x = make_qkv(s.b, s.h, s.lq, s.lk, s.d, s.dv);
  check_against_reference(x, SdpaOptions().is_causal(causal).recompute(recompute));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FusedSdpaShapes,
    ::testing::Combine(::testing::Values(Shape{1, 1, 1, 1, 64, 64},        // seq 1
                                         Shape{2, 3, 1, 37, 64, 64},       // one query
                                         Shape{1, 2, 17, 33, 64, 64},      // odd, Lq != Lk
                                         Shape{2, 2, 130, 257, 128, 128},  // spans tiles, 128
                                         Shape{1, 2, 200, 200, 64, 32},    // Dv != D
                                         Shape{1, 1, 64, 128, 16, 16}),    // exact tiles
                       ::testing::Bool(), ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<Shape, bool, bool>>& info) {
      const Shape& s = std::get<0>(info.param);
      return "b" + std::to_string(s.b) + "h" + std::to_string(s.h) + "q" + std::to_string(s.lq) +
             "k" + std::to_string(s.lk) + "d" + std::to_string(s.d) + "v" + std::to_string(s.dv) +
             (std::get<1>(info.param) ? "_causal" : "") +
             (std::get<2>(info.param) ? "_recompute" : "_keep");
    });

TEST(FusedSdpa, ReferenceMatchesLibtorchAttention) {
  Qkv x = make_qkv(2, 3, 45, 45, 32);
  for (bool causal : {false, true}) {
#if VOLT_TORCH_AT_LEAST(2, 0)
    at::Tensor expect = at::scaled_dot_product_attention(x.q, x.k, x.v, {}, 0.0, causal);
#else
    at::Tensor expect =
        std::get<0>(at::_scaled_dot_product_attention(x.q, x.k, x.v, {}, 0.0, false, causal));
#endif
    EXPECT_LT(max_diff(volt::sdpa_reference(x.q, x.k, x.v, SdpaOptions().is_causal(causal)).output,
                       expect),
              1e-5);
    EXPECT_LT(
        max_diff(volt::fused_sdpa(x.q, x.k, x.v, SdpaOptions().is_causal(causal)).output, expect),
        1e-5);
  }
}

TEST(FusedSdpa, ExplicitScale) {
  Qkv x = make_qkv(1, 2, 40, 50, 64);
  check_against_reference(x, SdpaOptions().scale(0.3));
}

TEST(FusedSdpa, BoolMaskBroadcastAndFullyMaskedRows) {
  Qkv x = make_qkv(2, 2, 70, 150, 32);
  auto gen = at::detail::createCPUGenerator(3);
  at::Tensor mask = at::rand({1, 1, 70, 150}, gen) > 0.3;
  mask.index_put_({0, 0, 5}, false);  // query 5 may attend nothing: zeros, no NaN
  check_against_reference(x, SdpaOptions().attn_mask(mask));
  auto out = volt::fused_sdpa(x.q, x.k, x.v, SdpaOptions().attn_mask(mask)).output;
  EXPECT_EQ(out.index({at::indexing::Slice(), at::indexing::Slice(), 5}).abs().max().item<float>(),
            0.0f);
}

TEST(FusedSdpa, AdditiveFloatMaskPerBatchWithCausal) {
  Qkv x = make_qkv(2, 3, 90, 90, 64);
  auto gen = at::detail::createCPUGenerator(4);
  at::Tensor mask = at::randn({2, 1, 1, 90}, gen);
  mask.index_put_({1, 0, 0, at::indexing::Slice(0, 10)}, -std::numeric_limits<float>::infinity());
  check_against_reference(x, SdpaOptions().attn_mask(mask).is_causal(true));
}

class FusedSdpaPadding : public ::testing::TestWithParam<volt::SeqPadding> {};

TEST_P(FusedSdpaPadding, ValidSeqLenMatchesReferenceAndIgnoresPadding) {
  const auto side = GetParam();
  Qkv x = make_qkv(3, 2, 140, 140, 64);
  at::Tensor lens = at::tensor({100, 140, 1}, at::TensorOptions().dtype(at::kInt));
  auto opts = SdpaOptions().is_causal(true).valid_seq_len(lens).seq_padding(side);
  check_against_reference(x, opts);
  check_against_reference(x, SdpaOptions(opts).recompute(false));
  // Changing padded keys/values must not change anything; padded queries give zeros.
  const auto pad =
      side == volt::SeqPadding::kRight ? at::indexing::Slice(100, 140) : at::indexing::Slice(0, 40);
  Qkv y{x.q.clone(), x.k.clone(), x.v.clone()};
  y.k.index_put_({0, at::indexing::Slice(), pad}, 1e3);
  y.v.index_put_({0, at::indexing::Slice(), pad}, -1e3);
  auto a = volt::fused_sdpa(x.q, x.k, x.v, opts).output;
  auto b = volt::fused_sdpa(y.q, y.k, y.v, opts).output;
  EXPECT_LT(max_diff(a, b), 1e-6);
  EXPECT_EQ(a.index({0, at::indexing::Slice(), pad}).abs().max().item<float>(), 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Sides, FusedSdpaPadding,
                         ::testing::Values(volt::SeqPadding::kLeft, volt::SeqPadding::kRight),
                         [](const ::testing::TestParamInfo<volt::SeqPadding>& info) {
                           return std::string(info.param == volt::SeqPadding::kLeft ? "left"
                                                                                    : "right");
                         });

TEST(FusedSdpa, RecomputeModesAgreeAndScopedSettingWorks) {
  EXPECT_TRUE(volt::sdpa_recompute_enabled());
  {
    volt::SdpaRecomputeGuard off(false);
    EXPECT_FALSE(volt::sdpa_recompute_enabled());
    {
      volt::SdpaRecomputeGuard on(true);
      EXPECT_TRUE(volt::sdpa_recompute_enabled());
    }
    EXPECT_FALSE(volt::sdpa_recompute_enabled());
  }
  EXPECT_TRUE(volt::sdpa_recompute_enabled());
  volt::set_sdpa_recompute(false);
  EXPECT_FALSE(volt::sdpa_recompute_enabled());
  {
    volt::SdpaRecomputeGuard on(true);
    EXPECT_TRUE(volt::sdpa_recompute_enabled());
  }
  volt::set_sdpa_recompute(true);

  Qkv x = make_qkv(2, 2, 150, 150, 64);
  auto fn = [](auto q, auto k, auto v) {
    return volt::fused_sdpa(q, k, v, SdpaOptions().is_causal(true).dropout_p(0.2).dropout_seed(9))
        .output;
  };
  auto a = run_with_grad(x, at::kFloat, fn);
  Grads b;
  {
    volt::SdpaRecomputeGuard keep(false);  // the scoped setting reaches calls without recompute()
    b = run_with_grad(x, at::kFloat, fn);
  }
  expect_grads_close(a, b, 1e-5, 1e-4);  // different summation orders, both float32
}

TEST(FusedSdpa, DropoutMatchesReferenceWithTheSameSeed) {
  Qkv x = make_qkv(2, 2, 77, 130, 64);
  for (bool recompute : {true, false}) {
    check_against_reference(x,
                            SdpaOptions().dropout_p(0.3).dropout_seed(1234).recompute(recompute));
  }
}

TEST(FusedSdpa, DropoutStatisticsAndReturnedMask) {
  const double p = 0.25;
  Qkv x = make_qkv(2, 4, 64, 256, 32);
  auto r = volt::fused_sdpa(
      x.q, x.k, x.v,
      SdpaOptions().dropout_p(p).dropout_seed(5).recompute(false).return_dropout_mask(true));
  ASSERT_EQ(r.to_list().size(), 2u);
  ASSERT_TRUE(r.dropout_mask.defined());
  EXPECT_TRUE(r.dropout_mask.equal(volt::sdpa_dropout_mask(2, 4, 64, 256, p, 5)));
  const double n = static_cast<double>(r.dropout_mask.numel());
  const double kept = r.dropout_mask.sum().item<double>() / n;
  EXPECT_NEAR(kept, 1 - p, 4 * std::sqrt(p * (1 - p) / n));
  // Unbiased: the mean over seeds approaches the dropout-free output.
  Qkv s = make_qkv(1, 1, 8, 16, 8);
  at::Tensor mean = at::zeros({1, 1, 8, 8});
  const int trials = 2000;
  for (int t = 0; t < trials; ++t) {
    mean +=
        volt::fused_sdpa(s.q, s.k, s.v, SdpaOptions().dropout_p(p).dropout_seed(100 + t)).output;
  }
  mean /= trials;
  EXPECT_LT(max_diff(mean, volt::fused_sdpa(s.q, s.k, s.v).output), 0.05);
  // Different seeds give different masks; unset seeds follow torch's generator.
  EXPECT_FALSE(
      volt::sdpa_dropout_mask(1, 1, 8, 8, p, 1).equal(volt::sdpa_dropout_mask(1, 1, 8, 8, p, 2)));
  torch::manual_seed(3);
  auto a = volt::fused_sdpa(x.q, x.k, x.v, SdpaOptions().dropout_p(p)).output;
  torch::manual_seed(3);
  auto b = volt::fused_sdpa(x.q, x.k, x.v, SdpaOptions().dropout_p(p)).output;
  EXPECT_TRUE(a.equal(b));
}

TEST(FusedSdpa, ReturnsAttentionProbabilitiesInReferenceOrder) {
  Qkv x = make_qkv(2, 2, 33, 70, 64);
  at::NoGradGuard no_grad;
  auto opts = SdpaOptions().is_causal(true).return_attn_probs(true);
  auto r = volt::fused_sdpa(x.q, x.k, x.v, opts);
  auto ref =
      volt::sdpa_reference(x.q.to(at::kDouble), x.k.to(at::kDouble), x.v.to(at::kDouble), opts);
  ASSERT_EQ(r.to_list().size(), 2u);
  EXPECT_LT(max_diff(r.attn_probs, ref.attn_probs), 1e-6);
  EXPECT_LT(max_diff(r.attn_probs.sum(-1), at::ones({2, 2, 33})), 1e-5);
  // Both extras: output, attn_probs, dropout_mask.
  auto both = volt::fused_sdpa(
      x.q, x.k, x.v, SdpaOptions(opts).dropout_p(0.1).recompute(false).return_dropout_mask(true));
  auto list = both.to_list();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[1].scalar_type(), at::kFloat);
  EXPECT_EQ(list[2].scalar_type(), at::kBool);
}

TEST(FusedSdpa, Bfloat16MatchesFloat32ReferenceIncludingFastSoftmax) {
  Qkv x = make_qkv(2, 2, 100, 100, 64, -1, at::kBFloat16);
  for (auto mode : {volt::SoftmaxMode::kExact, volt::SoftmaxMode::kFast}) {
    for (bool causal : {false, true}) {
      auto opts =
          SdpaOptions().is_causal(causal).softmax_mode(mode).recompute(!causal ? false : true);
      auto fused = run_with_grad(x, at::kBFloat16, [&](auto q, auto k, auto v) {
        return volt::fused_sdpa(q, k, v, SdpaOptions(opts).require_fused(true)).output;
      });
      EXPECT_EQ(fused.out.scalar_type(), at::kBFloat16);
      EXPECT_EQ(fused.dq.scalar_type(), at::kBFloat16);
      auto ref = run_with_grad(x, at::kFloat, [&](auto q, auto k, auto v) {
        return volt::sdpa_reference(q, k, v, SdpaOptions().is_causal(causal)).output;
      });
      expect_grads_close(fused, ref, 2e-2, 5e-2);
    }
  }
}

TEST(FusedSdpa, NanKeyGivesNanWhereTheReferenceDoes) {
  // Head 0: key 7 is NaN, so causal rows >= 7 are NaN in the reference and rows < 7 (key 7
  // masked) are finite. Head 1: query 3 is NaN, so its every score is NaN. Before the fix the
  // kernel returned zeros for those rows (and converted NaN to int in exp: undefined
  // behaviour that UBSan reports).
  Qkv x = make_qkv(1, 2, 70, 150, 32);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  x.k.index_put_({0, 0, 7}, nan);
  x.q.index_put_({0, 1, 3}, nan);
  const auto opts = SdpaOptions().is_causal(true);
  const at::Tensor ref =
      volt::sdpa_reference(x.q.to(at::kDouble), x.k.to(at::kDouble), x.v.to(at::kDouble), opts)
          .output;
  ASSERT_TRUE(ref.isnan().any().item<bool>());
  ASSERT_FALSE(ref.isnan().all().item<bool>());
  for (const bool recompute : {true, false}) {
    const at::Tensor out =
        volt::fused_sdpa(x.q, x.k, x.v, SdpaOptions(opts).recompute(recompute)).output;
    EXPECT_TRUE(out.isnan().equal(ref.isnan())) << "recompute=" << recompute;
    const at::Tensor finite = ref.isnan().logical_not();
    EXPECT_LT(max_diff(out.masked_select(finite), ref.masked_select(finite)), 2e-5)
        << "recompute=" << recompute;
  }
}

TEST(FusedSdpa, ExpApproximationErrors) {
  double exact = 0, fast = 0;
  for (double x = -80; x < 80; x += 0.01) {
    const float xf = static_cast<float>(x);
    const double e = std::exp(static_cast<double>(xf));
    exact = std::max(exact, std::abs(volt::detail::sdpa_exp(xf, false) - e) / e);
    fast = std::max(fast, std::abs(volt::detail::sdpa_exp(xf, true) - e) / e);
  }
  EXPECT_LT(exact, 3e-7);  // ~2 ulp
  EXPECT_LT(fast, 1.5e-4);
  EXPECT_GT(fast, 1e-5);  // really an approximation
  EXPECT_EQ(volt::detail::sdpa_exp(-std::numeric_limits<float>::infinity(), false), 0.0f);
  EXPECT_EQ(volt::detail::sdpa_exp(-100.0f, true), 0.0f);
  EXPECT_TRUE(std::isnan(volt::detail::sdpa_exp(std::nanf(""), false)));
}

TEST(FusedSdpa, FallsBackToReferenceForUnsupportedDtypes) {
  Qkv x = make_qkv(1, 2, 20, 30, 16, -1, at::kDouble);
  auto out = volt::fused_sdpa(x.q, x.k, x.v, SdpaOptions().is_causal(true)).output;
  EXPECT_EQ(out.scalar_type(), at::kDouble);
  EXPECT_LT(
      max_diff(out, volt::sdpa_reference(x.q, x.k, x.v, SdpaOptions().is_causal(true)).output),
      1e-12);
  try {
    volt::fused_sdpa(x.q, x.k, x.v, SdpaOptions().require_fused(true));
    FAIL() << "expected NotAvailable";
  } catch (const volt::NotAvailable& e) {
    EXPECT_NE(std::string(e.what()).find("float32 and bfloat16"), std::string::npos);
  }
}

// float16 on the CPU: libtorch 1.13 has no CPU float16 matmul, so the fallback composition
// failed with c10::Error ("bmm" not implemented for 'Half') before session 99; it runs in
// float32 and returns float16, values and gradients within float16 round-off of float64.
TEST(FusedSdpa, Float16OnTheCpuFallsBackThroughFloat32) {
  Qkv x = make_qkv(1, 2, 12, 12, 16, -1, at::kFloat);
  const at::Tensor q = x.q.to(at::kHalf).requires_grad_(), k = x.k.to(at::kHalf).requires_grad_(),
                   v = x.v.to(at::kHalf).requires_grad_();
  const at::Tensor mask = at::zeros({12, 12}, at::kHalf);
  const auto opts = SdpaOptions().is_causal(true).attn_mask(mask);
  auto out = volt::fused_sdpa(q, k, v, opts);
  EXPECT_EQ(out.output.scalar_type(), at::kHalf);
  {
    torch::NoGradGuard no_grad;  // attention probabilities are for inference
    auto probs = volt::fused_sdpa(q, k, v, SdpaOptions(opts).return_attn_probs(true));
    EXPECT_EQ(probs.attn_probs.scalar_type(), at::kHalf);
    EXPECT_TRUE(torch::equal(probs.output, out.output));
  }
  const at::Tensor qd = q.detach().to(at::kDouble).requires_grad_(),
                   kd = k.detach().to(at::kDouble).requires_grad_(),
                   vd = v.detach().to(at::kDouble).requires_grad_();
  auto ref = volt::sdpa_reference(qd, kd, vd,
                                  SdpaOptions().is_causal(true).attn_mask(mask.to(at::kDouble)));
  EXPECT_LT(max_diff(out.output, ref.output), 2e-3);
  out.output.to(at::kFloat).sum().backward();
  ref.output.sum().backward();
  EXPECT_EQ(q.grad().scalar_type(), at::kHalf);
  EXPECT_LT(max_diff(q.grad(), qd.grad()), 5e-3);
  EXPECT_LT(max_diff(v.grad(), vd.grad()), 5e-3);
}

template <typename E>
void expect_error(const Qkv& x, const SdpaOptions& opts, const std::string& phrase) {
  try {
    volt::fused_sdpa(x.q, x.k, x.v, opts);
    FAIL() << "expected an error mentioning '" << phrase << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("[FusedSDPA]", 0), 0u) << e.what();
  }
}

TEST(FusedSdpa, RejectsBadInputWithActionableErrors) {
  Qkv x = make_qkv(2, 2, 16, 16, 8);
  Qkv bad_batch{x.q, x.k.narrow(0, 0, 1), x.v.narrow(0, 0, 1)};
  expect_error<volt::ValueError>(bad_batch, {}, "batch broadcasting is not supported");
  Qkv three_d{x.q[0], x.k[0], x.v[0]};
  expect_error<volt::ValueError>(three_d, {}, "must be 4-D");
  Qkv heads{x.q, x.k.narrow(1, 0, 1), x.v.narrow(1, 0, 1)};
  expect_error<volt::ValueError>(heads, {}, "same number of heads");
  Qkv dims{x.q, x.k.narrow(3, 0, 4), x.v};
  expect_error<volt::ValueError>(dims, {}, "same head_dim");
  expect_error<volt::ConfigError>(x, SdpaOptions().dropout_p(1.0), "outside [0, 1)");
  expect_error<volt::ConfigError>(x, SdpaOptions().softmax_mode(volt::SoftmaxMode::kFast),
                                  "only bfloat16");
  at::Tensor lens = at::tensor({16, 8}, at::TensorOptions().dtype(at::kLong));
  expect_error<volt::ConfigError>(x, SdpaOptions().valid_seq_len(lens), "only with is_causal");
  expect_error<volt::ConfigError>(
      x, SdpaOptions().is_causal(true).valid_seq_len(lens).attn_mask(at::ones({16, 16}, at::kBool)),
      "no attn_mask");
  expect_error<volt::ValueError>(
      x, SdpaOptions().is_causal(true).valid_seq_len(at::tensor({17, 3}, at::kLong)),
      "outside [0, 16]");
  expect_error<volt::ValueError>(x, SdpaOptions().is_causal(true).valid_seq_len(at::tensor({3})),
                                 "integer tensor of shape [2]");
  expect_error<volt::ConfigError>(x, SdpaOptions().return_dropout_mask(true).recompute(true),
                                  "non-recompute mode");
  expect_error<volt::ValueError>(x, SdpaOptions().attn_mask(at::ones({3, 16}, at::kBool)),
                                 "does not broadcast");
  expect_error<volt::ValueError>(x, SdpaOptions().attn_mask(at::ones({16, 16}, at::kInt)),
                                 "must be bool");
  Qkv g{x.q.clone().requires_grad_(true), x.k, x.v};
  expect_error<volt::ConfigError>(g, SdpaOptions().return_attn_probs(true), "inference only");
  Qkv b16 = make_qkv(2, 2, 16, 16, 8, -1, at::kBFloat16);
  Qkv b16g{b16.q.clone().requires_grad_(true), b16.k, b16.v};
  expect_error<volt::ConfigError>(
      b16g, SdpaOptions().softmax_mode(volt::SoftmaxMode::kFast).recompute(true),
      "not supported for training in recompute mode");
}

// Each tile GEMM routine against at::mm, for every transpose and with padded leading
// dimensions, alpha and beta, as the kernel calls them.
TEST(FusedSdpa, EveryTileGemmRoutineMatchesMatmul) {
  using volt::detail::SdpaGemm;
  auto gen = at::detail::createCPUGenerator(11);
  const int64_t m = 37, n = 70, k = 19, pad = 5;
  int tested = 0;
  for (SdpaGemm g : {SdpaGemm::kOneDnn, SdpaGemm::kBlas, SdpaGemm::kAten}) {
    const char* why = nullptr;
    if (!volt::detail::sdpa_gemm_available(g, &why)) {
      std::cout << volt::detail::sdpa_gemm_name(g) << " not tested: " << why << "\n";
      continue;
    }
    ++tested;
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        // Stored shapes with `pad` extra columns: op(A) is [m,k], op(B) is [k,n].
        at::Tensor a = at::randn({ta ? k : m, (ta ? m : k) + pad}, gen);
        at::Tensor b = at::randn({tb ? n : k, (tb ? k : n) + pad}, gen);
        at::Tensor c = at::randn({m, n + pad}, gen);
        at::Tensor opa = a.narrow(1, 0, ta ? m : k), opb = b.narrow(1, 0, tb ? k : n);
        if (ta) opa = opa.t();
        if (tb) opb = opb.t();
        for (float beta : {0.0f, 1.0f}) {
          at::Tensor out = c.clone();
          at::Tensor expect = 0.5 * at::mm(opa.to(at::kDouble), opb.to(at::kDouble)) +
                              beta * c.narrow(1, 0, n).to(at::kDouble);
          volt::detail::sdpa_gemm(g, ta, tb, m, n, k, 0.5f, a.data_ptr<float>(), a.size(1),
                                  b.data_ptr<float>(), b.size(1), beta, out.data_ptr<float>(),
                                  out.size(1));
          EXPECT_LT(max_diff(out.narrow(1, 0, n), expect), 1e-4)
              << volt::detail::sdpa_gemm_name(g) << " ta=" << ta << " tb=" << tb;
          EXPECT_TRUE(out.narrow(1, n, pad).equal(c.narrow(1, n, pad)));  // padding untouched
        }
      }
    }
  }
  EXPECT_GE(tested, 1);
  // The kernel takes the first available routine; oneDNN whenever libtorch loaded it.
  const char* why_not = nullptr;
  const bool have_onednn = volt::detail::sdpa_gemm_available(SdpaGemm::kOneDnn, &why_not);
  EXPECT_EQ(volt::detail::sdpa_gemm_routine() == SdpaGemm::kOneDnn, have_onednn);
  // Loaded but unused only in a build without OpenMP (TSan builds, docs/HARDENING.md).
  if (dlsym(RTLD_DEFAULT, "dnnl_sgemm") != nullptr && !have_onednn) {
    EXPECT_NE(std::string(why_not).find("volt was built without OpenMP"), std::string::npos)
        << why_not;
  }
}

// Issue #16: the kernel used to switch OpenBLAS to one thread process-wide for each call, so a
// GEMM on another thread (a DataLoader worker, a second model) silently lost its BLAS threads.
// Another thread polls OpenBLAS's thread count while fused_sdpa runs forward and backward; it
// must never see a change.
TEST(FusedSdpa, LeavesProcessWideBlasThreadsAlone) {
  using GetFn = int (*)();
  using SetFn = void (*)(int);
  auto get = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (!get || !set) GTEST_SKIP() << "OpenBLAS is not loaded in this process";
  const int previous = get();
  set(2);
  ASSERT_EQ(get(), 2);
  const int torch_threads = at::get_num_threads();

  std::atomic<bool> done{false}, in_call{false};
  std::atomic<int64_t> polls_in_call{0}, changes{0};
  std::atomic<int> seen{2};
  std::thread poller([&] {
    while (!done.load()) {
      const bool during = in_call.load();
      const int n = get();
      if (n != 2) {
        changes.fetch_add(1);
        seen.store(n);
      }
      if (during) polls_in_call.fetch_add(1);
    }
  });
  // Two torch threads: (batch, head) tasks run in a parallel region; a single (batch, head) runs
  // inline, where the kernel makes its tile GEMMs serial with this thread's own OpenMP setting.
  at::set_num_threads(2);
  Qkv many = make_qkv(2, 4, 256, 256, 64), one = make_qkv(1, 1, 256, 256, 64);
  // Runs until the poller has looked often while the kernel was running (no sleeping, no
  // reliance on scheduling luck), with a cap so the test ends either way.
  for (int call = 0; call < 200 && (call < 2 || polls_in_call.load() < 2000); ++call) {
    in_call.store(true);
    run_with_grad(call % 2 ? one : many, at::kFloat, [](auto q, auto k, auto v) {
      return volt::fused_sdpa(q, k, v, SdpaOptions().require_fused(true)).output;
    });
    in_call.store(false);
  }
  done.store(true);
  poller.join();
  const int after = get(), torch_after = at::get_num_threads();
  set(previous);
  at::set_num_threads(torch_threads);
  EXPECT_GE(polls_in_call.load(), 2000) << "the poller did not overlap the kernel calls";
  EXPECT_EQ(changes.load(), 0) << "another thread saw OpenBLAS threads = " << seen.load();
  EXPECT_EQ(after, 2);
  EXPECT_EQ(torch_after, 2);  // this thread's OpenMP setting is restored after inline calls
}

TEST(FusedSdpa, OptionsPrint) {
  std::ostringstream os;
  os << SdpaOptions().is_causal(true).dropout_p(0.1);
  EXPECT_NE(os.str().find("is_causal=1"), std::string::npos);
  EXPECT_NE(os.str().find("dropout_p=0.1"), std::string::npos);
}

}  // namespace
