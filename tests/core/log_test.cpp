// The logging facade: one format, rank-zero filter, warn_once, sink replacement.
#include <gtest/gtest.h>

#include <volt/core/log.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct Capture {
  Capture() {
    volt::set_log_sink([this](volt::LogLevel, const std::string& l) { lines.push_back(l); });
  }
  ~Capture() {
    volt::set_log_sink(nullptr);
    volt::set_log_rank(0);
  }
  std::vector<std::string> lines;
};

TEST(Log, OneFormatWithComponent) {
  Capture c;
  volt::log_warning("Trainer", "something odd; do this.");
  volt::log_info("", "plain");
  ASSERT_EQ(c.lines.size(), 2u);
  EXPECT_EQ(c.lines[0], "[volt] warning: [Trainer] something odd; do this.");
  EXPECT_EQ(c.lines[1], "[volt] info: plain");
}

TEST(Log, OnlyRankZeroWarnsButEveryRankReportsErrors) {
  Capture c;
  volt::set_log_rank(3);
  volt::log_warning("DdpStrategy", "dropped on rank 3");
  volt::log_info("DdpStrategy", "dropped too");
  volt::log_error("DdpStrategy", "rank 1 died");
  ASSERT_EQ(c.lines.size(), 1u);
  EXPECT_EQ(c.lines[0], "[volt rank 3] error: [DdpStrategy] rank 1 died");
}

// Before a strategy sets the rank, a process a launcher started knows it from its environment
// (RANK, else LOCAL_RANK, else SLURM_PROCID, as Lightning's rank_zero_only): what a worker
// logged before its strategy's set-up printed on every rank as rank 0's. A fresh process each
// (the death test runs this binary again), since the first log fixes the rank.
TEST(Log, BeforeTheStrategySetsItTheRankIsTheLaunchersOne) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto rank_in_child = [](const char* name, const char* value) {
    ::setenv(name, value, 1);
    volt::log_warning("Test", "only rank 0 says this");
    std::exit(static_cast<int>(volt::log_rank()));
  };
  for (const char* name : {"RANK", "LOCAL_RANK", "SLURM_PROCID"}) {
    EXPECT_EXIT(rank_in_child(name, "2"), testing::ExitedWithCode(2), "^$") << name;
  }
  EXPECT_EXIT(rank_in_child("RANK", "0"), testing::ExitedWithCode(0),
              "warning: \\[Test\\] only rank 0 says this");
  EXPECT_EXIT(rank_in_child("RANK", "x"), testing::ExitedWithCode(0), "only rank 0 says this");
}

TEST(Log, WarnOncePrintsOncePerKey) {
  Capture c;
  EXPECT_TRUE(volt::warn_once("log_test.key", "X", "first"));
  EXPECT_FALSE(volt::warn_once("log_test.key", "X", "again"));
  EXPECT_TRUE(volt::warn_once("log_test.other", "X", "other"));
  EXPECT_EQ(c.lines.size(), 2u);
}

}  // namespace
