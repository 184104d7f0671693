// TorchProfiler on real runs: the Chrome trace parses and holds libtorch ops, volt's regions and
// custom regions from the Module; the schedule bounds the recorded steps; one file per rank;
// unbalanced regions are typed errors; the CLI builds it by name and rejects bad options.

#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "build_paths.h"
#include "file_text.h"
#include "processes.h"
#include "requires.h"
#include "tiny.h"

namespace {

using volt_test::file_text;

namespace fs = std::filesystem;
using nlohmann::json;

json load_trace(const std::string& path) {
  EXPECT_TRUE(fs::exists(path)) << path;
  return json::parse(file_text(path));  // throws (fails the test) on malformed JSON
}

/// Complete ("X") events named `name`.
std::vector<json> events_named(const json& trace, const std::string& name) {
  std::vector<json> out;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X" && e.at("name") == name) out.push_back(e);
  }
  return out;
}

size_t count_containing(const json& trace, const std::string& part) {
  size_t n = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X" && e.at("name").get<std::string>().find(part) != std::string::npos) ++n;
  }
  return n;
}

/// TinyClassifier with custom regions in training_step: a scoped one and a start/stop pair.
class RegionModel : public volt_test::TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    torch::Tensor loss;
    {
      auto region = profiler().profile("my_forward");
      loss = torch::cross_entropy_loss(forward(b.input), b.target);
    }
    profiler().start("my_pair");
    auto doubled = b.input * 2;  // aten::mul inside the pair
    profiler().stop("my_pair");
    if (stop_unopened) profiler().stop("never_started");
    if (leave_open && i == 0) profiler().start("left_open");
    return loss;
  }
  bool stop_unopened = false;
  bool leave_open = false;
};

volt::TrainerOptions options(const std::string& dir, std::shared_ptr<volt::Profiler> p) {
  return volt_test::quiet(dir).max_epochs(1).profiler(std::move(p));
}

