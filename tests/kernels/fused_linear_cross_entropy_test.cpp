// fused_linear_cross_entropy against the composition it replaces (at::cross_entropy_loss of
// at::linear cast to float32): loss and gradients to input, weight and bias, over several chunks
// with a ragged last one, both reductions, ignored rows, bf16 autocast; the memory it saves,
// counted exactly by volt's CPU allocator; and its errors.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <volt/volt.h>

#include <cmath>
#include <string>
#include <vector>

#include "error_text.h"

namespace {

using volt::LinearCrossEntropyOptions;
using volt_test::error_of;

struct Problem {
  at::Tensor input, weight, bias, target;
};

// N rows of D features, V classes; every 5th target ignored.
Problem problem(int64_t n, int64_t d, int64_t v, uint64_t seed, bool with_bias = true) {
  torch::manual_seed(seed);
  Problem p;
  p.input = torch::randn({n, d});
  p.weight = torch::randn({v, d}) * 0.3;
  p.bias = with_bias ? torch::randn({v}) * 0.1 : at::Tensor();
  p.target = torch::randint(v, {n}, torch::kLong);
  for (int64_t i = 0; i < n; i += 5) p.target[i] = -100;
  return p;
}

struct Result {
  at::Tensor loss, d_input, d_weight, d_bias;
};

template <typename Fn>
Result run(const Problem& p, Fn&& loss_of) {
  Result r;
  auto x = p.input.clone().requires_grad_();
  auto w = p.weight.clone().requires_grad_();
  auto b = p.bias.defined() ? p.bias.clone().requires_grad_() : at::Tensor();
  r.loss = loss_of(x, w, b);
  (r.loss * 1.5).backward();  // a gradient other than 1 reaches backward
  r.d_input = x.grad();
  r.d_weight = w.grad();
  if (b.defined()) r.d_bias = b.grad();
  return r;
}

void expect_close(const Result& got, const Result& want, double rtol, double atol) {
  EXPECT_TRUE(torch::allclose(got.loss, want.loss, rtol, atol))
      << got.loss.item<double>() << " vs " << want.loss.item<double>();
  const auto close = [&](const at::Tensor& a, const at::Tensor& b, const char* what) {
    ASSERT_EQ(a.defined(), b.defined()) << what;
    if (!a.defined()) return;
    EXPECT_EQ(a.scalar_type(), b.scalar_type()) << what;
    EXPECT_TRUE(torch::allclose(a.to(torch::kFloat), b.to(torch::kFloat), rtol, atol))
        << what << ": max diff "
        << (a.to(torch::kFloat) - b.to(torch::kFloat)).abs().max().item<double>();
  };
  close(got.d_input, want.d_input, "d_input");
  close(got.d_weight, want.d_weight, "d_weight");
  close(got.d_bias, want.d_bias, "d_bias");
}

}  // namespace

TEST(FusedLinearCrossEntropy, MatchesTheCompositionOverChunksAndReductionsInFloat32) {
  const Problem p = problem(37, 16, 53, 1);
  for (const auto reduction : {volt::LossReduction::kMean, volt::LossReduction::kSum}) {
    for (const int64_t chunk : {int64_t{8}, int64_t{1}, int64_t{0}}) {  // ragged, 1 row, auto
      SCOPED_TRACE(::testing::Message() << "chunk " << chunk << ", "
                                        << LinearCrossEntropyOptions().reduction(reduction));
      const auto o = LinearCrossEntropyOptions().chunk_rows(chunk).reduction(reduction);
      const Result want = run(p, [&](auto& x, auto& w, auto& b) {
        return volt::linear_cross_entropy_reference(x, w, b, p.target, o);
      });
      const Result got = run(p, [&](auto& x, auto& w, auto& b) {
        return volt::fused_linear_cross_entropy(x, w, b, p.target, o);
      });
      EXPECT_EQ(got.loss.scalar_type(), torch::kFloat);
      expect_close(got, want, 1e-5, 1e-6);
    }
  }
  // Without bias, and with inputs that need no gradient (only the loss).
  const Problem q = problem(20, 8, 11, 2, /*with_bias=*/false);
  const Result want = run(q, [&](auto& x, auto& w, auto& b) {
    return volt::linear_cross_entropy_reference(x, w, b, q.target);
  });
  const Result got = run(q, [&](auto& x, auto& w, auto& b) {
    return volt::fused_linear_cross_entropy(x, w, b, q.target,
                                            LinearCrossEntropyOptions().chunk_rows(3));
  });
  expect_close(got, want, 1e-5, 1e-6);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(volt::fused_linear_cross_entropy(q.input, q.weight, {}, q.target),
                              want.loss, 1e-5, 1e-6));
}

