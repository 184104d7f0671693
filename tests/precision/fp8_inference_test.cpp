// fp8 inference: the quantization config and its errors, quantization from a measurements file
// (bit-exact to the hand-computed fp8 reference; every way a file can be wrong), and the
// measurement step (statistics equal the directly computed max-abs; measuring and quantizing in
// one process is refused). The two-process flow on Fashion-MNIST through the CLI is in
// tests/integration/fp8_inference_test.cpp.
//
// Order matters when the whole binary runs in one process (ctest runs each test alone): the
// measuring test marks the process as a measuring one, so it comes last in this file.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <volt/volt.h>

#include <fstream>
#include <functional>
#include <sstream>

#include "error_text.h"
#include "file_text.h"
#include "tiny.h"

namespace {

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(32, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 10));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string error_of(const std::function<void()>& f) {
  return volt_test::error_of<volt::ConfigError>(f);
}

const char* kMeasurements = R"({"format": "volt-fp8-measurements", "version": 1,
  "observer": "maxabs", "modules": {
  "fc1": {"type": "Linear", "in_features": 32, "out_features": 64, "input": 4.0, "weight": 0.5,
          "output": 9.0},
  "fc2": {"type": "Linear", "in_features": 64, "out_features": 10, "input": 3.0, "weight": 0.25,
          "output": 2.0}}})";

// What a quantized Linear computes: input and weight on the E4M3 grid under their scales, the
// product in fp32, returned in bf16.
at::Tensor fp8_linear_reference(const at::Tensor& x, const torch::nn::Linear& layer,
                                float input_scale, float weight_scale) {
  const auto q = [](const at::Tensor& t, float s) {
    return volt::fp8_round(t * s, volt::Fp8Format::kE4M3) / s;
  };
  return torch::linear(q(x, input_scale), q(layer->weight.detach(), weight_scale),
                       layer->bias.detach())
      .to(at::kBFloat16);
}

// `net`'s fc1 quantized from `measurements` (fc2 blocklisted).
void quantize_fc1(Net& net, const std::string& measurements) {
  const auto cfg = volt::QuantConfig()
                       .mode(volt::QuantConfig::kQuantize)
                       .dump_stats_path(measurements)
                       .blocklist_names({"fc2"});
  const auto report = volt::quantize_fp8(net, cfg);
  EXPECT_EQ(report.converted, std::vector<std::string>{"fc1"});
  ASSERT_EQ(report.kept.size(), 1u);
  EXPECT_EQ(report.kept[0].first, "fc2");
}

}  // namespace

TEST(QuantConfig, ParsesTheReferenceKeysAndRejectsBadOnes) {
  const auto c = volt::QuantConfig::parse(
      R"({"method": "HOOKS", "mode": "QUANTIZE", "observer": "maxabs",
          "scale_method": "maxabs_pow2", "dump_stats_path": "out/stats",
          "allowlist": {"names": ["fc1"], "types": ["Linear"]},
          "blocklist": {"names": ["fc2"], "types": []}})",
      "test");
  EXPECT_EQ(c.mode(), volt::QuantConfig::kQuantize);
  EXPECT_EQ(c.scale_method(), "maxabs_pow2");
  EXPECT_EQ(c.measurements_file(), "out/stats.json");
  EXPECT_EQ(c.allowlist_names(), std::vector<std::string>{"fc1"});
  EXPECT_EQ(c.blocklist_names(), std::vector<std::string>{"fc2"});
  EXPECT_EQ(volt::QuantConfig().dump_stats_path("a.json").measurements_file(), "a.json");

  auto bad = [](const std::string& json) {
    return error_of([&] { volt::QuantConfig::parse(json, "cfg"); });
  };
  EXPECT_NE(bad("{\"mode\": ").find("[Fp8Inference] cfg: malformed JSON"), std::string::npos);
  EXPECT_NE(bad("{\"mode\": ").find("point QUANT_CONFIG at another one."), std::string::npos);
  // Bounded as every file volt reads: nesting past 128 levels is refused while parsing.
  const std::string deep = std::string(200, '[') + std::string(200, ']');
  EXPECT_NE(
      bad(R"({"allowlist": )" + deep + "}").find("cfg: arrays and objects nest more than 128"),
      std::string::npos);
  EXPECT_NE(bad("[1]").find("must hold a JSON object"), std::string::npos);
  EXPECT_NE(bad(R"({"modee": "MEASURE"})").find("unknown key \"modee\"; the keys are mode"),
            std::string::npos);
  EXPECT_NE(bad(R"({"mode": "CALIBRATE"})").find("not one of MEASURE, QUANTIZE"),
            std::string::npos);
  EXPECT_NE(bad(R"({"mode": 1})").find("\"mode\" must be a string"), std::string::npos);
  EXPECT_NE(bad(R"({"observer": "minmax"})").find("use \"maxabs\""), std::string::npos);
  EXPECT_NE(bad(R"({"scale_method": "act_maxabs"})").find("scale_method \"act_maxabs\""),
            std::string::npos);
  EXPECT_NE(bad(R"({"allowlist": {"types": ["Conv2d"]}})").find("\"Linear\" layers only"),
            std::string::npos);
  EXPECT_NE(bad(R"({"blocklist": {"names": "fc1"}})").find("list of strings"), std::string::npos);
  EXPECT_NE(bad(R"({"blocklist": {"regex": []}})").find("not \"regex\""), std::string::npos);
  EXPECT_NE(error_of([] {
              volt::QuantConfig::from_file("/nonexistent/q.json");
            }).find("cannot read the quantization config \"/nonexistent/q.json\""),
            std::string::npos);
}

