// The logging facade: one format, rank-zero filter, warn_once, sink replacement.
#include <gtest/gtest.h>

#include <volt/core/log.h>

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

TEST(Log, WarnOncePrintsOncePerKey) {
  Capture c;
  EXPECT_TRUE(volt::warn_once("log_test.key", "X", "first"));
  EXPECT_FALSE(volt::warn_once("log_test.key", "X", "again"));
  EXPECT_TRUE(volt::warn_once("log_test.other", "X", "other"));
  EXPECT_EQ(c.lines.size(), 2u);
}

}  // namespace
