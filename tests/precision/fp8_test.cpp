// fp8 emulation: every code of both formats round-trips, midpoints round to even, saturation and
// NaN/inf at the edges; the delayed-scaling recipe; Fp8Linear's forward, backward, training and
// exact resume.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <volt/volt.h>

#include <cmath>
#include <limits>

#include "tiny.h"

namespace {

using volt::Fp8Format;

// Decodes an fp8 code by the OCP spec, written independently of fp8_round.
double decode(Fp8Format f, int code) {
  const bool e4m3 = f == Fp8Format::kE4M3;
  const int mbits = e4m3 ? 3 : 2, ebits = e4m3 ? 4 : 5, bias = e4m3 ? 7 : 15;
  const int sign = code >> 7, exp = (code >> mbits) & ((1 << ebits) - 1),
            man = code & ((1 << mbits) - 1);
  double v;
  if (e4m3 && exp == 15 && man == 7) return std::nan("");
  if (!e4m3 && exp == 31) {
    if (man != 0) return std::nan("");
    v = std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(man, 1 - bias - mbits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(man, -mbits), exp - bias);
  }
  return sign ? -v : v;
}

float round1(double v, Fp8Format f, bool saturate = true) {
  return volt::fp8_round(torch::tensor({static_cast<float>(v)}), f, saturate).item<float>();
}

}  // namespace

TEST(Fp8, EveryFiniteCodeIsAFixedPointAndMidpointsRoundToEven) {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    const int mbits = f == Fp8Format::kE4M3 ? 3 : 2;
    std::vector<std::pair<double, int>> positive;  // (value, code)
    for (int code = 0; code < 256; ++code) {
      const double v = decode(f, code);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(round1(v, f), static_cast<float>(v)) << "code " << code;
      if (code < 128) positive.emplace_back(v, code);
    }
    std::sort(positive.begin(), positive.end());
    for (size_t i = 0; i + 1 < positive.size(); ++i) {
      const double lo = positive[i].first, hi = positive[i + 1].first;
      const double even = (positive[i].second & ((1 << mbits) - 1)) % 2 == 0 ? lo : hi;
      EXPECT_EQ(round1((lo + hi) / 2, f), static_cast<float>(even))
          << "between " << lo << " and " << hi;
      EXPECT_EQ(round1(lo + (hi - lo) * 0.49, f), static_cast<float>(lo));
      EXPECT_EQ(round1(lo + (hi - lo) * 0.51, f), static_cast<float>(hi));
    }
  }
}

TEST(Fp8, EdgesSaturationNanInfAndSignedZero) {
  const auto e4 = Fp8Format::kE4M3, e5 = Fp8Format::kE5M2;
  EXPECT_EQ(volt::fp8_max(e4), 448.0);
  EXPECT_EQ(volt::fp8_max(e5), 57344.0);
  EXPECT_EQ(volt::fp8_min_subnormal(e4), std::ldexp(1.0, -9));
  EXPECT_EQ(volt::fp8_min_subnormal(e5), std::ldexp(1.0, -16));
  // E4M3: 464 is the tie between 448 and 480 (the NaN code): even mantissa wins, finite.
  EXPECT_EQ(round1(464, e4, false), 448.f);
  EXPECT_TRUE(std::isnan(round1(465, e4, false)));
  EXPECT_EQ(round1(465, e4, true), 448.f);
  EXPECT_EQ(round1(-1e6, e4, true), -448.f);
  EXPECT_EQ(round1(INFINITY, e4, true), 448.f);
  EXPECT_TRUE(std::isnan(round1(INFINITY, e4, false)));
  // E5M2: 61440 ties to 65536 (even), which is inf.
  EXPECT_TRUE(std::isinf(round1(61440, e5, false)));
  EXPECT_EQ(round1(61439, e5, false), 57344.f);
  EXPECT_EQ(round1(61440, e5, true), 57344.f);
  EXPECT_EQ(round1(-INFINITY, e5, false), -INFINITY);
  for (auto f : {e4, e5}) {
    EXPECT_TRUE(std::isnan(round1(NAN, f, true)));
    EXPECT_TRUE(std::isnan(round1(NAN, f, false)));
    const double sub = volt::fp8_min_subnormal(f);
    EXPECT_EQ(round1(sub / 2, f), 0.f);  // tie with 0: even (0) wins
    EXPECT_EQ(round1(sub * 0.51, f), static_cast<float>(sub));
    EXPECT_TRUE(std::signbit(round1(-sub / 4, f)));  // -0 keeps its sign
  }
  EXPECT_EQ(round1(0.3, e4), 0.3125f);  // hand-computed: quantum 2^-5 at [0.25, 0.5)
  EXPECT_EQ(round1(0.3, e5), 0.3125f);  // quantum 2^-4: 4.8 -> 5
  EXPECT_THROW(volt::fp8_round(torch::ones({2}, torch::kInt64), e4), volt::ValueError);
}