TEST(Fp8Quantize, LayersComputeOnTheE4m3GridUnderTheMeasuredScales) {
  volt_test::TempDir dir;
  write(dir / "m.json", kMeasurements);
  torch::manual_seed(3);
  auto net = std::make_shared<Net>();
  quantize_fc1(*net, dir / "m.json");

  const auto x = torch::randn({8, 32}) * 2;
  const auto h = torch::randn({8, 64});
  at::Tensor y, y2;
  {
    torch::NoGradGuard no_grad;
    volt::Fp8Autocast fp8;
    y = net->fc1(x);
    y2 = net->fc2(h);
  }
  // maxabs_hw: input scale 448 / 4 = 112, weight scale 448 / 0.5 = 896.
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(torch::equal(y, fp8_linear_reference(x, net->fc1, 112.f, 896.f)));
  // Blocklisted: plain bf16 autocast.
  volt::AutocastGuard bf16(c10::kCPU);
  EXPECT_TRUE(torch::equal(y2, net->fc2(h)));
}

// A non-finite max-abs is written as null (JSON has no inf or NaN) and quantizes with scale 1;
// the null made quantizing fail with "lacks the number", and measuring again failed the same way.
TEST(Fp8Quantize, ANullMeasurementQuantizesWithScaleOne) {
  volt_test::TempDir dir;
  std::string text = kMeasurements;
  const std::string input = "\"input\": 4.0";
  text.replace(text.find(input), input.size(), "\"input\": null");
  write(dir / "m.json", text);
  torch::manual_seed(3);
  auto net = std::make_shared<Net>();
  quantize_fc1(*net, dir / "m.json");
  const auto x = torch::randn({8, 32}) * 2;
  at::Tensor y;
  {
    torch::NoGradGuard no_grad;
    volt::Fp8Autocast fp8;
    y = net->fc1(x);
  }
  // Input scale 1, weight scale 448 / 0.5 = 896.
  EXPECT_TRUE(torch::equal(y, fp8_linear_reference(x, net->fc1, 1.f, 896.f)));
}

TEST(Fp8Quantize, PowerOfTwoScales) {
  volt_test::TempDir dir;
  write(dir / "m.json", kMeasurements);
  auto net = std::make_shared<Net>();
  volt::quantize_fp8(*net, volt::QuantConfig()
                               .mode(volt::QuantConfig::kQuantize)
                               .scale_method("maxabs_pow2")
                               .dump_stats_path(dir / "m.json"));
  const auto x = torch::randn({4, 64});
  torch::NoGradGuard no_grad;
  at::Tensor y;
  {
    volt::Fp8Autocast fp8;
    y = net->fc2(x);
  }
  // fc2: 448 / 3 = 149.3 -> 128; 448 / 0.25 = 1792 -> 1024.
  EXPECT_TRUE(torch::equal(y, fp8_linear_reference(x, net->fc2, 128.f, 1024.f)));
}