TEST(TorchProfiler, FitTraceHoldsOpsVoltRegionsAndCustomRegions) {
  volt_test::TempDir dir;
  auto prof = std::make_shared<volt::TorchProfiler>(
      volt::TorchProfilerOptions().filename("run").wait(0).warmup(0).active(0));
  RegionModel model;
  volt::Trainer trainer(options(dir.path, prof));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)),
              volt_test::loader(volt_test::blobs(64, 8, 2), 16, false));
  ASSERT_EQ(prof->last_trace_path(), trainer.log_dir() + "/fit-run-rank0.pt.trace.json");
  const json trace = load_trace(prof->last_trace_path());

  // Libtorch ops through the RecordFunction callbacks, as host-time cpu_op events.
  const auto addmm = events_named(trace, "aten::addmm");
  ASSERT_FALSE(addmm.empty());
  EXPECT_EQ(addmm.front().at("cat"), "cpu_op");
  EXPECT_EQ(addmm.front().at("pid"), 0);
  EXPECT_GE(addmm.front().at("dur").get<double>(), 0.0);
  EXPECT_GT(count_containing(trace, "AddmmBackward0"), 0u);  // autograd nodes too
  // volt's regions: loop stages and hooks, 8 training steps (128 / 16), 4 validation batches.
  EXPECT_EQ(events_named(trace, "training_step").size(), 8u);
  EXPECT_EQ(events_named(trace, "backward").size(), 8u);
  EXPECT_EQ(events_named(trace, "optimizer_step").size(), 8u);
  EXPECT_EQ(events_named(trace, "validation_step").size(), 4u);
  EXPECT_EQ(events_named(trace, "get_train_batch").size(), 9u);  // + the end-of-stream call
  EXPECT_EQ(events_named(trace, "[Module]on_train_epoch_start").size(), 1u);
  EXPECT_EQ(events_named(trace, "training_step").front().at("cat"), "user_annotation");
  // Custom regions, nested inside training_step on the same thread.
  const auto mine = events_named(trace, "my_forward");
  const auto pair = events_named(trace, "my_pair");
  ASSERT_EQ(mine.size(), 8u);
  ASSERT_EQ(pair.size(), 8u);
  const auto steps = events_named(trace, "training_step");
  for (size_t i = 0; i < steps.size(); ++i) {
    const double s0 = steps[i].at("ts"), s1 = s0 + steps[i].at("dur").get<double>();
    EXPECT_GE(mine[i].at("ts").get<double>(), s0);
    EXPECT_LE(mine[i].at("ts").get<double>() + mine[i].at("dur").get<double>(), s1 + 1e-3);
    EXPECT_EQ(mine[i].at("tid"), steps[i].at("tid"));
  }
  // The process metadata names the rank.
  bool named = false;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "process_name") {
      EXPECT_EQ(e.at("args").at("name"), "rank 0");
      EXPECT_EQ(e.at("pid"), 0);
      named = true;
    }
  }
  EXPECT_TRUE(named);
  EXPECT_EQ(trace.at("distributedInfo").at("rank"), 0);

  // The summary: written next to the trace, self time never above total time.
  EXPECT_EQ(prof->last_summary_path(), trainer.log_dir() + "/fit-run-rank0.txt");
  const std::string summary = file_text(prof->last_summary_path());
  EXPECT_NE(summary.find("FIT TorchProfiler summary (rank 0, whole run"), std::string::npos)
      << summary;
  EXPECT_NE(summary.find("aten::addmm"), std::string::npos) << summary;
  bool found_region = false;
  for (const auto& r : prof->last_rows()) {
    EXPECT_LE(r.self_us, r.total_us + 1e-6) << r.name;
    EXPECT_GT(r.calls, 0);
    if (r.name == "my_forward") {
      found_region = true;
      EXPECT_FALSE(r.is_op);
      EXPECT_EQ(r.calls, 8);
      // Its ops (linear, relu, cross entropy) are its children: self time below total.
      EXPECT_LT(r.self_us, r.total_us);
    }
  }
  EXPECT_TRUE(found_region);
  // Callbacks are gone after the run.
  EXPECT_FALSE(at::hasGlobalCallbacks());
}

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// torch-tb-profiler (pytorch/kineto tb_plugin) loads every folder under its logdir that holds a
// file matching consts.WORKER_PATTERN, and keeps the complete events whose "cat" is a key of
// trace.EventTypeMap (a missing "cat" breaks its parser); ProfilerStep#N must be cpu_op or
// user_annotation to count as a step.
TEST(TorchProfiler, TensorboardNamesTheTraceWhereThePyTorchProfilerPluginFindsIt) {
  volt_test::TempDir dir;
  auto prof = std::make_shared<volt::TorchProfiler>(
      volt::TorchProfilerOptions().filename("tb").tensorboard(true));
  auto tb = std::make_shared<volt::TensorBoardLogger>(volt::TensorBoardLoggerOptions(dir.path));
  RegionModel model;
  volt::Trainer trainer(options(dir.path, prof).loggers({tb}));
  const int64_t t0 = unix_ms();
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
  const std::string first = prof->last_trace_path();
  const int64_t t1 = unix_ms();
  // In the TensorBoard logger's run folder, next to its event file: the plugin's run.
  const fs::path path(first);
  EXPECT_EQ(path.parent_path(), fs::path(dir.path) / "volt_logs" / "version_0");
  bool has_events = false;
  for (const auto& f : fs::directory_iterator(path.parent_path())) {
    has_events |= f.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_TRUE(has_events);
  const std::regex worker_pattern(R"(^(.*?)(\.\d+)?\.pt\.trace\.json(?:\.gz)?$)");
  std::smatch m;
  const std::string name = path.filename().string();
  ASSERT_TRUE(std::regex_match(name, m, worker_pattern)) << name;
  EXPECT_EQ(m[1].str(), "fit-tb-rank0");
  ASSERT_TRUE(m[2].matched) << name;
  const int64_t span = std::stoll(m[2].str().substr(1));  // milliseconds since the epoch
  EXPECT_GE(span, t0);
  EXPECT_LE(span, t1);

  const std::set<std::string> plugin_categories{
      "trace",  "cpu_op", "operator",        "runtime",         "cuda_runtime",
      "kernel", "memcpy", "gpu_memcpy",      "memset",          "gpu_memset",
      "python", "memory", "python_function", "user_annotation", "gpu_user_annotation"};
  const json trace = load_trace(first);
  size_t steps = 0;
  for (const auto& e : trace.at("traceEvents")) {
    ASSERT_TRUE(e.contains("name")) << e.dump();
    if (e.at("ph") != "X") continue;
    ASSERT_TRUE(e.contains("cat")) << e.dump();
    EXPECT_EQ(plugin_categories.count(e.at("cat").get<std::string>()), 1u) << e.dump();
    if (e.at("name").get<std::string>().rfind("ProfilerStep#", 0) == 0) {
      ++steps;
      EXPECT_EQ(e.at("cat"), "user_annotation");
    }
  }
  EXPECT_EQ(steps, 3u);  // the default schedule: wait 1, warmup 1, active 3
  // A second entry point adds a trace (a new span of the same worker) instead of replacing it.
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
  EXPECT_NE(prof->last_trace_path(), first);
  EXPECT_TRUE(fs::exists(first));
  EXPECT_TRUE(fs::exists(prof->last_trace_path()));
  // The summary keeps its plain name.
  EXPECT_EQ(prof->last_summary_path(), path.parent_path().string() + "/fit-tb-rank0.txt");
}

TEST(TorchProfiler, ScheduleKeepsOnlyTheActiveSteps) {
  volt_test::TempDir dir;
  // wait 1, warmup 1, active 2: steps 2 and 3 (0-based) of 8 are kept.
  auto prof = std::make_shared<volt::TorchProfiler>(
      volt::TorchProfilerOptions().filename("s").wait(1).warmup(1).active(2).repeat(1));
  RegionModel model;
  volt::Trainer trainer(options(dir.path, prof));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
  EXPECT_EQ(prof->last_recorded_steps(), 2);
  const json trace = load_trace(prof->last_trace_path());
  EXPECT_EQ(events_named(trace, "training_step").size(), 2u);
  EXPECT_EQ(events_named(trace, "my_forward").size(), 2u);
  const auto s2 = events_named(trace, "ProfilerStep#2");
  const auto s3 = events_named(trace, "ProfilerStep#3");
  ASSERT_EQ(s2.size(), 1u);
  ASSERT_EQ(s3.size(), 1u);
  EXPECT_TRUE(events_named(trace, "ProfilerStep#1").empty());  // warm-up: discarded
  EXPECT_TRUE(events_named(trace, "ProfilerStep#4").empty());
  // Every op lies in a kept step.
  const double lo = s2.front().at("ts");
  const double hi = s3.front().at("ts").get<double>() + s3.front().at("dur").get<double>();
  size_t ops = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X" || e.at("cat") != "cpu_op") continue;
    ++ops;
    EXPECT_GE(e.at("ts").get<double>(), lo);
    EXPECT_LT(e.at("ts").get<double>(), hi);
  }
  EXPECT_GT(ops, 0u);
  const size_t addmm_two_steps = events_named(trace, "aten::addmm").size();

  // repeat: wait 1, active 1, two cycles -> steps 1 and 3.
  auto rep = std::make_shared<volt::TorchProfiler>(
      volt::TorchProfilerOptions().filename("r").wait(1).warmup(0).active(1).repeat(2));
  RegionModel m2;
  volt::Trainer t2(options(dir.path, rep));
  t2.fit(m2, volt_test::loader(volt_test::blobs(128)));
  const json tr = load_trace(rep->last_trace_path());
  EXPECT_EQ(rep->last_recorded_steps(), 2);
  EXPECT_EQ(events_named(tr, "ProfilerStep#1").size(), 1u);
  EXPECT_EQ(events_named(tr, "ProfilerStep#3").size(), 1u);
  EXPECT_EQ(events_named(tr, "training_step").size(), 2u);
  // The same model and batch size: the same ops per step.
  EXPECT_EQ(events_named(tr, "aten::addmm").size(), addmm_two_steps);
}

