// The fused bias + activation epilogue against libtorch's composition (bias_activation_reference:
// y + bias, then at::relu / at::gelu / at::silu). ReLU and identity are exact (one add, one max);
// GELU, its tanh form and SiLU go through ATen's vector erf/tanh/exp, whose width here (AVX2)
// may differ from the one libtorch picked (AVX-512 on this machine): 2e-6 relative + absolute.

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#define VOLT_BIAS_ACT_AVX2  // the library has its AVX2 and AVX-512 builds (CMakeLists.txt)
#endif
#include "error_text.h"
#include "kernels/detail/bias_act_cpu.h"
#include "volt/core/errors.h"
#include "volt/kernels/fused_bias_activation.h"

namespace {

using volt::Activation;

const Activation kAll[] = {Activation::kIdentity, Activation::kRelu, Activation::kGelu,
                           Activation::kGeluTanh, Activation::kSilu};

bool exact(Activation a) {
  return a == Activation::kIdentity || a == Activation::kRelu;
}

void expect_matches(const at::Tensor& got, const at::Tensor& want, Activation a) {
  ASSERT_EQ(got.sizes(), want.sizes());
  if (exact(a)) {
    // Bitwise where finite, NaN where the reference has NaN (NaN != NaN for torch::equal).
    const at::Tensor nan = want.isnan();
    EXPECT_TRUE(torch::equal(got.isnan(), nan)) << volt::to_string(a);
    EXPECT_TRUE(torch::equal(got.masked_fill(nan, 0), want.masked_fill(nan, 0)))
        << volt::to_string(a);
  } else {
    const at::Tensor bad =
        (got.isnan() != want.isnan()) |
        ((got - want).abs() > 2e-6 + 2e-6 * want.abs()).logical_and(want.isnan().logical_not());
    EXPECT_FALSE(bad.any().item<bool>())
        << volt::to_string(a) << ": got " << got.masked_select(bad).slice(0, 0, 4)
        << " where libtorch gives " << want.masked_select(bad).slice(0, 0, 4);
  }
}

using volt_test::error_of;

TEST(FusedBiasActivation, EveryActivationMatchesTheCompositionWithAndWithoutBias) {
  torch::manual_seed(0);
  // 37 columns: a vector body and a partial tail; 4096 x 96 spreads rows over threads.
  for (auto shape : {std::vector<int64_t>{5, 37}, std::vector<int64_t>{2, 3, 8},
                     std::vector<int64_t>{4096, 96}, std::vector<int64_t>{7}}) {
    const at::Tensor y = torch::randn(shape) * 3;
    const at::Tensor bias = torch::randn({shape.back()});
    for (Activation a : kAll) {
      for (bool with_bias : {true, false}) {
        const at::Tensor b = with_bias ? bias : at::Tensor();
        at::Tensor got = y.clone();
        volt::fused_bias_activation_(got, b, a);
        expect_matches(got, volt::bias_activation_reference(y, b, a), a);
      }
    }
  }
}

// fused_bias_activation_ runs the widest build the CPU has: each build is checked here directly.
TEST(FusedBiasActivation, EveryInstructionSetBuildMatchesTheComposition) {
  using Fn = void (*)(float*, const float*, int64_t, int64_t, int);
  std::vector<std::pair<const char*, Fn>> builds{{"baseline", &volt::detail::bias_act_default}};
#if defined(VOLT_BIAS_ACT_AVX2)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    builds.emplace_back("avx2", &volt::detail::bias_act_avx2);
  }
  if (__builtin_cpu_supports("avx512f"))
    builds.emplace_back("avx512", &volt::detail::bias_act_avx512);
#endif
  torch::manual_seed(3);
  const at::Tensor y = torch::randn({33, 70}) * 4, bias = torch::randn({70});
  for (const auto& [name, fn] : builds) {
    for (Activation a : kAll) {
      at::Tensor got = y.clone();
      fn(got.data_ptr<float>(), bias.data_ptr<float>(), 33, 70, static_cast<int>(a));
      SCOPED_TRACE(name);
      expect_matches(got, volt::bias_activation_reference(y, bias, a), a);
    }
  }
  std::printf("[ measured ] builds checked:");
  for (const auto& b : builds) std::printf(" %s", b.first);
  std::printf("\n");
}

