// MetricStore (what Module::log's epoch-level values go into) on real tensors: it keeps one
// running reduction per name, not one tensor per logged value (an epoch of many steps grew by a
// tensor per step and name before session 99), reduces as the list of values did (weighted mean,
// sum, max, min), saves and resumes mid-epoch to the same result as an uninterrupted epoch, and
// reads the checkpoints that held every value.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "reread.h"
#include "trainer/detail/metric_store.h"
#include "volt/accelerators/cpu_memory.h"
#include "volt/core/errors.h"

namespace {

using volt::Reduce;
using volt::detail::MetricStore;

// Values of a made-up epoch: step i logs 0.1 * i (float32, as a loss) with batch size 1 + i % 3.
void log_steps(MetricStore& store, int64_t from, int64_t to) {
  for (int64_t i = from; i < to; ++i) {
    const at::Tensor v = torch::tensor(0.1f * static_cast<float>(i));
    store.add_epoch("loss", v, 1 + i % 3, Reduce::kMean, false, true);
    store.add_epoch("total", v, 1 + i % 3, Reduce::kSum, false, true);
    store.add_epoch("worst", v, 1, Reduce::kMax, false, true);
    store.add_epoch("best", v, 1, Reduce::kMin, false, true);
  }
}

// The reductions as the store computed them before session 99, from every value at once.
volt::Metrics reference(int64_t steps) {
  std::vector<double> v, w;
  for (int64_t i = 0; i < steps; ++i) {
    v.push_back(static_cast<double>(0.1f * static_cast<float>(i)));
    w.push_back(static_cast<double>(1 + i % 3));
  }
  const at::Tensor values = torch::tensor(v, torch::kDouble), weights = torch::tensor(w);
  return {{"loss", ((values * weights).sum() / weights.sum()).item<double>()},
          {"total", values.sum().item<double>()},
          {"worst", values.max().item<double>()},
          {"best", values.min().item<double>()}};
}

TEST(MetricStore, ReducesAsTheValuesAllAtOnceAndHoldsOneTensorPerName) {
  volt::install_counting_cpu_allocator();
  MetricStore store;
  log_steps(store, 0, 10);
  const int64_t held = volt::cpu_memory_stats().active_allocs;
  log_steps(store, 10, 5000);
  // The lists of values held each step's tensor: 4990 more.
  EXPECT_LE(volt::cpu_memory_stats().active_allocs - held, 8);
  const volt::Metrics got = store.reduce_epoch(nullptr, nullptr);
  const volt::Metrics want = reference(5000);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& kv : want) {
    // The running sums add in step order, the stacked ones in blocks: round-off apart.
    EXPECT_NEAR(got.at(kv.first), kv.second, 1e-9 * std::max(1.0, std::abs(kv.second))) << kv.first;
  }
  EXPECT_EQ(got.at("worst"), want.at("worst"));
  EXPECT_EQ(got.at("best"), want.at("best"));
  EXPECT_TRUE(store.reduce_epoch(nullptr, nullptr).empty());  // cleared
}

TEST(MetricStore, AResumedEpochReducesAsTheUninterruptedOne) {
  MetricStore whole;
  log_steps(whole, 0, 300);
  const volt::Metrics uninterrupted = whole.reduce_epoch(nullptr, nullptr);

  MetricStore first;
  log_steps(first, 0, 137);
  torch::serialize::OutputArchive out;
  first.save(out);
  torch::serialize::InputArchive in = volt_test::reread(out);
  MetricStore resumed;
  resumed.load(in);
  log_steps(resumed, 137, 300);
  const volt::Metrics got = resumed.reduce_epoch(nullptr, nullptr);
  for (const auto& kv : uninterrupted) EXPECT_EQ(got.at(kv.first), kv.second) << kv.first;
}

// A checkpoint written before session 99 holds every value and weight of each name: they are
// folded into the running reduction.
TEST(MetricStore, ACheckpointHoldingEveryValueIsFolded) {
  torch::serialize::OutputArchive out, one;
  one.write("values", torch::tensor({1.0, 4.0, 2.0}, torch::kDouble));
  one.write("weights", torch::tensor({1, 2, 1}, torch::kLong));
  one.write("flags",
            c10::IValue(c10::List<int64_t>({static_cast<int64_t>(Reduce::kMean), 0, 1, 0})));
  out.write("m_loss", one);
  c10::List<std::string> names;
  names.push_back("loss");
  out.write("names", c10::IValue(names));
  torch::serialize::InputArchive in = volt_test::reread(out);
  MetricStore store;
  store.load(in);
  store.add_epoch("loss", torch::tensor(3.0), 1, Reduce::kMean, false, true);
  // (1 + 8 + 2 + 3) / (1 + 2 + 1 + 1)
  EXPECT_DOUBLE_EQ(store.reduce_epoch(nullptr, nullptr).at("loss"), 14.0 / 5.0);
}

TEST(MetricStore, ANameLoggedWithAnotherReduceInTheSameEpochIsAConfigError) {
  MetricStore store;
  store.add_epoch("acc", torch::tensor(0.5), 1, Reduce::kMean, false, true);
  try {
    store.add_epoch("acc", torch::tensor(0.7), 1, Reduce::kMax, false, true);
    ADD_FAILURE() << "no error";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("log(\"acc\") with reduce=max after reduce=mean"),
              std::string::npos)
        << e.what();
  }
  EXPECT_DOUBLE_EQ(store.reduce_epoch(nullptr, nullptr).at("acc"), 0.5);
  // A new epoch may choose again.
  store.add_epoch("acc", torch::tensor(0.7), 1, Reduce::kMax, false, true);
  EXPECT_NEAR(store.reduce_epoch(nullptr, nullptr).at("acc"), 0.7, 1e-7);
}

}  // namespace