// Under graph_training_step each step after the capture is a "graph_replay" region and
// training_step is never called again: the schedule counted only training_step, so it stopped in
// its recording phase and kept every replay of the rest of the run (memory without bound, and
// one "step" spanning them all). The regions as the graphed loop opens them, without a GPU.
TEST(TorchProfiler, EachGraphReplayIsAStepOfTheSchedule) {
  volt_test::TempDir dir;
  volt::TorchProfiler prof(volt::TorchProfilerOptions().filename("g").record_ops(false));
  prof.setup("fit", 0, dir.path);
  for (int i = 0; i < 4; ++i) {  // warm-up iterations and the capture
    prof.start("training_step");
    prof.stop("training_step");
  }
  for (int i = 0; i < 100; ++i) {
    prof.start("graph_replay");
    prof.stop("graph_replay");
  }
  prof.describe("fit", dir.path);
  // wait 1, warmup 1, active 3: steps 2, 3 (training_step) and 4 (the first replay) are kept.
  EXPECT_EQ(prof.last_recorded_steps(), 3);
  const json trace = load_trace(prof.last_trace_path());
  EXPECT_EQ(events_named(trace, "training_step").size(), 2u);
  EXPECT_EQ(events_named(trace, "graph_replay").size(), 1u);
  EXPECT_EQ(events_named(trace, "ProfilerStep#4").size(), 1u);
  EXPECT_TRUE(events_named(trace, "ProfilerStep#5").empty());
}