TEST(FusedBiasActivation, NonFiniteValuesFollowLibtorch) {
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor y = torch::tensor({nan, inf, -inf, 0.0f, -0.0f, 1e-30f, 80.0f, -80.0f, 3.0f});
  for (Activation a : kAll) {
    at::Tensor got = y.clone();
    volt::fused_bias_activation_(got, at::Tensor(), a);
    at::Tensor want = volt::bias_activation_reference(y, at::Tensor(), a);
    // libtorch 2.11's vectorised exact GELU gives NaN at +inf (seen on the H100 machine's CPU;
    // 1.13 gives inf). The kernel gives the limit, inf, with every libtorch.
    if (a == Activation::kGelu) want = torch::where(y.isposinf() & want.isnan(), y, want);
    expect_matches(got, want, a);
    EXPECT_TRUE(std::isnan(got[0].item<float>())) << volt::to_string(a) << " drops a NaN";
  }
}

TEST(FusedBiasActivation, LinearActivationMatchesLinearThenActivation) {
  torch::manual_seed(1);
  const at::Tensor w = torch::randn({24, 19}), b = torch::randn({24});
  // 3-D input, and a transposed (non-contiguous) one: the product reads any strides.
  const at::Tensor x3 = torch::randn({3, 5, 19});
  const at::Tensor xt = torch::randn({19, 11}).t();
  torch::NoGradGuard no_grad;
  for (Activation a : kAll) {
    for (const at::Tensor& x : {x3, xt}) {
      const at::Tensor got = volt::fused_linear_activation(x, w, b, a, /*require_fused=*/true);
      const at::Tensor want = volt::linear_activation_reference(x, w, b, a);
      ASSERT_EQ(got.sizes(), want.sizes());
      // The reference adds the bias inside the GEMM (addmm): one rounding apart.
      EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5)) << volt::to_string(a);
    }
    const at::Tensor no_bias = volt::fused_linear_activation(x3, w, at::Tensor(), a, true);
    EXPECT_TRUE(torch::allclose(no_bias, volt::linear_activation_reference(x3, w, at::Tensor(), a),
                                1e-5, 1e-5));
  }
}

TEST(FusedBiasActivation, WhereTheKernelDoesNotApplyTheLinearFallsBackOrSaysWhy) {
  torch::manual_seed(2);
  auto lin = torch::nn::Linear(6, 4);
  const at::Tensor x = torch::randn({3, 6});
  // Autograd recording: the reference runs, with gradients equal to Linear + GELU's.
  const at::Tensor y = volt::fused_linear_activation(x, lin->weight, lin->bias, Activation::kGelu);
  y.sum().backward();
  const at::Tensor grad = lin->weight.grad().clone();
  lin->weight.mutable_grad().zero_();
  torch::gelu(lin->forward(x)).sum().backward();
  EXPECT_TRUE(torch::equal(grad, lin->weight.grad()));
  std::string e = error_of(
      [&] { volt::fused_linear_activation(x, lin->weight, lin->bias, Activation::kGelu, true); });
  EXPECT_NE(e.find("autograd is recording"), std::string::npos) << e;
  // bfloat16: the reference, or NotAvailable naming the dtype.
  torch::NoGradGuard no_grad;
  const at::Tensor xb = x.to(at::kBFloat16), wb = lin->weight.to(at::kBFloat16),
                   bb = lin->bias.to(at::kBFloat16);
  EXPECT_TRUE(torch::equal(volt::fused_linear_activation(xb, wb, bb, Activation::kSilu),
                           volt::linear_activation_reference(xb, wb, bb, Activation::kSilu)));
  EXPECT_THROW(volt::fused_linear_activation(xb, wb, bb, Activation::kSilu, true),
               volt::NotAvailable);
  e = error_of([&] { volt::fused_linear_activation(xb, wb, bb, Activation::kSilu, true); });
  EXPECT_NE(e.find("float32"), std::string::npos) << e;
  // Under CPU bf16 autocast with mm on its lower-precision list (where the machine's bf16 GEMM
  // is fast), the GEMM came back bfloat16 and the float kernel threw "expected scalar type
  // Float": the composition runs instead, as autocast casts it.
  const bool was = at::autocast::is_cpu_enabled();
  const auto dtype = at::autocast::get_autocast_cpu_dtype();
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  at::Tensor fused, ref;
  try {
    fused = volt::fused_linear_activation(x, lin->weight, lin->bias, Activation::kGelu);
    ref = volt::linear_activation_reference(x, lin->weight, lin->bias, Activation::kGelu);
    e = error_of(
        [&] { volt::fused_linear_activation(x, lin->weight, lin->bias, Activation::kGelu, true); });
  } catch (...) {
    at::autocast::set_cpu_enabled(was);
    at::autocast::set_autocast_cpu_dtype(dtype);
    throw;
  }
  at::autocast::set_cpu_enabled(was);
  at::autocast::set_autocast_cpu_dtype(dtype);
  EXPECT_EQ(fused.scalar_type(), ref.scalar_type());
  EXPECT_TRUE(torch::equal(fused, ref));
  EXPECT_NE(e.find("CPU autocast is on"), std::string::npos) << e;
}

