// convert_to_fp8 / Fp8Autocast / Fp8Precision: converted torch::nn::Linear layers compute
// exactly as Fp8Linear does (bit for bit, forward, backward and scaling state), other linears
// keep autocast's policy, the skip list and 16-alignment rule, training through the Trainer
// within tolerance of bf16-mixed with exact resume, and the error paths.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <volt/volt.h>

#include "error_text.h"
#include "log_capture.h"
#include "tiny.h"

namespace {

struct TwoLayer : torch::nn::Module {
  TwoLayer() {
    fc1 = register_module("fc1", torch::nn::Linear(32, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 10));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

at::Tensor autocast_bf16(torch::nn::Linear l, const at::Tensor& x) {
  volt::AutocastGuard g(c10::kCPU, at::kBFloat16);
  return l(x);
}

}  // namespace

TEST(Fp8Convert, ConvertedLinearIsBitExactToFp8LinearForwardBackwardAndScaling) {
  torch::manual_seed(0);
  auto net = std::make_shared<TwoLayer>();
  const auto report = volt::convert_to_fp8(*net);
  ASSERT_EQ(report.converted, std::vector<std::string>{"fc1"});
  ASSERT_EQ(report.kept.size(), 1u);
  EXPECT_EQ(report.kept[0].first, "fc2");
  EXPECT_NE(report.kept[0].second.find("not multiples of 16"), std::string::npos);
  EXPECT_NE(report.str().find("fc2 (64x10 features"), std::string::npos) << report.str();
  EXPECT_TRUE(volt::is_fp8_converted(net->fc1->weight));
  EXPECT_FALSE(volt::is_fp8_converted(net->fc2->weight));

  volt::Fp8Linear ref(net->fc1);  // same weights, same default recipe
  for (int step = 0; step < 4; ++step) {
    auto x = torch::randn({8, 32}).mul_(step + 1).requires_grad_();
    auto xr = x.detach().clone().requires_grad_();
    at::Tensor y;
    {
      volt::Fp8Autocast fp8;
      y = net->fc1(x);
    }
    const at::Tensor yr = ref(xr);
    ASSERT_EQ(y.scalar_type(), at::kBFloat16);
    ASSERT_TRUE(torch::equal(y, yr)) << "step " << step;
    y.to(at::kFloat).pow(2).sum().backward();
    yr.to(at::kFloat).pow(2).sum().backward();
    ASSERT_TRUE(torch::equal(x.grad(), xr.grad()));
    ASSERT_TRUE(torch::equal(net->fc1->weight.grad(), ref->weight.grad()));
    ASSERT_TRUE(torch::equal(net->fc1->bias.grad(), ref->bias.grad()));
    const auto buffers = net->fc1->named_buffers();
    ASSERT_TRUE(torch::equal(buffers["fp8_amax_history"], ref->amax_history));
    ASSERT_TRUE(torch::equal(buffers["fp8_scale"], ref->scale));
    ASSERT_TRUE(torch::equal(buffers["fp8_steps"], ref->steps));
    torch::NoGradGuard no_grad;
    net->fc1->weight.sub_(net->fc1->weight.grad() * 0.01);
    ref->weight.sub_(ref->weight.grad() * 0.01);
    net->fc1->weight.mutable_grad().zero_();
    ref->weight.mutable_grad().zero_();
  }
  // The scales moved off their initial 1 (the history drives them).
  EXPECT_FALSE(torch::equal(net->fc1->named_buffers()["fp8_scale"], torch::ones({3})));
  // Converting again is a no-op for converted layers (state kept).
  const auto before = net->fc1->named_buffers()["fp8_amax_history"].clone();
  EXPECT_EQ(volt::convert_to_fp8(*net).converted, std::vector<std::string>{"fc1"});
  EXPECT_TRUE(torch::equal(net->fc1->named_buffers()["fp8_amax_history"], before));
}

namespace {

void save_state(const torch::nn::Module& m, const std::string& path) {
  torch::serialize::OutputArchive ar;
  volt::save_module_state(m, ar);
  ar.save_to(path);
}

void load_state(torch::nn::Module& m, const std::string& path) {
  torch::serialize::InputArchive ar;
  ar.load_from(path);
  volt::load_module_state(m, ar, /*strict=*/true);
}

bool same_weights(const torch::nn::Module& a, const torch::nn::Module& b) {
  auto pb = b.named_parameters(true);
  for (const auto& p : a.named_parameters(true)) {
    if (!torch::equal(p.value(), pb[p.key()])) return false;
  }
  return true;
}

}  // namespace

TEST(Fp8Convert, WeightsLoadAcrossFp8AndPlainModelsBothWaysAndBothFormats) {
  volt_test::TempDir dir;
  // An fp8-trained model: fc1 converted, its scaling state moved by a step.
  torch::manual_seed(0);
  auto fp8 = std::make_shared<TwoLayer>();
  volt::convert_to_fp8(*fp8);
  {
    volt::Fp8Autocast on;
    fp8->fc2(fp8->fc1(torch::randn({8, 32}))).to(at::kFloat).sum().backward();
  }
  ASSERT_TRUE(fp8->fc1->named_buffers()["fp8_steps"].item<int64_t>() > 0);
  save_state(*fp8, dir / "fp8.ckpt");
  volt::save_safetensors(*fp8, dir / "fp8.safetensors");

  // Into a plain model (export, predict in fp32): the weights, without the scaling state.
  for (const char* file : {"fp8.ckpt", "fp8.safetensors"}) {
    SCOPED_TRACE(file);
    torch::manual_seed(1);
    TwoLayer plain;
    const auto logs = volt_test::capture_logs([&] {
      if (std::string(file) == "fp8.ckpt") {
        load_state(plain, dir / file);
      } else {
        volt::load_weights(plain, dir / file);
      }
    });
    EXPECT_TRUE(same_weights(plain, *fp8));
    EXPECT_TRUE(volt_test::has(logs,
                               "the file holds fp8 scaling state (4 buffers) that this "
                               "model, not converted to fp8, does not use"))
        << logs.size();
  }

  // A plain checkpoint into a model converted to fp8 (fp8 fine-tuning or inference): the
  // weights, the scaling state starting fresh.
  torch::manual_seed(2);
  TwoLayer plain;
  save_state(plain, dir / "plain.ckpt");
  torch::manual_seed(3);
  auto converted = std::make_shared<TwoLayer>();
  volt::convert_to_fp8(*converted);
  const auto logs = volt_test::capture_logs([&] { load_state(*converted, dir / "plain.ckpt"); });
  EXPECT_TRUE(same_weights(*converted, plain));
  EXPECT_EQ(converted->fc1->named_buffers()["fp8_steps"].item<int64_t>(), 0);
  EXPECT_TRUE(volt_test::has(logs, "the model's fp8 layers start theirs fresh (4 buffers)"));

  // Both with fp8 state: it must match like any state (one buffer missing is a mismatch).
  {
    torch::serialize::OutputArchive ar;
    for (const auto& p : fp8->named_parameters(true)) ar.write(p.key(), p.value());
    for (const auto& b : fp8->named_buffers(true)) {
      if (b.key() != "fc1.fp8_steps") ar.write(b.key(), b.value(), /*is_buffer=*/true);
    }
    ar.save_to(dir / "partial.ckpt");
  }
  const std::string err = volt_test::error_of<volt::CheckpointError>(
      [&] { load_state(*converted, dir / "partial.ckpt"); });
  EXPECT_NE(err.find("missing 'fc1.fp8_steps'"), std::string::npos) << err;
}

TEST(Fp8Convert, OutsideRegionsAndInFp8FreeIslandsLayersAreOrdinary) {
  torch::manual_seed(1);
  auto net = std::make_shared<TwoLayer>();
  volt::convert_to_fp8(*net);
  const auto x = torch::randn({4, 32});
  // Outside any region: plain fp32 Linear.
  const auto y32 = net->fc1(x);
  EXPECT_EQ(y32.scalar_type(), at::kFloat);
  EXPECT_TRUE(torch::equal(y32, torch::linear(x, net->fc1->weight, net->fc1->bias)));
  const auto bf16 = autocast_bf16(net->fc1, x);  // the built-in autocast result
  volt::Fp8Autocast fp8;
  EXPECT_TRUE(volt::Fp8Autocast::is_enabled());
  {
    volt::Fp8Autocast island(c10::kCPU, /*enabled=*/false);
    EXPECT_FALSE(volt::Fp8Autocast::is_enabled());
    EXPECT_TRUE(torch::equal(net->fc1(x), bf16));  // bf16 autocast, not fp8
  }
  EXPECT_TRUE(volt::Fp8Autocast::is_enabled());
  const auto yfp8 = net->fc1(x);
  EXPECT_FALSE(torch::equal(yfp8, bf16));  // fp8 operands differ from bf16 ones
  // A layer that was not converted gets exactly what libtorch's autocast gives it.
  const auto h = torch::randn({4, 64});
  const auto ref = [&] {
    volt::AutocastGuard g(c10::kCPU, at::kBFloat16);
    return torch::linear(h.to(at::kBFloat16), net->fc2->weight.to(at::kBFloat16),
                         net->fc2->bias.to(at::kBFloat16));
  }();
  EXPECT_TRUE(torch::equal(net->fc2(h), ref));
  // release_fp8: the layer is ordinary again, in the region too.
  volt::release_fp8(*net);
  EXPECT_FALSE(volt::is_fp8_converted(net->fc1->weight));
  EXPECT_TRUE(torch::equal(net->fc1(x), bf16));
}

TEST(Fp8Convert, SkipListAndErrors) {
  auto net = std::make_shared<TwoLayer>();
  auto r = volt::convert_to_fp8(*net, volt::Fp8ConvertOptions().skip({"fc1"}));
  EXPECT_TRUE(r.converted.empty());
  ASSERT_EQ(r.kept.size(), 2u);
  EXPECT_EQ(r.kept[0], std::make_pair(std::string("fc1"), std::string("skipped by name")));
  try {
    volt::convert_to_fp8(*net, volt::Fp8ConvertOptions().skip({"head"}));
    FAIL() << "expected ConfigError";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"head\", which is not a Linear of this model; its "
                                         "Linear layers are: fc1, fc2"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(volt::convert_to_fp8(*net, volt::Fp8ConvertOptions().recipe(
                                              volt::DelayedScalingOptions().margin(-1))),
               volt::ConfigError);
  // A margin past fp8's exponent range: every value would quantize to 0 (about 130: NaN).
  EXPECT_NE(volt_test::error_of<volt::ConfigError>([&] {
              volt::convert_to_fp8(*net, volt::Fp8ConvertOptions().recipe(
                                             volt::DelayedScalingOptions().margin(200)));
            }).find("margin=200 must be in [0, 32]"),
            std::string::npos);
  // Re-converting with another history length clashes with the layer's existing state.
  auto other = std::make_shared<TwoLayer>();
  volt::convert_to_fp8(*other);
  volt::release_fp8(*other);
  EXPECT_THROW(volt::convert_to_fp8(*other, volt::Fp8ConvertOptions().recipe(
                                                volt::DelayedScalingOptions().amax_history_len(4))),
               volt::ConfigError);
  // Converted already, it is kept as it is: the same recipe again is fine, another one is a
  // ConfigError (it would be ignored).
  auto twice = std::make_shared<TwoLayer>();
  volt::convert_to_fp8(*twice);
  EXPECT_EQ(volt::convert_to_fp8(*twice).converted, (std::vector<std::string>{"fc1"}));
  try {
    volt::convert_to_fp8(*twice,
                         volt::Fp8ConvertOptions().recipe(volt::DelayedScalingOptions().margin(1)));
    FAIL() << "expected ConfigError";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("[Fp8] 'fc1' is converted already with "
                                         "DelayedScalingOptions(margin=0"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("call release_fp8(model) first"), std::string::npos);
  }
  volt::release_fp8(*twice);
  // A model that is a Linear itself: nothing inside it to convert, which is said.
  torch::nn::Linear lone(16, 16);
  try {
    volt::convert_to_fp8(*lone);
    FAIL() << "expected ConfigError";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("[Fp8] the model is a Linear itself"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(volt::Fp8Autocast g(c10::kCUDA), volt::NotAvailable);
  volt::Fp8Precision p;
  EXPECT_THROW(p.setup(c10::Device(c10::kCUDA, 0)), volt::NotAvailable);
  EXPECT_THROW(volt::Fp8Precision(volt::Fp8PrecisionOptions().quant(true)), volt::ConfigError);
  EXPECT_THROW(volt::Fp8Precision(
                   volt::Fp8PrecisionOptions().mixed(volt::MixedPrecisionOptions().dtype("fp16"))),
               volt::ConfigError);
}

TEST(Fp8Precision, OtherLinearsFollowTheRunsAutocastPolicyAndTeardownRestoresIt) {
  torch::manual_seed(2);
  auto net = std::make_shared<TwoLayer>();
  volt::Fp8Precision p(volt::Fp8PrecisionOptions().mixed(
      volt::MixedPrecisionOptions().fp32_ops({"addmm"}).cpu_policy(false).read_env_lists(false)));
  p.setup(c10::Device(c10::kCPU));
  p.convert_module(*net);
  const auto x = torch::randn({4, 32}), h = torch::randn({4, 64});
  at::Tensor y1, y2;
  {
    auto ctx = p.forward_context();
    y1 = net->fc1(x);
    y2 = net->fc2(h);
  }
  EXPECT_EQ(y1.scalar_type(), at::kBFloat16);  // fp8 layer: bf16 out
  EXPECT_EQ(y2.scalar_type(), at::kFloat);     // addmm (Linear on 2-D input) is in the fp32 list
  EXPECT_TRUE(torch::equal(y2, torch::linear(h, net->fc2->weight, net->fc2->bias)));
  p.teardown();
  // Back to libtorch's own policy: autocast lowers linear to bf16.
  EXPECT_EQ(autocast_bf16(net->fc2, h).scalar_type(), at::kBFloat16);
}

namespace {

// 16 -> 32 -> 2: fc1 is fp8, the head stays bf16 (2 outputs).
class BlobNet : public volt::Module {
 public:
  BlobNet() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    head = register_module("head", torch::nn::Linear(32, 2));
  }
  at::Tensor forward(const at::Tensor& x) { return head(torch::relu(fc1(x))); }
  at::Tensor training_step(const volt::Batch& b, int64_t) override {
    return torch::cross_entropy_loss(forward(b.input).to(at::kFloat), b.target);
  }
  void validation_step(const volt::Batch& b, int64_t) override {
    log("val_loss", torch::cross_entropy_loss(forward(b.input).to(at::kFloat), b.target));
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-2))};
  }
  torch::nn::Linear fc1{nullptr}, head{nullptr};
};

}  // namespace

TEST(Fp8Precision, TrainerTrainsWithinToleranceOfBf16AndResumesExactly) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(512, 16), val = volt_test::blobs(256, 16, 3);
  auto fit = [&](BlobNet& m, volt::Spec<volt::Precision> precision, int64_t epochs,
                 const std::string& ckpt = "",
                 std::vector<std::shared_ptr<volt::Callback>> cbs = {}) {
    volt::Trainer t(
        volt_test::quiet(dir.path).max_epochs(epochs).precision(precision).callbacks(cbs));
    t.fit(m, volt_test::loader(train), volt_test::loader(val, 64, false), ckpt);
    return t.callback_metrics().at("val_loss");
  };
  torch::manual_seed(1);
  BlobNet bf16;
  torch::manual_seed(1);
  BlobNet fp8;
  // The baseline turns the CPU policy off, so it really computes in bf16 (the policy keeps GEMMs
  // in fp32 where its probe finds bf16 slower: every size at one thread on this machine).
  const double l16 = fit(bf16,
                         std::make_shared<volt::MixedPrecision>(
                             volt::MixedPrecisionOptions().cpu_policy(false).read_env_lists(false)),
                         3);
  const double l8 = fit(fp8, std::make_shared<volt::Fp8Precision>(), 3);
  std::printf("[ measured ] val_loss after 96 steps: bf16-mixed %.4f, fp8 (converted) %.4f\n", l16,
              l8);
  EXPECT_LT(l16, 0.45);
  EXPECT_NEAR(l8, l16, 0.05);
  auto steps = fp8.fc1->named_buffers()["fp8_steps"];
  EXPECT_GE(steps.item<int64_t>(), 96);             // every training forward went through fp8
  EXPECT_EQ(fp8.head->named_buffers().size(), 0u);  // the head was not converted