TEST(TorchProfiler, TestStageWritesItsOwnFileAndCountsTestSteps) {
  volt_test::TempDir dir;
  auto prof = std::make_shared<volt::TorchProfiler>(
      volt::TorchProfilerOptions().dirpath(dir / "traces").wait(0).warmup(0).active(2));
  volt_test::TinyClassifier model;
  volt::Trainer trainer(options(dir.path, prof));
  trainer.test(model, volt_test::loader(volt_test::blobs(64, 8, 2), 16, false));
  // No filename: the summary goes to stderr, the trace still to a file named by stage and rank.
  EXPECT_EQ(prof->last_trace_path(), dir / "traces/test-rank0.pt.trace.json");
  EXPECT_TRUE(prof->last_summary_path().empty());
  EXPECT_NE(prof->last_summary().find("TEST TorchProfiler summary"), std::string::npos);
  const json trace = load_trace(prof->last_trace_path());
  EXPECT_EQ(events_named(trace, "test_step").size(), 2u);
  EXPECT_FALSE(events_named(trace, "aten::addmm").empty());
}

TEST(TorchProfiler, RankGoesIntoTheFileNameAndTheProcessMetadata) {
  volt_test::TempDir dir;
  volt::TorchProfiler prof(
      volt::TorchProfilerOptions().filename("p").record_shapes(true).wait(0).warmup(0).active(0));
  prof.setup("predict", 3, dir.path);
  {
    auto r = prof.profile("outer");
    auto a = torch::ones({3, 4}), b = torch::ones({4, 5});
    auto c = torch::mm(a, b);
  }
  prof.describe("predict", dir.path);
  ASSERT_EQ(prof.last_trace_path(), dir / "predict-p-rank3.pt.trace.json");
  const json trace = load_trace(prof.last_trace_path());
  const auto mm = events_named(trace, "aten::mm");
  ASSERT_EQ(mm.size(), 1u);
  EXPECT_EQ(mm.front().at("pid"), 3);
  EXPECT_EQ(mm.front().at("args").at("Input Dims"), json::parse("[[3,4],[4,5]]"));
  bool named = false;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "process_name") {
      named = e.at("args").at("name") == "rank 3" && e.at("pid") == 3;
    }
  }
  EXPECT_TRUE(named);
  // Without a filename the summary is printed by rank 0 alone (every rank printed its table
  // to the job's shared terminal).
  for (int64_t rank : {0, 1}) {
    volt::TorchProfiler printed(
        volt::TorchProfilerOptions().record_ops(false).wait(0).warmup(0).active(0));
    printed.setup("predict", rank, dir / ("printed" + std::to_string(rank)));
    { auto r = printed.profile("outer"); }
    testing::internal::CaptureStderr();
    printed.describe("predict", dir / ("printed" + std::to_string(rank)));
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(err.find("TorchProfiler summary") != std::string::npos, rank == 0) << err;
  }
}