TEST(FusedBiasActivation, BadShapesAndTensorsAreTypedErrors) {
  at::Tensor y = torch::randn({4, 8});
  std::string e =
      error_of([&] { volt::fused_bias_activation_(y, torch::randn({7}), Activation::kRelu); });
  EXPECT_NE(e.find("does not match the input's last dimension"), std::string::npos) << e;
  EXPECT_THROW(volt::fused_bias_activation_(y, torch::randn({7}), Activation::kRelu),
               volt::ValueError);
  at::Tensor yb = y.to(at::kBFloat16);
  EXPECT_THROW(volt::fused_bias_activation_(yb, at::Tensor(), Activation::kRelu),
               volt::NotAvailable);
  at::Tensor yt = y.t();
  e = error_of([&] { volt::fused_bias_activation_(yt, at::Tensor(), Activation::kRelu); });
  EXPECT_NE(e.find("non-contiguous"), std::string::npos) << e;
  at::Tensor leaf = torch::randn({2, 3}, torch::requires_grad());
  e = error_of([&] { volt::fused_bias_activation_(leaf, at::Tensor(), Activation::kRelu); });
  EXPECT_NE(e.find("autograd"), std::string::npos) << e;
  e = error_of([&] {
    volt::fused_linear_activation(torch::randn({2, 5}), torch::randn({3, 4}), at::Tensor(),
                                  Activation::kRelu);
  });
  EXPECT_NE(e.find("does not fit weight"), std::string::npos) << e;
  e = error_of([&] {
    volt::fused_linear_activation(torch::randn({2, 4}), torch::randn({3, 4}), torch::randn({4}),
                                  Activation::kRelu);
  });
  EXPECT_NE(e.find("pass a 1-D bias of 3"), std::string::npos) << e;
}

TEST(FusedBiasActivation, ActivationNamesRoundTripAndUnknownOnesAreConfigErrors) {
  for (Activation a : kAll) EXPECT_EQ(volt::parse_activation(volt::to_string(a)), a);
  const std::string e = error_of([] { volt::parse_activation("swish"); });
  EXPECT_NE(e.find("\"swish\" is not known"), std::string::npos) << e;
  EXPECT_THROW(volt::parse_activation("swish"), volt::ConfigError);
}

// The in-place kernel writes through the data pointer; before session 81 it left the version
// counter alone, so a tensor autograd had saved, changed under NoGradGuard, gave a silently wrong
// gradient (exp(w) + 1 here) instead of torch's in-place error.
TEST(FusedBiasActivation, TheInPlaceKernelBumpsTheVersionCounterAsAnInPlaceOpWould) {
  const at::Tensor w = torch::randn({4}, torch::requires_grad());
  at::Tensor z = w.exp();  // ExpBackward saves its result
  const int64_t before = z._version();
  {
    torch::NoGradGuard no_grad;
    volt::fused_bias_activation_(z, torch::ones({4}), Activation::kIdentity);
  }
  EXPECT_EQ(z._version(), before + 1);
  EXPECT_THROW(z.sum().backward(), c10::Error);
}

// No input features: linear gives the bias broadcast to every row (reshape({-1, 0}) threw).
TEST(FusedBiasActivation, ALinearWithoutInputFeaturesGivesTheActivatedBias) {
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::zeros({3, 0}), w = torch::zeros({4, 0}), b = torch::ones({4});
  const at::Tensor got = volt::fused_linear_activation(x, w, b, Activation::kIdentity, true);
  EXPECT_TRUE(got.equal(volt::linear_activation_reference(x, w, b, Activation::kIdentity)));
  EXPECT_TRUE(got.equal(torch::ones({3, 4})));
}

}  // namespace
