// `volt perf`: scans traces of real volt runs made to show each symptom (a starved loader, a
// tiny batch, an item() per step) and prints the matching advice, and none on a healthy run;
// bad input exits 2.

#include "cli/detail/perf_scan.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tiny.h"

namespace {

/// 64 -> 256 -> 2 MLP; optionally reads the loss on the host every step.
class Wide : public volt::Module {
 public:
  explicit Wide(bool read_loss) : read_loss_(read_loss) {
    fc1 = register_module("fc1", torch::nn::Linear(64, 256));
    fc2 = register_module("fc2", torch::nn::Linear(256, 2));
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto loss =
        torch::cross_entropy_loss(fc2->forward(torch::relu(fc1->forward(b.input))), b.target);
    if (read_loss_) last_loss = loss.item<double>();  // the symptom: a host read per step
    return loss;
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01))};
  }
  double last_loss = 0;

 private:
  bool read_loss_;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

/// A dataset whose samples are expensive to produce (a 128x128 matrix product per sample, like
/// decoding or augmenting in the loader): real work, no sleeping.
class SlowDataset : public volt::Dataset {
 public:
  explicit SlowDataset(int64_t n) : n_(n), w_(torch::eye(128) * 0.5) {}
  int64_t size() const override { return n_; }
  volt::Example get(int64_t index) const override {
    auto m = torch::tanh(w_.matmul(w_ + static_cast<double>(index % 7)));
    return {m.slice(0, 0, 1).slice(1, 0, 64).reshape({64}),
            torch::scalar_tensor(index % 2, torch::kLong)};
  }

 private:
  int64_t n_;
  torch::Tensor w_;
};

/// Fits `model` for 6 steps under a TorchProfiler (steps 2-4 kept) and returns the trace path.
std::string traced_fit(const volt_test::TempDir& dir, const std::string& name, volt::Module& model,
                       std::shared_ptr<volt::Dataset> data, int64_t batch) {
  auto prof = std::make_shared<volt::TorchProfiler>(
      volt::TorchProfilerOptions().dirpath(dir.path).filename(name));
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_steps(6)
                            .detect_nonfinite_loss(false)  // its own item() per step
                            .profiler(prof));
  trainer.fit(model, volt::DataLoader(data, volt::DataLoaderOptions(batch)));
  return prof->last_trace_path();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

volt::detail::PerfScan scan(const std::string& path) {
  return volt::detail::scan_trace(slurp(path), path);
}

bool advises(const volt::detail::PerfScan& s, const std::string& phrase) {
  for (const auto& a : s.advice) {
    if (a.find(phrase) != std::string::npos) return true;
  }
  return false;
}

TEST(PerfScan, EachSymptomGetsItsAdviceAndAHealthyRunNone) {
  volt_test::TempDir dir;
  Wide healthy_model(false), item_model(true), tiny_model(false), starved_model(false);
  const auto healthy =
      scan(traced_fit(dir, "healthy", healthy_model, volt_test::blobs(6 * 1024, 64), 1024));
  const auto item = scan(traced_fit(dir, "item", item_model, volt_test::blobs(6 * 1024, 64), 1024));
  const auto tiny = scan(traced_fit(dir, "tiny", tiny_model, volt_test::blobs(6, 64), 1));
  const auto starved =
      scan(traced_fit(dir, "starved", starved_model, std::make_shared<SlowDataset>(6 * 16), 16));

  for (const auto* s : {&healthy, &item, &tiny, &starved}) EXPECT_EQ(s->steps, 3);
  const auto all = [](const volt::detail::PerfScan& s) {
    std::string t;
    for (const auto& a : s.advice) t += a + "\n";
    return t;
  };
  // Healthy: a big batch, data in memory, no host reads.
  EXPECT_EQ(healthy.host_syncs, 0);
  EXPECT_FALSE(advises(healthy, "data loading")) << all(healthy);
  EXPECT_FALSE(advises(healthy, "host read")) << all(healthy);
  EXPECT_FALSE(advises(healthy, "increase the batch size")) << all(healthy);
  EXPECT_LT(healthy.data_share, 0.2);
  // item() per step: exactly one host read per kept step.
  EXPECT_EQ(item.host_syncs, 3);
  EXPECT_TRUE(advises(item, "1.0 host read(s) per step")) << all(item);
  EXPECT_FALSE(advises(item, "increase the batch size")) << all(item);
  // Tiny batch: per-op overhead dominates.
  EXPECT_TRUE(advises(tiny, "increase the batch size")) << all(tiny);
  EXPECT_LT(tiny.mean_op_us, healthy.mean_op_us);
  // Starved loader: most of the step is the batch fetch.
  EXPECT_GT(starved.data_share, 0.5);
  EXPECT_TRUE(advises(starved, "data loading takes")) << all(starved);
}

TEST(PerfScan, TheCliPrintsTheScanAndRejectsBadInput) {
  volt_test::TempDir dir;
  Wide model(true);
  const std::string trace = traced_fit(dir, "cli", model, volt_test::blobs(6 * 64, 64), 64);
  auto run = [](std::vector<std::string> args, std::string* out_text = nullptr) {
    args.insert(args.begin(), "volt");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    std::ostringstream out, err;
    volt::CliOptions o;
    o.out = &out;
    o.err = &err;
    const int code = volt::run_cli(static_cast<int>(argv.size()), argv.data(), o);
    if (out_text) *out_text = out.str() + err.str();
    return code;
  };
  std::string text;
  ASSERT_EQ(run({"perf", "--trace", trace}, &text), 0) << text;
  EXPECT_NE(text.find("perf scan of " + trace), std::string::npos) << text;
  EXPECT_NE(text.find("host read(s) per step"), std::string::npos) << text;
  EXPECT_NE(text.find("device time: none in this trace"), std::string::npos) << text;
  EXPECT_EQ(run({"perf", "--trace", dir / "missing.json"}, &text), 2);
  EXPECT_NE(text.find("[cli] perf: cannot read"), std::string::npos) << text;
  std::ofstream(dir / "not_trace.json") << "{\"a\": 1}";
  EXPECT_EQ(run({"perf", "--trace", dir / "not_trace.json"}, &text), 2);
  EXPECT_NE(text.find("is not a Chrome trace"), std::string::npos) << text;
  std::ofstream(dir / "broken.json") << "{\"traceEvents\": [";
  EXPECT_EQ(run({"perf", "--trace", dir / "broken.json"}, &text), 2);
  EXPECT_EQ(run({"perf"}, &text), 2);
  EXPECT_NE(text.find("perf needs one --trace FILE"), std::string::npos) << text;
}

}  // namespace