TEST(Fp8, DelayedScalingRecipe) {
  volt::DelayedScalingOptions o;
  const auto prev = torch::tensor(3.f);
  const auto h = torch::tensor({0.f, 8.f, 4.f});
  EXPECT_FLOAT_EQ(volt::delayed_scale(h, prev, Fp8Format::kE4M3, o).item<float>(), 56.f);
  EXPECT_FLOAT_EQ(volt::delayed_scale(h, prev, Fp8Format::kE4M3, o.amax_compute_algo("most_recent"))
                      .item<float>(),
                  112.f);
  EXPECT_FLOAT_EQ(
      volt::delayed_scale(h, prev, Fp8Format::kE5M2, volt::DelayedScalingOptions().margin(2))
          .item<float>(),
      57344.f / 8 / 4);
  EXPECT_FLOAT_EQ(volt::delayed_scale(torch::zeros({4}), prev, Fp8Format::kE4M3, o).item<float>(),
                  3.f);
  EXPECT_FLOAT_EQ(
      volt::delayed_scale(torch::tensor({1.f, INFINITY}), prev, Fp8Format::kE4M3, o).item<float>(),
      3.f);
  // "max" skips a NaN entry (TransformerEngine's fmaxf): the other steps' amax gives the scale.
  // It was NaN, which kept the previous scale for the history's length.
  EXPECT_FLOAT_EQ(volt::delayed_scale(torch::tensor({1.f, 2.f, NAN, 4.f}), prev, Fp8Format::kE4M3,
                                      volt::DelayedScalingOptions())
                      .item<float>(),
                  112.f);
  // An amax whose scale overflows float gets float's largest (TransformerEngine's rule): an
  // infinite scale quantized zeros to NaN (0 * inf) and the rest to 0.
  const auto tiny = volt::delayed_scale(torch::tensor({1e-38f}), prev, Fp8Format::kE4M3, o);
  EXPECT_EQ(tiny.item<float>(), std::numeric_limits<float>::max());
  const auto x = torch::tensor({0.f, 1e-38f, -2e-38f});
  const auto q = volt::fp8_round(x * tiny, Fp8Format::kE4M3) / tiny;
  EXPECT_FALSE(q.isnan().any().item<bool>()) << q;
  EXPECT_EQ(q[0].item<float>(), 0.f);
  EXPECT_THROW(volt::validate(volt::DelayedScalingOptions().amax_compute_algo("mean")),
               volt::ConfigError);
  EXPECT_THROW(volt::validate(volt::DelayedScalingOptions().amax_history_len(0)),
               volt::ConfigError);
  EXPECT_THROW(volt::validate(volt::DelayedScalingOptions().fp8_format("e5m2")), volt::ConfigError);
}

TEST(Fp8Linear, ForwardAndBackwardUseOperandsOnTheFp8GridWithDelayedScales) {
  torch::manual_seed(0);
  torch::nn::Linear ref(16, 8);
  volt::Fp8Linear lin(ref, volt::DelayedScalingOptions().amax_history_len(4));
  EXPECT_TRUE(torch::equal(lin->weight, ref->weight));
  auto q = [](const at::Tensor& t, float s, Fp8Format f) { return volt::fp8_round(t * s, f) / s; };
  // Step 0: empty history, scales 1.
  auto x = torch::randn({4, 16}) * 3;
  auto y = lin->forward(x);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  auto expect = torch::linear(q(x, 1, Fp8Format::kE4M3),
                              q(ref->weight.detach(), 1, Fp8Format::kE4M3), ref->bias.detach());
  EXPECT_TRUE(torch::equal(y, expect.to(at::kBFloat16)));
  auto g = torch::randn({4, 8});
  y.backward(g.to(at::kBFloat16));
  const auto gq = q(g.to(at::kBFloat16).to(at::kFloat), 1, Fp8Format::kE5M2);
  EXPECT_TRUE(
      torch::allclose(lin->weight.grad(), gq.t().mm(q(x, 1, Fp8Format::kE4M3)), 1e-5, 1e-5));
  // The bias gradient from the incoming gradient, not its fp8 image (Transformer Engine's
  // bgrad); before, gq.sum(0), off by up to E5M2's 12.5% per element.
  EXPECT_TRUE(
      torch::allclose(lin->bias.grad(), g.to(at::kBFloat16).to(at::kFloat).sum(0), 1e-5, 1e-5));
  // Step 1: the scales come from step 0's amax (delayed), e.g. input: 448 / max|x|.
  const float amax_x = x.abs().max().item<float>();
  auto x2 = torch::randn({4, 16});
  lin->forward(x2);
  EXPECT_FLOAT_EQ(lin->scales()[0].item<float>(), 448.f / amax_x);
  EXPECT_FLOAT_EQ(lin->scales()[2].item<float>(),
                  57344.f / g.to(at::kBFloat16).abs().max().item<float>());
  EXPECT_EQ(lin->steps.item<int64_t>(), 2);
  // Eval forwards record nothing.
  lin->eval();
  const auto hist = lin->amax_history.clone();
  lin->forward(x2);
  EXPECT_TRUE(torch::equal(lin->amax_history, hist));
}

