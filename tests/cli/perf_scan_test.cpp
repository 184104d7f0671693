// `volt perf`: scans traces of real volt runs made to show each symptom (a starved loader, a
// tiny batch, an item() per step) and prints the matching advice, and none on a healthy run;
// bad input exits 2.

#include "cli/detail/perf_scan.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "build_paths.h"
#include "file_text.h"
#include "tiny.h"
#include "volt/core/errors.h"

namespace {

using volt_test::file_text;

/// 64 -> hidden -> 2 MLP; optionally reads the loss on the host every step.
class Wide : public volt::Module {
 public:
  explicit Wide(bool read_loss, int64_t hidden = 256) : read_loss_(read_loss) {
    fc1 = register_module("fc1", torch::nn::Linear(64, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 2));
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
  // 256 x 256 products: at 128 its share of the step was 0.35 once under ctest -j2 (the test
  // asks for more than half), since both sides slow down on a loaded machine but not alike.
  explicit SlowDataset(int64_t n) : n_(n), w_(torch::eye(256) * 0.5) {}
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

volt::detail::PerfScan scan(const std::string& path) {
  return volt::detail::scan_trace(file_text(path), path);
}

std::string format_scan_text(const volt::detail::PerfScan& s) {
  return volt::detail::format_scan(s, "trace");
}

bool advises(const volt::detail::PerfScan& s, const std::string& phrase) {
  for (const auto& a : s.advice) {
    if (a.find(phrase) != std::string::npos) return true;
  }
  return false;
}

TEST(PerfScan, EachSymptomGetsItsAdviceAndAHealthyRunNone) {
  volt_test::TempDir dir;
  // The big-batch runs are wide enough that their mean op time stays far above the tiny-op
  // threshold (20 us) on a loaded machine: at 256 wide, item()'s extra small ops once brought
  // it to 14.8 us under ctest -j2.
  Wide healthy_model(false, 2048), item_model(true, 2048), tiny_model(false), starved_model(false);
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
  EXPECT_TRUE(advises(tiny, "increase the batch size"))
      << all(tiny) << "ops=" << tiny.ops << " steps=" << tiny.steps
      << " mean_op_us=" << tiny.mean_op_us;
  EXPECT_LT(tiny.mean_op_us, healthy.mean_op_us);
  // Starved loader: most of the step is the batch fetch.
  EXPECT_GT(starved.data_share, 0.5);
  EXPECT_TRUE(advises(starved, "data loading takes")) << all(starved);
}

// A real trace of PyTorch's own profiler: tools/pytorch_trace_fixture.py (Debian's torch 1.13,
// built without kineto, so the autograd profiler's legacy format: no "cat", pid "CPU functions",
// PyTorch's record_function names with a '#'), three steps of an MLP reading loss.item() each.
TEST(PerfScan, ReadsARealPyTorchProfilerTrace) {
  const std::string path =
      volt_test::source_dir() + "/tests/cli/data/pytorch_1.13_cpu.pt.trace.json";
  const std::string text = file_text(path);
  ASSERT_FALSE(text.empty()) << path;
  const auto s = volt::detail::scan_trace(text, path);
  // What the shares must be, summed straight from the file's events.
  const nlohmann::json j = nlohmann::json::parse(text);
  double steps_us = 0, fetch_us = 0, optim_us = 0;
  for (const auto& e : j) {
    const std::string n = e.at("name");
    if (n.rfind("ProfilerStep#", 0) == 0) steps_us += e.at("dur").get<double>();
    if (n.rfind("enumerate(DataLoader)#", 0) == 0) fetch_us += e.at("dur").get<double>();
    if (n.rfind("Optimizer.step#", 0) == 0) optim_us += e.at("dur").get<double>();
  }
  EXPECT_EQ(s.steps, 3);
  EXPECT_DOUBLE_EQ(s.step_time_us, steps_us);
  EXPECT_NEAR(s.data_share, fetch_us / steps_us, 1e-12);
  EXPECT_NEAR(s.optimizer_share, optim_us / steps_us, 1e-12);
  EXPECT_GT(s.data_share, 0.0);
  EXPECT_GT(s.optimizer_share, 0.0);
  // item() is aten::item -> aten::_local_scalar_dense: one host read per step, counted once.
  EXPECT_EQ(s.host_syncs, 3);
  EXPECT_EQ(s.nonfinite_check_syncs, 0);
  EXPECT_TRUE(advises(s, "1.0 host read(s) per step")) << format_scan_text(s);
  // Ops are counted and timed; PyTorch's own spans (name#...) are regions, not ops.
  EXPECT_GT(s.ops, 100);
  EXPECT_GT(s.mean_op_us, 0.0);
  ASSERT_FALSE(s.top_ops.empty());
  for (const auto& t : s.top_ops) EXPECT_EQ(t.first.find('#'), std::string::npos) << t.first;
  EXPECT_EQ(s.device_time_us, 0.0);
  EXPECT_EQ(s.collective_share, 0.0);
}

// kineto's format (the PyTorch profiler with kineto, not in Debian's build): categories, string
// ids, device streams, Python stacks and the whole-trace span. Events simulated in the style of
// torch-tb-profiler's own tests (tb_plugin/test/test_profiler.py), as no kineto trace can be
// made here.
TEST(PerfScan, ReadsKinetoCategoriesAndStringIds) {
  const std::string text = R"json({"schemaVersion": 1, "traceEvents": [
    {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
     "tid": "PyTorch Profiler", "ts": 0, "dur": 1000},
    {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 7, "tid": "123", "ts": 50,
     "dur": 400},
    {"ph": "X", "cat": "python_function", "name": "train.py(12): step", "pid": 7, "tid": "123",
     "ts": 50, "dur": 400},
    {"ph": "X", "cat": "user_annotation",
     "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "pid": 7,
     "tid": "123", "ts": 100, "dur": 180},
    {"ph": "X", "cat": "Operator", "name": "aten::to", "pid": 7, "tid": "123", "ts": 200,
     "dur": 60},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 7, "tid": "123",
     "ts": 300, "dur": 20},
    {"ph": "X", "cat": "cpu_op", "name": "aten::nll_loss_backward", "pid": 7, "tid": "456",
     "ts": 340, "dur": 70},
    {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": "456", "ts": 405,
     "dur": 5},
    {"ph": "X", "cat": "kernel", "name": "void nll_kernel<float>", "pid": 0, "tid": "stream 7",
     "ts": 430, "dur": 15},
    {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": "stream 7", "ts": 405,
     "dur": 10},
    {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": "stream 7",
     "ts": 420, "dur": 5},
    {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 0, "tid": "stream 7", "ts": 430}
  ]})json";
  const auto s = volt::detail::scan_trace(text, "kineto.json");
  EXPECT_EQ(s.steps, 1);
  EXPECT_DOUBLE_EQ(s.step_time_us, 400);
  EXPECT_DOUBLE_EQ(s.data_share, 180.0 / 400);
  EXPECT_DOUBLE_EQ(s.device_time_us, 30);  // kernel + memcpy + memset
  EXPECT_EQ(s.ops, 2);                     // aten::to, aten::nll_loss_backward; runtime is not
  EXPECT_EQ(s.host_syncs, 1);              // cudaStreamSynchronize
  // The main thread ("123") is covered by the fetch (180) and the sync (20): the Python stack
  // and the whole-trace span cover nothing.
  EXPECT_DOUBLE_EQ(s.idle_share, 0.5);
  EXPECT_NE(volt::detail::format_scan(s, "kineto.json").find("device time: 0.030 ms"),
            std::string::npos)
      << volt::detail::format_scan(s, "kineto.json");
}