TEST(TorchProfiler, OpsFromManyThreadsAreAllRecorded) {
  volt_test::TempDir dir;
  volt::TorchProfiler prof(volt::TorchProfilerOptions().filename("t").wait(0).warmup(0).active(0));
  prof.setup("fit", 0, dir.path);
  EXPECT_TRUE(at::hasGlobalCallbacks());
  constexpr int kThreads = 4, kOps = 200;
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([] {
      auto a = torch::ones({8}), b = torch::ones({8});
      for (int i = 0; i < kOps; ++i) a = torch::sub(a, b);
    });
  }
  for (auto& th : pool) th.join();
  prof.describe("fit", dir.path);
  EXPECT_FALSE(at::hasGlobalCallbacks());  // removed at teardown
  const json trace = load_trace(prof.last_trace_path());
  const auto subs = events_named(trace, "aten::sub");
  EXPECT_EQ(subs.size(), static_cast<size_t>(kThreads * kOps));
  std::set<int64_t> tids;
  for (const auto& e : subs) tids.insert(e.at("tid").get<int64_t>());
  EXPECT_EQ(tids.size(), static_cast<size_t>(kThreads));
  // Ops after describe are not recorded anywhere (the callback is gone).
  torch::sub(torch::ones({2}), torch::ones({2}));
  EXPECT_EQ(events_named(load_trace(prof.last_trace_path()), "aten::sub").size(),
            static_cast<size_t>(kThreads * kOps));
}

TEST(TorchProfiler, UnbalancedStopIsAProfilerError) {
  {
    volt::TorchProfiler prof;  // used directly: starts at its first region, ends when destroyed
    prof.start("a");
    try {
      prof.stop("b");
      ADD_FAILURE() << "stop without start did not throw";
    } catch (const volt::ProfilerError& e) {
      EXPECT_NE(std::string(e.what()).find("[TorchProfiler] stop(\"b\") without a matching start"),
                std::string::npos)
          << e.what();
    }
    prof.stop("a");
    EXPECT_THROW(prof.stop("a"), volt::ProfilerError);  // once per start
  }
  EXPECT_FALSE(at::hasGlobalCallbacks());

  // From a Module inside a run: the error ends fit() with its type intact.
  volt_test::TempDir dir;
  auto p = std::make_shared<volt::TorchProfiler>(
      volt::TorchProfilerOptions().filename("u").wait(0).warmup(0).active(0));
  RegionModel model;
  model.stop_unopened = true;
  volt::Trainer trainer(options(dir.path, p));
  EXPECT_THROW(trainer.fit(model, volt_test::loader(volt_test::blobs(32))), volt::ProfilerError);
  EXPECT_FALSE(at::hasGlobalCallbacks());
  // SimpleProfiler checks the same way.
  volt::SimpleProfiler simple;
  EXPECT_THROW(simple.stop("x"), volt::ProfilerError);
}

TEST(TorchProfiler, ARegionLeftOpenIsReportedWhenTheRunEnds) {
  volt_test::TempDir dir;
  std::vector<std::string> lines;
  volt::set_log_sink([&](volt::LogLevel, const std::string& l) { lines.push_back(l); });
  auto p = std::make_shared<volt::TorchProfiler>(
      volt::TorchProfilerOptions().filename("o").wait(0).warmup(0).active(0));
  RegionModel model;
  model.leave_open = true;
  volt::Trainer trainer(options(dir.path, p));
  trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
  volt::set_log_sink(nullptr);
  bool warned = false;
  for (const auto& l : lines) {
    warned |= l.find("regions started but never stopped: \"left_open\"") != std::string::npos;
  }
  EXPECT_TRUE(warned);
}

TEST(TorchProfiler, ModuleProfilerWithoutAProfilerRecordsNothingAndWorks) {
  volt_test::TempDir dir;
  RegionModel model;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1));
  trainer.fit(model, volt_test::loader(volt_test::blobs(32)));  // PassThroughProfiler
  EXPECT_THROW(model.profiler(), volt::ConfigError);            // outside a run
}