// A layer called twice before one backward (a shared layer, two views of a batch): both nodes
// backpropagate (before, the first backward's write to the gradient amax failed the other's
// saved-tensor version check), the amax is the larger of the two, and a batch of no rows records
// nothing instead of failing in max().
TEST(Fp8Linear, TwoCallsBeforeOneBackwardAndAnEmptyBatchTrain) {
  torch::manual_seed(0);
  volt::Fp8Linear lin(torch::nn::Linear(16, 8), volt::DelayedScalingOptions().amax_history_len(4));
  const auto x1 = torch::randn({4, 16}), x2 = torch::randn({4, 16});
  const auto y1 = lin->forward(x1), y2 = lin->forward(x2);
  const auto g1 = torch::randn({4, 8}), g2 = torch::randn({4, 8}) * 5;
  ASSERT_NO_THROW(
      torch::autograd::backward({y1, y2}, {g1.to(at::kBFloat16), g2.to(at::kBFloat16)}));
  const float want = std::max(g1.to(at::kBFloat16).abs().max().item<float>(),
                              g2.to(at::kBFloat16).abs().max().item<float>());
  EXPECT_FLOAT_EQ(lin->grad_amax.item<float>(), want);
  // The next forward rolls it into the history and starts the next step's from 0.
  lin->forward(x1);
  EXPECT_FLOAT_EQ(lin->amax_history[2][-1].item<float>(), want);
  EXPECT_FLOAT_EQ(lin->grad_amax.item<float>(), 0.f);
  // No rows: an empty output and gradients, the history's maxima unchanged.
  const auto before = std::get<0>(lin->amax_history.max(1)).clone();
  const auto empty = torch::randn({0, 16}, torch::requires_grad());
  const auto y = lin->forward(empty);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{0, 8}));
  y.sum().backward();
  EXPECT_TRUE(torch::equal(std::get<0>(lin->amax_history.max(1)), before));
}

namespace {

class Fp8Classifier : public volt_test::TinyClassifier {
 public:
  explicit Fp8Classifier(bool fp8) : fp8_(fp8) {
    if (fp8) {
      f1 = register_module("f1", volt::Fp8Linear(fc1, volt::DelayedScalingOptions()));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = fp8_ ? f1->forward(x) : fc1->forward(x);
    return fc2->forward(torch::relu(h));
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto loss = torch::cross_entropy_loss(forward(b.input).to(at::kFloat), b.target);
    log("train_loss", loss);
    return loss;
  }
  void validation_step(const volt::Batch& b, int64_t) override {
    log("val_loss", torch::cross_entropy_loss(forward(b.input).to(at::kFloat), b.target));
  }
  volt::Fp8Linear f1{nullptr};
  bool fp8_;
};

}  // namespace

TEST(Fp8Linear, TrainsWithinToleranceOfBf16AndResumesExactly) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(512), val = volt_test::blobs(256, 8, 3);
  auto fit = [&](Fp8Classifier& m, int64_t epochs, const std::string& ckpt = "",
                 std::vector<std::shared_ptr<volt::Callback>> cbs = {}) {
    // The CPU policy is off, so the plain layers really compute in bf16 (it keeps them in fp32
    // where its probe finds bf16 slower: every size at one thread on this machine).
    volt::Trainer t(volt_test::quiet(dir.path)
                        .max_epochs(epochs)
                        .precision(std::make_shared<volt::MixedPrecision>(
                            volt::MixedPrecisionOptions().cpu_policy(false).read_env_lists(false)))
                        .callbacks(cbs));
    t.fit(m, volt_test::loader(train), volt_test::loader(val, 64, false), ckpt);
    return t.callback_metrics().at("val_loss");
  };
  torch::manual_seed(1);
  Fp8Classifier bf16(false);
  torch::manual_seed(1);
  Fp8Classifier fp8(true);
  const double l16 = fit(bf16, 3), l8 = fit(fp8, 3);
  std::printf("[ measured ] val_loss after 96 steps: bf16-mixed %.4f, fp8 (emulated) %.4f\n", l16,
              l8);
  EXPECT_LT(l16, 0.45);
  EXPECT_NEAR(l8, l16, 0.05);
  EXPECT_GT(fp8.f1->steps.item<int64_t>(), 90);

  // Resume: 1 epoch, then 2 more from last.ckpt, equals 3 straight (weights and fp8 state).
  auto last = [&] {
    return std::vector<std::shared_ptr<volt::Callback>>{std::make_shared<volt::ModelCheckpoint>(
        volt::ModelCheckpointOptions().dirpath(dir / "ckpt").save_last(true).save_top_k(0))};
  };
  {
    torch::manual_seed(1);
    Fp8Classifier first(true);
    fit(first, 1, "", last());
  }
  torch::manual_seed(7);  // different init: everything must come from the checkpoint
  Fp8Classifier resumed(true);
  fit(resumed, 3, "last", last());
  EXPECT_TRUE(torch::equal(resumed.f1->weight, fp8.f1->weight));
  EXPECT_TRUE(torch::equal(resumed.f1->amax_history, fp8.f1->amax_history));
  EXPECT_TRUE(torch::equal(resumed.f1->scale, fp8.f1->scale));
  EXPECT_TRUE(torch::equal(resumed.flat_params(), fp8.flat_params()));
}
