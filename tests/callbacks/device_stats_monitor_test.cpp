// DeviceStatsMonitor on real runs: the ten metrics reach the loggers at the Trainer's step
// cadence or per epoch, memory a module keeps shows up byte for byte, host stats are real, and a
// run without loggers is a clear error.

#include <gtest/gtest.h>

#include <cstdio>

#include "tiny.h"

namespace {

const std::string kInUse = "device_stats/InUse";

/// Keeps one 4096-byte tensor per training step alive until the run ends.
class Hoarder : public volt_test::TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    kept.push_back(torch::empty({1024}, torch::kFloat));
    return TinyClassifier::training_step(b, i);
  }
  std::vector<torch::Tensor> kept;
};

TEST(DeviceStatsMonitor, LogsTheTenMetricsAtTheStepCadence) {
  volt_test::TempDir dir;
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  auto monitor = std::make_shared<volt::DeviceStatsMonitor>();
  Hoarder model;
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(1).log_every_n_steps(2).loggers({logger}).callbacks(
          {monitor}));
  // 128 rows / 16 = 8 steps: logged after steps 2, 4, 6, 8.
  trainer.fit(model, volt_test::loader(volt_test::blobs(128), 16, false));
  const auto recs = logger->with(kInUse);
  ASSERT_EQ(recs.size(), 4u);
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i].first, static_cast<int64_t>(2 * i + 1));  // the Trainer's log step
    const auto& m = recs[i].second;
    for (const char* k :
         {"Limit", "InUse", "MaxInUse", "NumAllocs", "NumFrees", "ActiveAllocs", "MaxAllocSize",
          "TotalSystemAllocs", "TotalSystemFrees", "TotalActiveAllocs"}) {
      EXPECT_EQ(m.count(std::string("device_stats/") + k), 1u) << k;
    }
    EXPECT_EQ(m.at("device_stats/ActiveAllocs"),
              m.at("device_stats/NumAllocs") - m.at("device_stats/NumFrees"));
    EXPECT_GE(m.at("device_stats/MaxInUse"), m.at("device_stats/InUse"));
    if (i > 0) {
      EXPECT_GT(m.at("device_stats/NumAllocs"), recs[i - 1].second.at("device_stats/NumAllocs"));
    }
  }
  // Between two logs in the steady state (same batch sizes, optimizer state already built), the
  // only memory that stays is what the module kept: two steps x 4096 bytes, two allocations.
  const auto& a = recs[1].second;
  const auto& b = recs[2].second;
  EXPECT_EQ(b.at(kInUse) - a.at(kInUse), 2 * 4096);
  EXPECT_EQ(b.at("device_stats/ActiveAllocs") - a.at("device_stats/ActiveAllocs"), 2);
  EXPECT_EQ(monitor->last_logged().at(kInUse), recs.back().second.at(kInUse));
}

// A fit resumed from a checkpoint of a logging step, under gradient accumulation: the resumed
// fit's first micro-batch still sees that step, whose row the first fit wrote; it was logged
// again (under the step before, with the memory of a half-accumulated step).
TEST(DeviceStatsMonitor, AResumedFitDoesNotLogTheCheckpointsStepAgain) {
  volt_test::TempDir dir;
  const auto options = [&] {
    return volt_test::quiet(dir.path).max_epochs(1).log_every_n_steps(2).accumulate_grad_batches(2);
  };
  volt_test::TinyClassifier first;
  volt::Trainer cut(options().max_steps(2));  // 4 of the 8 batches: steps 1 and 2
  cut.fit(first, volt_test::loader(volt_test::blobs(128), 16, false));
  cut.save_checkpoint(dir / "step2.ckpt");
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  volt_test::TinyClassifier resumed;
  volt::Trainer t(
      options().loggers({logger}).callbacks({std::make_shared<volt::DeviceStatsMonitor>()}));
  t.fit(resumed, volt_test::loader(volt_test::blobs(128), 16, false), c10::nullopt,
        dir / "step2.ckpt");
  ASSERT_EQ(t.state().global_step, 4);
  std::vector<int64_t> steps;
  for (const auto& r : logger->with(kInUse)) steps.push_back(r.first);
  EXPECT_EQ(steps, (std::vector<int64_t>{3}));  // step 4 alone, under the Trainer's index
}