TEST(Fp8Quantize, EveryWayTheMeasurementsCanBeWrongIsAClearError) {
  volt_test::TempDir dir;
  auto net = std::make_shared<Net>();
  auto quantize = [&](const std::string& text, volt::QuantConfig cfg = volt::QuantConfig()) {
    write(dir / "m.json", text);
    return error_of([&] {
      volt::quantize_fp8(*net,
                         cfg.mode(volt::QuantConfig::kQuantize).dump_stats_path(dir / "m.json"));
    });
  };
  EXPECT_NE(quantize("{\"format\": ").find("m.json\": malformed JSON"), std::string::npos);
  EXPECT_NE(quantize("{\"format\": ").find("re-run the measurement step."), std::string::npos);
  EXPECT_NE(quantize(R"({"modules": )" + std::string(300, '[') + std::string(300, ']') + "}")
                .find("nest more than 128 levels"),
            std::string::npos);
  EXPECT_NE(quantize(R"({"modules": {}})").find("is not a volt fp8 measurements file"),
            std::string::npos);
  // A "format" that is not a string (nlohmann's type_error escaped before session 22).
  EXPECT_NE(quantize(R"({"format": 3, "modules": {}})").find("is not a volt fp8 measurements file"),
            std::string::npos);
  std::string other = kMeasurements;
  other.replace(other.find("\"fc2\""), 5, "\"enc.fc9\"");
  EXPECT_NE(quantize(other).find("holds measurements of layer \"enc.fc9\", which this model does "
                                 "not have: it was measured on another model"),
            std::string::npos);
  std::string one = R"({"format": "volt-fp8-measurements", "modules": {"fc1": {"type": "Linear",
      "in_features": 32, "out_features": 64, "input": 1, "weight": 1, "output": 1}}})";
  EXPECT_NE(quantize(one).find("layer \"fc2\" (Linear 64->10) has no measurement"),
            std::string::npos);
  // ... which blocklisting the layer resolves.
  EXPECT_EQ(quantize(one, volt::QuantConfig().blocklist_names({"fc2"})), "");  // no error
  std::string shape = kMeasurements;
  shape.replace(shape.find("\"in_features\": 32"), 17, "\"in_features\": 48");
  EXPECT_NE(quantize(shape).find("measured it as 48->64: the file belongs to another model"),
            std::string::npos);
  EXPECT_NE(quantize(kMeasurements, volt::QuantConfig().allowlist_names({"fc3"}))
                .find("the allowlist names \"fc3\", which is not a Linear of this model"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] {
        volt::quantize_fp8(
            *net,
            volt::QuantConfig().mode(volt::QuantConfig::kQuantize).dump_stats_path(dir / "absent"));
      }).find("absent.json\" cannot be read; run the measurement step first"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              volt::quantize_fp8(*net, volt::QuantConfig());
            }).find("needs a config with mode QUANTIZE"),
            std::string::npos);
}

TEST(Fp8Precision, QuantConfigFromOptionOrEnvironmentMustAgreeWithQuant) {
  volt_test::TempDir dir;
  write(dir / "q.json", R"({"mode": "QUANTIZE", "dump_stats_path": "x"})");
  write(dir / "bad.json", R"({"mode": "QUANTIZE", "dump_stats_path": )");
  using O = volt::Fp8PrecisionOptions;
  EXPECT_EQ(volt::Fp8Precision(O().inference(true).quant(true).quant_config(dir / "q.json"))
                .quant_config(true)
                .dump_stats_path(),
            "x");
  EXPECT_NE(error_of([&] {
              volt::Fp8Precision(O().inference(true).quant_config(dir / "q.json"));
            }).find("has mode QUANTIZE but quant=false asks for MEASURE"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              volt::Fp8Precision(O().inference(true).quant_config(dir / "bad.json"));
            }).find("bad.json\": malformed JSON"),
            std::string::npos);
  ::setenv("QUANT_CONFIG", (dir / "q.json").c_str(), 1);
  EXPECT_EQ(
      volt::Fp8Precision(O().inference(true).quant(true)).quant_config(true).dump_stats_path(),
      "x");
  ::unsetenv("QUANT_CONFIG");
  EXPECT_EQ(volt::Fp8Precision(O().inference(true)).quant_config(false).dump_stats_path(),
            "fp8_measurements.json");
}