// Events whose fields have other types than the trace-event spec's are skipped, not an escaping
// nlohmann::type_error ({"ph": 1} made value("ph", "") throw before session 22).
TEST(PerfScan, EventsWithFieldsOfTheWrongTypeAreSkipped) {
  const std::string text = R"json({"traceEvents": [
    {"ph": 1, "name": "aten::add", "ts": 0, "dur": 5},
    {"ph": "X", "name": 7, "cat": ["cpu_op"], "ts": 0, "dur": 5},
    {"ph": "X", "name": "aten::mul", "cat": {"x": 1}, "ts": "10", "dur": 5},
    {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 10, "dur": 30, "pid": [1], "tid": null}
  ]})json";
  const auto s = volt::detail::scan_trace(text, "odd.json");
  EXPECT_EQ(s.steps, 0);
  // The unnamed op (0-5 us) and aten::mm (10-40 us): the complete events with numeric times.
  EXPECT_DOUBLE_EQ(s.step_time_us, 40);
  ASSERT_FALSE(s.top_ops.empty());
  EXPECT_EQ(s.top_ops.front().first, "aten::mm");
  try {
    volt::detail::scan_trace(R"({"traceEvents": [{"ph": 1}, {"ph": "X", "name": 2}]})", "b.json");
    FAIL() << "a trace without a usable event was accepted";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("b.json has no complete"), std::string::npos) << e.what();
  }
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
  // PyTorch's own trace through the command too.
  ASSERT_EQ(run({"perf", "--trace",
                 volt_test::source_dir() + "/tests/cli/data/pytorch_1.13_cpu.pt.trace.json"},
                &text),
            0)
      << text;
  EXPECT_NE(text.find("steps: 3"), std::string::npos) << text;
  EXPECT_NE(text.find("1.0 host read(s) per step"), std::string::npos) << text;
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