TEST(DeviceStatsMonitor, EpochIntervalWithHostStats) {
  volt_test::TempDir dir;
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  auto monitor = std::make_shared<volt::DeviceStatsMonitor>(
      volt::DeviceStatsMonitorOptions().logging_interval(volt::Interval::kEpoch).host_stats(true));
  volt_test::TinyClassifier model;
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(3).loggers({logger}).callbacks({monitor}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)));
  const auto recs = logger->with(kInUse);
  ASSERT_EQ(recs.size(), 3u);
  for (const auto& r : recs) {
    EXPECT_GT(r.second.at("device_stats/host_rss_bytes"), 1e6);  // libtorch alone is bigger
    EXPECT_GE(r.second.at("device_stats/host_cpu_percent"), 0.0);
  }
  EXPECT_EQ(recs[0].first, 3);  // global step 4 after the first epoch, logged at step 3
}

TEST(DeviceStatsMonitor, WithoutLoggersIsAConfigError) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1).callbacks(
      {std::make_shared<volt::DeviceStatsMonitor>()}));
  try {
    trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
    FAIL() << "no error";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("[DeviceStatsMonitor] the Trainer has no logger"),
              std::string::npos)
        << e.what();
  }
}

/// Keeps one 1 MiB CUDA tensor per training step alive until the run ends.
class CudaHoarder : public volt_test::TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    kept.push_back(torch::empty({256 * 1024}, b.input.options().dtype(torch::kFloat)));
    return TinyClassifier::training_step(b, i);
  }
  std::vector<torch::Tensor> kept;
};

TEST(DeviceStatsMonitorCuda, LogsTheCachingAllocatorsStatsAndWhatAModuleKeeps) {
  if (!volt::CudaAccelerator::available()) GTEST_SKIP() << "no CUDA device in this build/machine";
  volt_test::TempDir dir;
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  auto monitor = std::make_shared<volt::DeviceStatsMonitor>();
  CudaHoarder model;
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .accelerator("cuda")
                            .devices(1)
                            .max_epochs(1)
                            .log_every_n_steps(2)
                            .loggers({logger})
                            .callbacks({monitor}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128), 16, false));
  const auto recs = logger->with(kInUse);
  ASSERT_EQ(recs.size(), 4u);
  for (const auto& r : recs) {
    const auto& m = r.second;
    for (const char* k : {"Limit", "InUse", "MaxInUse", "NumAllocs", "NumFrees", "ActiveAllocs",
                          "TotalSystemAllocs", "TotalSystemFrees", "TotalActiveAllocs"}) {
      EXPECT_EQ(m.count(std::string("device_stats/") + k), 1u) << k;
    }
    EXPECT_EQ(m.count("device_stats/MaxAllocSize"), 0u);  // CUDA's allocator keeps none
    EXPECT_EQ(m.at("device_stats/ActiveAllocs"),
              m.at("device_stats/NumAllocs") - m.at("device_stats/NumFrees"));
    EXPECT_GE(m.at("device_stats/MaxInUse"), m.at("device_stats/InUse"));
    EXPECT_GT(m.at("device_stats/Limit"), m.at("device_stats/MaxInUse"));
    EXPECT_GE(m.at("device_stats/TotalActiveAllocs"), 1.0);  // a segment holds the kept tensors
  }
  // Two steps between logs keep two 1 MiB tensors (allocated bytes are the rounded block sizes:
  // 1 MiB exactly); other memory of the steady state comes and goes.
  const double grew = recs[2].second.at(kInUse) - recs[1].second.at(kInUse);
  std::printf("[ measured ] InUse grew by %.0f bytes over two steps\n", grew);
  EXPECT_GE(grew, 2.0 * (1 << 20));
  EXPECT_LE(grew, 2.0 * (1 << 20) + 64 * 1024);
}

TEST(DeviceStatsMonitor, BuildsFromTheRegistryWithOptions) {
  auto cb = volt::registry().callbacks.create("DeviceStatsMonitor");
  ASSERT_NE(dynamic_cast<volt::DeviceStatsMonitor*>(cb.get()), nullptr);
}

}  // namespace
