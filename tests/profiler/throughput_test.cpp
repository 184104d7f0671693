// Throughput against Lightning's formulas worked by hand: the window, the job's figures, items,
// FLOPs and MFU, the separator, and the refusals (a refused update changes nothing); and
// FabricThroughputMonitor logging through a Fabric.
#include <gtest/gtest.h>

#include <limits>
#include <sstream>

#include <volt/profiler/throughput.h>

#include "tiny.h"
#include "volt/core/errors.h"
#include "volt/fabric/fabric.h"
#include "volt/fabric/throughput_monitor.h"

namespace {

using volt::Metrics;
using volt::Throughput;
using volt::ThroughputOptions;

template <typename Fn>
std::string value_error(Fn fn) {
  try {
    fn();
  } catch (const volt::ValueError& e) {
    return e.what();
  }
  return "no ValueError";
}

TEST(Throughput, GivesTotalsAtOnceAndRatesOnceTheWindowIsFull) {
  Throughput t(ThroughputOptions().window_size(3));
  EXPECT_TRUE(t.compute().empty());
  t.update(1.0, 1, 4);
  t.update(2.0, 2, 8);
  EXPECT_EQ(t.compute(), (Metrics{{"time", 2.0}, {"batches", 2}, {"samples", 8}}));
  t.update(4.0, 3, 12);
  // The window (1 s, 1, 4) .. (4 s, 3, 12): 2 batches and 8 samples in 3 s.
  EXPECT_EQ(t.compute(), (Metrics{{"time", 4.0},
                                  {"batches", 3},
                                  {"samples", 12},
                                  {"device/batches_per_sec", 2.0 / 3.0},
                                  {"device/samples_per_sec", 8.0 / 3.0}}));
  t.update(5.0, 4, 20);  // the first point leaves: (2 s, 2, 8) .. (5 s, 4, 20)
  EXPECT_DOUBLE_EQ(t.compute().at("device/samples_per_sec"), 12.0 / 3.0);
  t.reset();
  EXPECT_TRUE(t.compute().empty());
  t.update(0.5, 1, 1);  // after reset the totals may start over
  EXPECT_EQ(t.compute().at("batches"), 1.0);
}

TEST(Throughput, AddsTheJobsFiguresItemsFlopsAndMfu) {
  Throughput t(ThroughputOptions()
                   .window_size(2)
                   .world_size(4)
                   .available_flops(1000.0)
                   .using_sparse_model(false)
                   .separator("|"));
  t.update(1.0, 1, 2, 10, 300);
  t.update(3.0, 2, 4, 30, 300);
  const Metrics m = t.compute();
  EXPECT_EQ(m.at("lengths"), 30.0);
  EXPECT_DOUBLE_EQ(m.at("device|batches_per_sec"), 0.5);
  EXPECT_DOUBLE_EQ(m.at("batches_per_sec"), 2.0);
  EXPECT_DOUBLE_EQ(m.at("device|samples_per_sec"), 1.0);
  EXPECT_DOUBLE_EQ(m.at("samples_per_sec"), 4.0);
  EXPECT_DOUBLE_EQ(m.at("device|items_per_sec"), 10.0);
  EXPECT_DOUBLE_EQ(m.at("items_per_sec"), 40.0);
  // The window's FLOPs after its first point: 300 per device, 1200 for the job, in 2 s.
  EXPECT_DOUBLE_EQ(m.at("flops_per_sec"), 600.0);
  EXPECT_DOUBLE_EQ(m.at("device|flops_per_sec"), 150.0);
  EXPECT_DOUBLE_EQ(m.at("device|mfu"), 0.15);
  EXPECT_EQ(m.size(), 13u);

  // 2:4 sparsity doubles the peak by default.
  Throughput sparse(
      ThroughputOptions().window_size(2).available_flops(1000.0).using_sparse_model(true));
  sparse.update(1.0, 1, 1, c10::nullopt, 100);
  sparse.update(2.0, 2, 2, c10::nullopt, 100);
  EXPECT_DOUBLE_EQ(sparse.compute().at("device/mfu"), 100.0 / 2000.0);
  EXPECT_EQ(sparse.compute().count("flops_per_sec"), 0u);  // one device: no job figures
}

TEST(Throughput, RefusesUpdatesThatDoNotAddUpAndKeepsItsWindow) {
  Throughput t(ThroughputOptions().window_size(2));
  t.update(1.0, 1, 2, 5);
  const Metrics before = t.compute();
  EXPECT_NE(value_error([&] { t.update(1.0, 2, 4, 10); }).find("time must increase"),
            std::string::npos);
  EXPECT_NE(value_error([&] { t.update(2.0, 1, 4, 10); }).find("batches must increase"),
            std::string::npos);
  EXPECT_NE(value_error([&] { t.update(2.0, 2, 2, 10); }).find("samples must increase"),
            std::string::npos);
  EXPECT_NE(value_error([&] { t.update(2.0, 3, 2, 10); }).find("samples (2) are fewer than"),
            std::string::npos);
  EXPECT_NE(value_error([&] { t.update(2.0, 2, 4, 3); }).find("lengths (3) are fewer than"),
            std::string::npos);
  EXPECT_NE(value_error([&] { t.update(2.0, 2, 4); }).find("in every update or in none"),
            std::string::npos);
  EXPECT_NE(value_error([&] { t.update(2.0, 2, 4, 10, -1); }).find("flops is -1"),
            std::string::npos);
  Throughput job(ThroughputOptions().world_size(4));
  EXPECT_NE(value_error([&] {
              job.update(1.0, 1, 1, c10::nullopt, int64_t{1} << 62);
            }).find("within int64"),
            std::string::npos);
  EXPECT_EQ(t.compute(), before);
  t.update(2.0, 2, 4, 10);  // still accepts a good one
  EXPECT_DOUBLE_EQ(t.compute().at("device/items_per_sec"), 5.0);

  EXPECT_NE(
      value_error([] { Throughput(ThroughputOptions().window_size(1)); }).find("window_size is 1"),
      std::string::npos);
  EXPECT_NE(
      value_error([] { Throughput(ThroughputOptions().world_size(0)); }).find("world_size is 0"),
      std::string::npos);
  EXPECT_NE(value_error([] {
              Throughput(ThroughputOptions().sparse_cuda_acceleration_factor(0.5));
            }).find("cannot lower the peak"),
            std::string::npos);
  EXPECT_NE(value_error([] {
              Throughput(ThroughputOptions().available_flops(0.0));
            }).find("available_flops is 0"),
            std::string::npos);
  EXPECT_NE(
      value_error([] {
        Throughput(ThroughputOptions().available_flops(std::numeric_limits<double>::infinity()));
      }).find("available_flops is inf"),
      std::string::npos);
}

TEST(FabricThroughputMonitor, LogsThroughTheFabricAtCountedOrGivenSteps) {
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  volt::Fabric fabric(volt::FabricOptions().accelerator("cpu").loggers({logger}));
  // The Fabric's world size (1) replaces the options': no job-wide figures.
  volt::FabricThroughputMonitor throughput(fabric,
                                           ThroughputOptions().window_size(2).world_size(8));
  EXPECT_EQ(throughput.step(), -1);
  throughput.update(1.0, 1, 4);
  EXPECT_EQ(throughput.compute_and_log(), (Metrics{{"time", 1.0}, {"batches", 1}, {"samples", 4}}));
  throughput.update(3.0, 2, 8);
  const Metrics m = throughput.compute_and_log(10);
  EXPECT_DOUBLE_EQ(m.at("device/samples_per_sec"), 2.0);
  EXPECT_EQ(m.count("samples_per_sec"), 0u);
  throughput.compute_and_log();
  EXPECT_EQ(throughput.step(), 11);
  ASSERT_EQ(logger->records.size(), 3u);
  EXPECT_EQ(logger->records[0].first, 0);
  EXPECT_EQ(logger->records[1].first, 10);
  EXPECT_EQ(logger->records[1].second, m);
  EXPECT_EQ(logger->records[2].first, 11);
  throughput.reset();
  EXPECT_TRUE(throughput.compute().empty());
}

TEST(Throughput, OptionsPrint) {
  std::ostringstream os;
  os << ThroughputOptions().available_flops(1e15);
  EXPECT_EQ(os.str(),
            "ThroughputOptions(available_flops=1e+15, world_size=1, window_size=100, "
            "separator=\"/\", using_sparse_model=none, sparse_cuda_acceleration_factor=2)");
}

}  // namespace
