#include <gtest/gtest.h>

#include <fstream>

#include "tiny.h"

namespace {

std::vector<std::string> lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(CSVLogger, VersionsIncrementAndHeaderWidens) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path).name("exp"));
  volt::CSVLogger b(volt::CSVLoggerOptions(dir.path).name("exp"));
  EXPECT_EQ(a.version(), 0);
  EXPECT_EQ(b.version(), 1);
  EXPECT_EQ(a.log_dir(), dir / "exp/version_0");
  a.log_hyperparams({{"lr", "0.1"}});
  a.log_metrics({{"loss", 1.5}}, 0);
  a.save();
  a.log_metrics({{"loss", 1.25}}, 1);
  a.save();  // appended
  a.log_metrics({{"acc", 0.5}}, 2);
  a.save();  // rewritten with the wider header
  EXPECT_EQ(lines(a.metrics_path()),
            (std::vector<std::string>{"step,loss,acc", "0,1.5,", "1,1.25,", "2,,0.5"}));
  EXPECT_EQ(lines(dir / "exp/version_0/hparams.yaml"), (std::vector<std::string>{"lr: 0.1"}));
}

TEST(CSVLogger, ResumeDropsRowsAfterTheCheckpoint) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path));
  for (int s = 0; s < 6; ++s) a.log_metrics({{"loss", double(s)}}, s);
  a.save();
  torch::serialize::OutputArchive out;
  a.save_state(out);
  std::stringstream buf;
  out.save_to(buf);
  torch::serialize::InputArchive in;
  in.load_from(buf);
  volt::CSVLogger b(volt::CSVLoggerOptions(dir.path));
  b.load_state(in, /*step=*/3);
  EXPECT_EQ(b.version(), 0);
  b.log_metrics({{"loss", 30.0}}, 3);
  b.save();
  EXPECT_EQ(lines(b.metrics_path()),
            (std::vector<std::string>{"step,loss", "0,0", "1,1", "2,2", "3,30"}));
}

TEST(CSVLogger, InvalidOptions) {
  EXPECT_THROW(volt::CSVLogger(volt::CSVLoggerOptions("")), volt::ConfigError);
  EXPECT_THROW(volt::CSVLogger(volt::CSVLoggerOptions("x").version(-3)), volt::ConfigError);
}

}  // namespace