  auto last = [&] {
    return std::vector<std::shared_ptr<volt::Callback>>{std::make_shared<volt::ModelCheckpoint>(
        volt::ModelCheckpointOptions().dirpath(dir / "ckpt").save_last(true).save_top_k(0))};
  };
  {
    torch::manual_seed(1);
    BlobNet first;
    fit(first, std::make_shared<volt::Fp8Precision>(), 1, "", last());
  }
  torch::manual_seed(7);  // different init: everything must come from the checkpoint
  BlobNet resumed;
  fit(resumed, "fp8", 3, "last", last());
  EXPECT_TRUE(torch::equal(resumed.fc1->weight, fp8.fc1->weight));
  EXPECT_TRUE(torch::equal(resumed.head->weight, fp8.head->weight));
  for (const char* b : {"fp8_amax_history", "fp8_scale", "fp8_grad_amax", "fp8_steps"}) {
    EXPECT_TRUE(torch::equal(resumed.fc1->named_buffers()[b], fp8.fc1->named_buffers()[b])) << b;
  }
}

// One Trainer fitting two models converts each at its set-up: the second fit trained its model
// unconverted (in bf16), since the precision remembered converting the first.
TEST(Fp8Precision, EachFitOfOneTrainerConvertsItsModel) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(64, 16);
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(1).precision("fp8"));
  torch::manual_seed(1);
  BlobNet first, second;
  t.fit(first, volt_test::loader(train));
  EXPECT_TRUE(volt::is_fp8_converted(first.fc1->weight));
  t.fit(second, volt_test::loader(train));
  EXPECT_TRUE(volt::is_fp8_converted(second.fc1->weight));
  EXPECT_GE(second.fc1->named_buffers()["fp8_steps"].item<int64_t>(), 2);
}