// One Trainer predicting two models quantizes both: the inference conversion stays on the first
// model after its run, and the second was left unconverted (plain bf16) before session 98.
TEST(Fp8Precision, ASecondPredictOfAnotherModelIsQuantizedToo) {
  struct Predictor : volt::Module {
    Predictor() {
      fc1 = register_module("fc1", torch::nn::Linear(32, 64));
      fc2 = register_module("fc2", torch::nn::Linear(64, 10));
    }
    torch::Tensor predict_step(const volt::Batch& b, int64_t) override {
      return fc2(torch::relu(fc1(b.input)));
    }
    torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
      return predict_step(b, i).sum();
    }
    std::vector<volt::OptimizerConfig> configure_optimizers() override { return {}; }
    torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  };
  volt_test::TempDir dir;
  write(dir / "m.json", kMeasurements);
  write(dir / "q.json", R"({"mode": "QUANTIZE", "dump_stats_path": ")" + (dir / "m.json") + "\"}");
  auto precision = std::make_shared<volt::Fp8Precision>(
      volt::Fp8PrecisionOptions().inference(true).quant(true).quant_config(dir / "q.json"));
  volt::Trainer t(volt_test::quiet(dir.path).precision(precision));
  Predictor a, b;
  const auto data = volt_test::loader(volt_test::blobs(32, 32), 16, false);
  t.predict(a, data);
  EXPECT_TRUE(volt::is_fp8_converted(a.fc1->weight));
  t.predict(b, data);
  EXPECT_TRUE(volt::is_fp8_converted(b.fc1->weight));
  EXPECT_TRUE(volt::is_fp8_converted(b.fc2->weight));
  t.predict(a, data);  // the first model again: converted once, still quantized
  EXPECT_TRUE(volt::is_fp8_converted(a.fc2->weight));
}

// Last in the file: it makes this process a measuring one.
TEST(Fp8Measure, StatisticsAreTheMaxAbsOverBatchesAndQuantizingHereIsRefused) {
  volt_test::TempDir dir;
  torch::manual_seed(4);
  auto net = std::make_shared<Net>();
  auto fc3 = std::make_shared<Net>();  // another model, for the refused quantization
  const auto cfg = volt::QuantConfig().dump_stats_path(dir / "stats");
  const auto report = volt::prepare_fp8_measurement(*net, cfg);
  EXPECT_EQ(report.converted, (std::vector<std::string>{"fc1", "fc2"}));
  EXPECT_NE(error_of([&] { volt::save_fp8_measurements(*net, cfg); }).find("no forward ran"),
            std::string::npos);
  auto forward = [&](const at::Tensor& x) { return net->fc2(torch::relu(net->fc1(x))); };
  float in1 = 0, out1 = 0, in2 = 0, out2 = 0;
  for (int i = 0; i < 3; ++i) {
    const auto x = torch::randn({8, 32}) * (i + 1);
    torch::NoGradGuard no_grad;
    at::Tensor y, ref, a1, h;
    {
      volt::AutocastGuard bf16(c10::kCPU);  // plain bf16 autocast, step by step
      a1 = net->fc1(x);
      h = torch::relu(a1);
      ref = net->fc2(h);
    }
    {
      volt::Fp8Autocast fp8;
      y = forward(x);
    }
    EXPECT_TRUE(torch::equal(y, ref));  // observing does not change results
    in1 = std::max(in1, x.abs().max().item<float>());
    out1 = std::max(out1, a1.abs().max().to(at::kFloat).item<float>());
    in2 = std::max(in2, h.abs().max().to(at::kFloat).item<float>());
    out2 = std::max(out2, y.abs().max().to(at::kFloat).item<float>());
  }
  EXPECT_EQ(volt::save_fp8_measurements(*net, cfg), 2);
  const std::string text = volt_test::file_text(dir / "stats.json");
  // The file is JSON the quantize step reads; check the numbers through a parse of our own.
  auto number_after = [&](const std::string& layer, const std::string& key) {
    const auto at = text.find("\"" + key + "\"", text.find("\"" + layer + "\""));
    return std::stod(text.substr(text.find(':', at) + 1));
  };
  EXPECT_EQ(static_cast<float>(number_after("fc1", "input")), in1);
  EXPECT_EQ(static_cast<float>(number_after("fc1", "weight")),
            net->fc1->weight.abs().max().item<float>());
  EXPECT_EQ(static_cast<float>(number_after("fc1", "output")), out1);
  EXPECT_EQ(static_cast<float>(number_after("fc2", "input")), in2);
  EXPECT_EQ(static_cast<float>(number_after("fc2", "output")), out2);
  EXPECT_EQ(number_after("fc1", "forwards"), 3);
  EXPECT_NE(text.find("\"format\": \"volt-fp8-measurements\""), std::string::npos);

  EXPECT_NE(error_of([&] {
              volt::quantize_fp8(*fc3, volt::QuantConfig(cfg).mode(volt::QuantConfig::kQuantize));
            }).find("this process ran the fp8 measurement; quantization must run in a new process"),
            std::string::npos);
  // A model that is a Linear itself has no Linear inside to observe: said, not skipped.
  torch::nn::Linear lone(32, 64);
  EXPECT_NE(error_of([&] {
              volt::prepare_fp8_measurement(*lone, cfg);
            }).find("[Fp8Inference] the model is a Linear itself"),
            std::string::npos);
}