TEST(FusedLinearCrossEntropy, IgnoredRowsGetNoGradientAndAllIgnoredIsNanLikeTorch) {
  Problem p = problem(12, 6, 9, 3);
  const Result got = run(p, [&](auto& x, auto& w, auto& b) {
    return volt::fused_linear_cross_entropy(x, w, b, p.target,
                                            LinearCrossEntropyOptions().chunk_rows(5));
  });
  for (int64_t i = 0; i < 12; i += 5) {
    EXPECT_EQ(got.d_input[i].abs().sum().item<float>(), 0.0f) << "row " << i;
  }
  p.target.fill_(-100);
  const Result none = run(p, [&](auto& x, auto& w, auto& b) {
    return volt::fused_linear_cross_entropy(x, w, b, p.target);
  });
  const Result ref = run(p, [&](auto& x, auto& w, auto& b) {
    return volt::linear_cross_entropy_reference(x, w, b, p.target);
  });
  EXPECT_TRUE(std::isnan(none.loss.item<float>()));
  EXPECT_TRUE(std::isnan(ref.loss.item<float>()));
  EXPECT_EQ(none.d_input.abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(none.d_weight.abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(ref.d_input.abs().sum().item<float>(), 0.0f);
}

// An ignored row whose logits overflow (an fp16 padding position): the loss leaves it out as
// torch's does (before, NaN: inf - inf times 0), and its gradient row is 0 (torch's composition
// gives that row NaN through log_softmax's backward, which the fused op does not copy).
TEST(FusedLinearCrossEntropy, AnIgnoredRowWithInfiniteLogitsStaysOutOfTheLoss) {
  Problem p = problem(10, 6, 7, 8);
  p.input[5] = torch::full({6}, 3e38);  // row 5 is ignored (every 5th): all its logits inf
  p.weight = p.weight.abs() + 0.5;
  ASSERT_EQ(p.target[5].item<int64_t>(), -100);
  ASSERT_TRUE(torch::isinf(torch::linear(p.input[5], p.weight, p.bias)).all().item<bool>());
  const Result want = run(p, [&](auto& x, auto& w, auto& b) {
    return volt::linear_cross_entropy_reference(x, w, b, p.target);
  });
  const Result got = run(p, [&](auto& x, auto& w, auto& b) {
    return volt::fused_linear_cross_entropy(x, w, b, p.target,
                                            LinearCrossEntropyOptions().chunk_rows(4));
  });
  ASSERT_TRUE(std::isfinite(want.loss.item<float>()));
  EXPECT_TRUE(torch::allclose(got.loss, want.loss, 1e-5, 1e-6))
      << got.loss.item<double>() << " vs " << want.loss.item<double>();
  EXPECT_TRUE(torch::isfinite(got.d_weight).all().item<bool>());
  EXPECT_EQ(got.d_input[5].abs().sum().item<float>(), 0.0f);
  // The other rows' input gradients are the composition's.
  for (int64_t i : {0, 1, 2, 3, 4, 6, 7, 8, 9}) {
    EXPECT_TRUE(torch::allclose(got.d_input[i], want.d_input[i], 1e-5, 1e-6)) << "row " << i;
  }
}

// Under no_grad (a validation step) only the loss is computed: no gradient buffers (before, the
// weight's float32 gradient was allocated and filled, then dropped).
TEST(FusedLinearCrossEntropy, UnderNoGradOnlyTheLossIsComputed) {
  volt::install_counting_cpu_allocator();
  const int64_t n = 64, d = 32, v = 4096;
  const Problem p = problem(n, d, v, 9);
  auto w = p.weight.clone().requires_grad_();
  torch::NoGradGuard no_grad;
  volt::reset_cpu_memory_peaks();
  const int64_t before = volt::cpu_memory_stats().in_use;
  const at::Tensor loss = volt::fused_linear_cross_entropy(
      p.input, w, p.bias, p.target, LinearCrossEntropyOptions().chunk_rows(8));
  const int64_t peak = volt::cpu_memory_stats().max_in_use - before;
  EXPECT_LT(peak, v * d * 4) << "the weight's gradient alone is " << v * d * 4 << " bytes";
  EXPECT_TRUE(torch::allclose(
      loss, volt::linear_cross_entropy_reference(p.input, w, p.bias, p.target), 1e-5, 1e-6));
}

TEST(FusedLinearCrossEntropy, UnderBf16AutocastItFollowsTheCompositionsDtypes) {
  const Problem p = problem(64, 32, 70, 4);
  const auto o = LinearCrossEntropyOptions().chunk_rows(24);
  auto under_autocast = [&](auto&& fn) {
    return run(p, [&](auto& x, auto& w, auto& b) {
      volt::AutocastGuard bf16(torch::kCPU, torch::kBFloat16);
      return fn(x, w, b);
    });
  };
  const Result want = under_autocast([&](auto& x, auto& w, auto& b) {
    return volt::linear_cross_entropy_reference(x, w, b, p.target, o);
  });
  const Result got = under_autocast([&](auto& x, auto& w, auto& b) {
    return volt::fused_linear_cross_entropy(x, w, b, p.target, o);
  });
  // bf16 GEMMs: the chunks round their weight-gradient sums apart, so bf16 tolerances.
  expect_close(got, want, 2e-2, 2e-2);
  EXPECT_EQ(got.d_weight.scalar_type(), torch::kFloat);
  // The bf16 path really ran: autocast makes these logits bf16, and the loss moves off float32's.
  {
    volt::AutocastGuard bf16(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(at::linear(p.input, p.weight, p.bias).scalar_type(), torch::kBFloat16);
  }
  const at::Tensor fp32 = volt::fused_linear_cross_entropy(p.input, p.weight, p.bias, p.target, o);
  EXPECT_NE(fp32.item<float>(), got.loss.item<float>());
}

TEST(FusedLinearCrossEntropy, NeverHoldsTheWholeLogits) {
  volt::install_counting_cpu_allocator();
  const int64_t n = 512, d = 32, v = 4096;  // float32 logits: 8 MiB
  const Problem p = problem(n, d, v, 5);
  auto peak_of = [&](auto&& fn) {
    auto x = p.input.clone().requires_grad_();
    auto w = p.weight.clone().requires_grad_();
    auto b = p.bias.clone().requires_grad_();
    volt::reset_cpu_memory_peaks();
    const int64_t before = volt::cpu_memory_stats().in_use;
    fn(x, w, b).backward();
    return volt::cpu_memory_stats().max_in_use - before;
  };
  const int64_t logits = n * v * 4;
  const int64_t reference = peak_of([&](auto& x, auto& w, auto& b) {
    return volt::linear_cross_entropy_reference(x, w, b, p.target);
  });
  const int64_t fused = peak_of([&](auto& x, auto& w, auto& b) {
    return volt::fused_linear_cross_entropy(x, w, b, p.target,
                                            LinearCrossEntropyOptions().chunk_rows(32));
  });
  // The composition holds at least the float32 logits and their gradient; the fused op one
  // chunk's logits (32 rows: 512 KiB) beside the gradients of input, weight and bias.
  EXPECT_GE(reference, 2 * logits) << "reference peak " << reference;
  const int64_t grads = (n * d + v * d + v) * 4;
  EXPECT_LT(fused, 2 * grads + 4 * 32 * v * 4) << "fused peak " << fused;
  EXPECT_LT(fused * 4, reference) << fused << " vs " << reference;
}

// Backward hands out the gradients it computed in forward (scaled in place): a second backward
// through the same loss is a clear error, not gradients scaled twice.
TEST(FusedLinearCrossEntropy, ASecondBackwardThroughOneLossIsAValueError) {
  const Problem p = problem(6, 4, 5, 7);
  auto x = p.input.clone().requires_grad_();
  const at::Tensor loss = volt::fused_linear_cross_entropy(x, p.weight, p.bias, p.target);
  loss.backward({}, /*retain_graph=*/true);
  const std::string e = error_of<volt::ValueError>([&] { loss.backward(); });
  EXPECT_NE(e.find("backward ran twice"), std::string::npos) << e;
}

TEST(FusedLinearCrossEntropy, BadInputIsATypedErrorNamingWhatToFix) {
  const Problem p = problem(6, 4, 5, 6);
  auto fails = [&](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                   const at::Tensor& t) {
    return error_of<volt::ValueError>([&] { volt::fused_linear_cross_entropy(x, w, b, t); });
  };
  EXPECT_NE(fails(p.input.reshape({2, 3, 4}), p.weight, p.bias, p.target).find("reshape({-1, "),
            std::string::npos);
  EXPECT_NE(fails(p.input, p.weight.t(), p.bias, p.target).find("do not fit"), std::string::npos);
  EXPECT_NE(fails(p.input, p.weight, p.bias, p.target.to(torch::kInt)).find("int64"),
            std::string::npos);
  EXPECT_NE(fails(p.input, p.weight, p.bias.narrow(0, 0, 4), p.target).find("bias"),
            std::string::npos);
  at::Tensor bad = p.target.clone();
  bad[3] = 5;
  const std::string range = fails(p.input, p.weight, p.bias, bad);
  EXPECT_NE(range.find("[FusedLinearCrossEntropy] target[3] = 5 is not a class in [0, 5)"),
            std::string::npos)
      << range;
  const std::string chunk = error_of<volt::ConfigError>([&] {
    volt::fused_linear_cross_entropy(p.input, p.weight, p.bias, p.target,
                                     LinearCrossEntropyOptions().chunk_rows(-1));
  });
  EXPECT_NE(chunk.find("chunk_rows=-1"), std::string::npos) << chunk;
  const std::string pad = error_of<volt::ConfigError>([&] {
    volt::fused_linear_cross_entropy(p.input, p.weight, p.bias, p.target,
                                     LinearCrossEntropyOptions().pad_classes_to(-1));
  });
  EXPECT_NE(pad.find("pad_classes_to=-1"), std::string::npos) << pad;
}

// Classes padded to an aligned count (automatic on CUDA) change nothing but the GEMMs'
// summation order: the loss and the gradients of the real classes, in their shapes.
TEST(FusedLinearCrossEntropy, PaddedClassesGiveTheUnpaddedLossAndGradients) {
  for (const bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    const Problem p = problem(37, 16, 53, 7, with_bias);  // 53 classes padded to 64
    const auto o = LinearCrossEntropyOptions().chunk_rows(8).pad_classes_to(64);
    const Result want = run(p, [&](auto& x, auto& w, auto& b) {
      return volt::linear_cross_entropy_reference(x, w, b, p.target, o);
    });
    const Result got = run(p, [&](auto& x, auto& w, auto& b) {
      return volt::fused_linear_cross_entropy(x, w, b, p.target, o);
    });
    expect_close(got, want, 1e-5, 1e-6);
    EXPECT_EQ(got.d_weight.sizes(), p.weight.sizes());
    EXPECT_TRUE(got.d_weight.is_contiguous());
    // Under bf16 autocast the padded weight is made in bf16, as autocast casts the weight.
    const Result want16 = run(p, [&](auto& x, auto& w, auto& b) {
      volt::AutocastGuard bf16(torch::kCPU, torch::kBFloat16);
      return volt::linear_cross_entropy_reference(x, w, b, p.target, o);
    });
    const Result got16 = run(p, [&](auto& x, auto& w, auto& b) {
      volt::AutocastGuard bf16(torch::kCPU, torch::kBFloat16);
      return volt::fused_linear_cross_entropy(x, w, b, p.target, o);
    });
    expect_close(got16, want16, 2e-2, 2e-2);
  }
}

// On CUDA the padding is automatic for a class count that is not a multiple of 8 (GPT-2's
// 50,257), with bf16 autocast as GPT-2 trains.
TEST(FusedLinearCrossEntropyCuda, AutomaticPaddingUnderBf16AutocastMatchesTheComposition) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  Problem p = problem(300, 64, 1001, 8);
  p.input = p.input.cuda();
  p.weight = p.weight.cuda();
  p.bias = p.bias.cuda();
  p.target = p.target.cuda();
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "float32");
    const auto o = LinearCrossEntropyOptions().chunk_rows(128);
    auto in_precision = [&](auto&& fn) {
      return run(p, [&](auto& x, auto& w, auto& b) {
        volt::AutocastGuard guard(torch::kCUDA, torch::kBFloat16, bf16);
        return fn(x, w, b);
      });
    };
    const Result want = in_precision([&](auto& x, auto& w, auto& b) {
      return volt::linear_cross_entropy_reference(x, w, b, p.target, o);
    });
    const Result got = in_precision([&](auto& x, auto& w, auto& b) {
      return volt::fused_linear_cross_entropy(x, w, b, p.target, o);
    });
    // float32 on CUDA may use TF32-free cuBLAS kernels of another summation order.
    expect_close(got, want, bf16 ? 2e-2 : 1e-4, bf16 ? 2e-2 : 1e-5);
    EXPECT_EQ(got.d_weight.sizes(), p.weight.sizes());
    EXPECT_EQ(got.d_weight.device(), p.weight.device());
  }
}