TEST(TorchProfiler, BadOptionsAreConfigErrors) {
  auto expect = [](volt::TorchProfilerOptions o, const std::string& phrase) {
    try {
      volt::TorchProfiler p(o);
      ADD_FAILURE() << "no error for " << o;
    } catch (const volt::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    }
  };
  expect(volt::TorchProfilerOptions().wait(-1), "has a negative value");
  expect(volt::TorchProfilerOptions().active(0), "active=0 records the whole run");
  expect(volt::TorchProfilerOptions().filename("a/b"), "contains a '/'");
  expect(volt::TorchProfilerOptions().row_limit(0), "row_limit=0");
  // One recording profiler per process.
  volt_test::TempDir dir;
  volt::TorchProfiler first, second;
  first.setup("fit", 0, dir.path);
  EXPECT_THROW(second.setup("fit", 0, dir.path), volt::ConfigError);
  first.describe("fit", dir.path);
  second.setup("fit", 0, dir.path);  // free again
  second.describe("fit", dir.path);
}

TEST(TorchProfiler, TwoDdpRanksWriteOneTraceEach) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  volt_test::Process p(volt_test::ddp_worker(),
                       {"--root", dir.path, "--out", dir / "ddp", "--devices", "2", "--batch", "8",
                        "--epochs", "1", "--profile", "1"});
  ASSERT_EQ(p.exit_code(std::chrono::seconds(180)), 0) << p.output();
  for (int rank = 0; rank < 2; ++rank) {
    const json trace =
        load_trace(dir / ("prof/fit-ddp-rank" + std::to_string(rank) + ".pt.trace.json"));
    EXPECT_EQ(trace.at("distributedInfo").at("rank"), rank);
    const auto steps = events_named(trace, "training_step");
    ASSERT_EQ(steps.size(), 2u);  // warmup 1, active 2
    EXPECT_EQ(steps.front().at("pid"), rank);
    EXPECT_FALSE(events_named(trace, "aten::addmm").empty());
    // The gradient all-reduce reaches the trace through Gloo's own RecordFunction.
    EXPECT_GT(count_containing(trace, "gloo:all_reduce"), 0u) << rank;
  }
}

// ------------------------------------------------------------------ the CLI

TEST(TorchProfilerCli, ByNameWithOptionsAndBadOptionsExitTwo) {
  volt_test::TempDir dir;
  auto run = [&](const std::string& args) {
    const std::string cmd =
        volt_test::cli_binary() + " " + args + " >" + (dir / "out") + " 2>" + (dir / "err");
    const int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status)) << cmd;
    return WEXITSTATUS(status);
  };
  const std::string base = "fit --config " + volt_test::source_dir() +
                           "/configs/fashion_mnist_mlp.yaml --trainer.max_epochs=1 "
                           "--trainer.limit_train_batches=4 --trainer.limit_val_batches=1 "
                           "--trainer.enable_progress_bar=false --trainer.default_root_dir=" +
                           dir.path;
  ASSERT_EQ(run(base + " --trainer.profiler=TorchProfiler --trainer.profiler.filename=cli "
                       "--trainer.profiler.wait=0 --trainer.profiler.warmup=0 "
                       "--trainer.profiler.active=3"),
            0)
      << file_text(dir / "err");
  const json trace = load_trace(dir.path + "/volt_logs/version_0/fit-cli-rank0.pt.trace.json");
  EXPECT_EQ(events_named(trace, "training_step").size(), 3u);
  EXPECT_FALSE(events_named(trace, "aten::addmm").empty());
  EXPECT_EQ(run(base + " --trainer.profiler=TorchProfiler --trainer.profiler.active=-2"), 2);
  EXPECT_NE(file_text(dir / "err").find("[TorchProfiler] schedule"), std::string::npos)
      << file_text(dir / "err");
  EXPECT_EQ(run(base + " --trainer.profiler=TorchProfiler --trainer.profiler.activ=2"), 2);
  EXPECT_NE(file_text(dir / "err").find("did you mean"), std::string::npos)
      << file_text(dir / "err");
}

}  // namespace