// One complete event of a hand-made trace (pid 1, tid 1: the steps' thread).
nlohmann::json event(const std::string& name, const std::string& cat, double ts, double dur) {
  return {{"ph", "X"}, {"name", name}, {"cat", cat}, {"pid", 1},
          {"tid", 1},  {"ts", ts},     {"dur", dur}};
}

TEST(PerfScan, SharesSyncsAndOpTimesOfAHandMadeTrace) {
  // Two overlapping steps; events partly outside them; syncs nested in syncs and in the
  // non-finite check's scope; ops inside a batch fetch. Every figure worked out by hand.
  nlohmann::json t = nlohmann::json::array();
  t.push_back(event("ProfilerStep#1", "user_annotation", 0, 100));
  t.push_back(event("ProfilerStep#2", "user_annotation", 50, 100));  // steps' union [0, 150)
  t.push_back(event("aten::addmm", "cpu_op", 10, 10));               // A, self 10-1-3 = 6
  t.push_back(event("aten::_local_scalar_dense", "cpu_op", 12, 1));  // a sync
  t.push_back(event("aten::is_nonzero", "cpu_op", 15, 3));           // a sync, self 2
  t.push_back(event("aten::_local_scalar_dense", "cpu_op", 16, 1));  // inside it: no more
  t.push_back(event("get_train_batch", "cpu_op", 30, 10));           // a fetch
  t.push_back(event("aten::stack", "cpu_op", 32, 1));                // in the fetch
  t.push_back(event("aten::mm", "cpu_op", 140, 20));                 // B, half outside, self 15
  t.push_back(event("volt::detect_nonfinite_loss", "user_annotation", 141, 5));
  t.push_back(event("aten::_local_scalar_dense", "cpu_op", 142, 1));  // the Trainer's own sync
  const auto s = volt::detail::scan_trace(nlohmann::json{{"traceEvents", t}}.dump(), "hand");
  EXPECT_EQ(s.steps, 2);
  EXPECT_DOUBLE_EQ(s.step_time_us, 200);
  EXPECT_EQ(s.ops, 8);
  // Covered within the steps: [10, 20) + [30, 40) + [140, 150) = 30 of 200.
  EXPECT_NEAR(s.idle_share, 1.0 - 30.0 / 200.0, 1e-12);
  EXPECT_NEAR(s.data_share, 10.0 / 200.0, 1e-12);
  EXPECT_EQ(s.host_syncs, 3);
  EXPECT_EQ(s.nonfinite_check_syncs, 1);
  // The step's ops (the fetch and what runs in it left out): 6 + 1 + 2 + 1 + 15 + 1 over six.
  EXPECT_NEAR(s.mean_op_us, 26.0 / 6.0, 1e-12);
}

TEST(PerfScan, AHostileTraceIsScannedInNearLinearTime) {
  // 6,000 steps and 18,000 main-thread events all overlapping them, nested 12,000 deep, with
  // 6,000 batch fetches. Clipping each event to each step made 72 million pairs (1.15 GB), each
  // op was tested against every fetch, and each sync scanned the whole stack around it.
  nlohmann::json t = nlohmann::json::array();
  const int kN = 6000;
  for (int i = 0; i < kN; ++i) {
    t.push_back(event("ProfilerStep#" + std::to_string(i), "user_annotation", 0, 1e9));
    t.push_back(event("aten::add", "cpu_op", i, 1e9 - 2 * i));  // nested: each inside the last
    t.push_back(event("get_train_batch", "cpu_op", 2e9 + 2 * i, 1));
  }
  for (int i = 0; i < kN; ++i)
    t.push_back(event("aten::is_nonzero", "cpu_op", kN + i, 1e9 - 2 * kN - 2 * i));
  const std::string text = nlohmann::json{{"traceEvents", t}}.dump();
  const auto t0 = std::chrono::steady_clock::now();
  const auto s = volt::detail::scan_trace(text, "hostile");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.steps, kN);
  EXPECT_EQ(s.host_syncs, 1);  // the others are nested in the first
  EXPECT_LT(secs, 3.0);
}

}  // namespace
