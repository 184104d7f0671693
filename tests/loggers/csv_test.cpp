#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <malloc.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "log_capture.h"
#include "peak_rss.h"
#include "reread.h"
#include "tiny.h"

namespace {

// Bytes the C library's allocator has handed out and not taken back (all arenas, mmapped
// blocks included).
size_t heap_in_use() {
  const struct mallinfo2 m = ::mallinfo2();
  return m.uordblks + m.hblkhd;
}

std::vector<std::string> lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// A folder named like a version but past int64 is not volt's: skipped, not a std::out_of_range
// that stops the run before it starts (as before session 22).
TEST(CSVLogger, AVersionFolderPastInt64IsIgnored) {
  volt_test::TempDir dir;
  ASSERT_EQ(::mkdir((dir / "exp").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((dir / "exp/version_4").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((dir / "exp/version_99999999999999999999").c_str(), 0755), 0);
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path).name("exp"));
  EXPECT_EQ(a.version(), 5);
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
  auto in = volt_test::reread(out);
  volt::CSVLogger b(volt::CSVLoggerOptions(dir.path));
  b.load_state(in, /*step=*/3);
  EXPECT_EQ(b.version(), 0);
  b.log_metrics({{"loss", 30.0}}, 3);
  b.save();
  EXPECT_EQ(lines(b.metrics_path()),
            (std::vector<std::string>{"step,loss", "0,0", "1,1", "2,2", "3,30"}));
}

// Logs one row ("0,1"), flushes it, and returns the logger's checkpoint state.
torch::serialize::OutputArchive one_row_state(volt::CSVLogger& a) {
  a.log_metrics({{"loss", 1.0}}, 0);
  a.save();
  torch::serialize::OutputArchive out;
  a.save_state(out);
  return out;
}

// A profiler or callback asking log_dir() before the restore claimed the next version's folder,
// which the resumed logger then left empty beside the run's own (a stray version_1 per resume).
TEST(CSVLogger, AVersionClaimedBeforeTheResumeIsGivenBackWhenEmpty) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path));
  torch::serialize::OutputArchive out = one_row_state(a);
  auto in = volt_test::reread(out);
  volt::CSVLogger b(volt::CSVLoggerOptions(dir.path));
  EXPECT_NE(b.log_dir().find("version_1"), std::string::npos);  // claimed early
  ASSERT_TRUE(std::filesystem::is_directory(dir / "volt_logs/version_1"));
  b.load_state(in, /*step=*/1);
  EXPECT_EQ(b.version(), 0);
  EXPECT_FALSE(std::filesystem::exists(dir / "volt_logs/version_1"));
  // A folder holding files stays.
  volt::CSVLogger c(volt::CSVLoggerOptions(dir.path));
  std::ofstream(c.log_dir() + "/notes.txt") << "mine";
  auto again = volt_test::reread(out);
  c.load_state(again, 1);
  EXPECT_TRUE(std::filesystem::exists(dir / "volt_logs/version_1/notes.txt"));
}

// A checkpoint's logger state continues its version only in the same save_dir/name and when no
// other version is asked for. Before session 99 a run resumed into another save_dir took the
// number alone: it dropped the rows after the checkpoint's step of whatever run held that
// version there, and wrote into its folder.
TEST(CSVLogger, AResumeIntoAnotherFolderOrVersionKeepsItsOwnVersion) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir / "a"));
  for (int s = 0; s < 6; ++s) a.log_metrics({{"loss", double(s)}}, s);
  a.save();
  torch::serialize::OutputArchive out;
  a.save_state(out);
  // Another run's version_0 under b.
  volt::CSVLogger other(volt::CSVLoggerOptions(dir / "b"));
  for (int s = 0; s < 6; ++s) other.log_metrics({{"acc", double(s)}}, s);
  other.save();
  const auto others = lines(other.metrics_path());

  auto in = volt_test::reread(out);
  volt::CSVLogger b(volt::CSVLoggerOptions(dir / "b"));
  const auto said = volt_test::capture_logs([&] { b.load_state(in, /*step=*/3); });
  EXPECT_TRUE(volt_test::has(said, "this run logs into a version of its own there")) << said.size();
  b.log_metrics({{"loss", 30.0}}, 3);
  b.save();
  EXPECT_EQ(b.version(), 1);
  EXPECT_EQ(lines(other.metrics_path()), others);  // untouched
  EXPECT_EQ(lines(b.metrics_path()), (std::vector<std::string>{"step,loss", "3,30"}));

  // The same folder, but version 4 asked for: version 4, a's file untouched.
  auto again = volt_test::reread(out);
  volt::CSVLogger c(volt::CSVLoggerOptions(dir / "a").version(4));
  c.load_state(again, 3);
  c.log_metrics({{"loss", 40.0}}, 3);
  c.save();
  EXPECT_EQ(c.version(), 4);
  EXPECT_EQ(lines(a.metrics_path()).size(), 7u);

  // The same folder written another way (a trailing '.' part) and version 0 asked for: resumed.
  auto same = volt_test::reread(out);
  volt::CSVLogger d(volt::CSVLoggerOptions(dir / "a/.").version(0));
  d.load_state(same, 3);
  d.log_metrics({{"loss", 50.0}}, 3);
  d.save();
  EXPECT_EQ(lines(a.metrics_path()),
            (std::vector<std::string>{"step,loss", "0,0", "1,1", "2,2", "3,50"}));

  // A new run told version 0 of b, which holds the other run's rows: they are replaced, with
  // Lightning's warning (before session 99, silently).
  volt::CSVLogger e(volt::CSVLoggerOptions(dir / "b").version(0));
  e.log_metrics({{"loss", 60.0}}, 0);
  const auto replaced = volt_test::capture_logs([&] { e.save(); });
  EXPECT_TRUE(volt_test::has(replaced, "holds rows of an earlier run")) << replaced.size();
  EXPECT_EQ(lines(e.metrics_path()), (std::vector<std::string>{"step,loss", "0,60"}));
}

// A checkpoint writes the loggers' buffered rows first: the rows logged before it are on disk
// when it is (a run killed later resumes after the checkpoint's step, so rows still buffered
// then were lost for good before session 99: here the 100-step flush had written none).
TEST(CSVLogger, ACheckpointWritesTheBufferedRowsFirst) {
  volt_test::TempDir dir;
  auto csv = std::make_shared<volt::CSVLogger>(volt::CSVLoggerOptions(dir / "logs"));
  struct ReadsTheFile : volt::Callback {
    explicit ReadsTheFile(std::shared_ptr<volt::CSVLogger> l) : logger(std::move(l)) {}
    std::string state_key() const override { return "ReadsTheFile"; }
    void on_train_batch_start(volt::RunContext&, volt::Module&, const volt::Batch&,
                              int64_t batch_idx) override {
      if (batch_idx == 6) rows = lines(logger->metrics_path());
    }
    std::shared_ptr<volt::CSVLogger> logger;
    std::vector<std::string> rows;
  };
  auto reads = std::make_shared<ReadsTheFile>(csv);
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "ckpt").every_n_train_steps(5));
  volt_test::TinyClassifier model;
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_steps(8).log_every_n_steps(1).loggers({csv}).callbacks(
          {reads, ckpt}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(160)));
  // The header and the rows of steps 0-5: the Trainer writes each row as it logs it (Lightning
  // saves its loggers after every log call), whatever flush_logs_every_n_steps says.
  ASSERT_EQ(reads->rows.size(), 7u);
  EXPECT_EQ(reads->rows[6].substr(0, 2), "5,") << reads->rows[6];
}

// prefix: "<prefix>-" before every column name (a logged "step" too, as Lightning renames it
// before its writer sets the step); version_name and root_dir as Lightning's version / root_dir.
TEST(CSVLogger, PrefixNamesEveryColumn) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path).prefix("fold1"));
  EXPECT_EQ(a.version_name(), "0");
  EXPECT_EQ(a.root_dir(), dir.path + "/volt_logs");
  a.log_metrics({{"loss", 0.5}, {"step", 3}}, 1);
  a.save();
  const auto rows = lines(a.metrics_path());
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0], "step,fold1-loss,fold1-step");
  EXPECT_EQ(rows[1], "1,0.5,3");
}

TEST(CSVLogger, HparamsYamlReadsBackAsTheSameStrings) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path));
  // Each of these was misread when hparams.yaml was concatenated text: a second mapping, a
  // comment, a boolean, a null, a list, a broken line.
  const std::map<std::string, std::string> hp = {{"net", "Linear(in: 8, out: 2)"},
                                                 {"note", "lr # tuned"},
                                                 {"flag", "yes"},
                                                 {"empty", "null"},
                                                 {"off", "Off"},
                                                 {"tilde", "~"},
                                                 {"list", "- x"},
                                                 {"quote", "say \"hi\""},
                                                 {"multi", "two\nlines"},
                                                 {"blank", ""},
                                                 {"lr", "0.1"},
                                                 {"key: with colon", "v"},
                                                 // PyYAML reads these as numbers or a date
                                                 {"octal", "010"},
                                                 {"sexagesimal", "1:20"},
                                                 {"hex", "0x1F"},
                                                 {"underscored", "1_000"},
                                                 {"dot", ".5"},
                                                 {"plus", "+5"},
                                                 {"date", "2024-01-02"},
                                                 {"negative", "-3"},
                                                 {"exponent", "1e-05"}};
  a.log_hyperparams(hp);
  const YAML::Node n = YAML::LoadFile(dir / "volt_logs/version_0/hparams.yaml");
  ASSERT_TRUE(n.IsMap());
  EXPECT_EQ(n.size(), hp.size());
  for (const auto& [k, v] : hp) {
    ASSERT_TRUE(n[k].IsScalar()) << k;
    EXPECT_EQ(n[k].Scalar(), v) << k;
  }
  // Quoted where a YAML 1.1 reader (PyYAML) would see a boolean or null; numbers stay plain.
  for (const char* k : {"flag", "empty", "off", "tilde", "octal", "sexagesimal", "hex",
                        "underscored", "dot", "plus", "date"}) {
    EXPECT_EQ(n[k].Tag(), "!") << k;
  }
  // Numbers as C++ and Python print them stay plain: they read back as the same number.
  for (const char* k : {"lr", "negative", "exponent"}) EXPECT_EQ(n[k].Tag(), "?") << k;
  EXPECT_EQ(n["lr"].as<double>(), 0.1);
  // An empty map is still valid YAML.
  volt::CSVLogger b(volt::CSVLoggerOptions(dir.path));
  b.log_hyperparams({});
  EXPECT_TRUE(YAML::LoadFile(dir / "volt_logs/version_1/hparams.yaml").IsMap());
}

// Lightning's ExperimentWriter merges each log_hparams into the ones before (the Trainer's own
// call at fit erased what a program logged before it; a second Fabric call the first's).
TEST(CSVLogger, HyperparametersOfSeveralCallsAreMerged) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path));
  a.log_hyperparams({{"a", "1"}, {"lr", "0.1"}});
  a.log_hyperparams({{"b", "2"}, {"lr", "0.2"}});
  EXPECT_EQ(lines(dir / "volt_logs/version_0/hparams.yaml"),
            (std::vector<std::string>{"a: 1", "b: 2", "lr: 0.2"}));
}

// A metric named "step" is the row's step, not a second "step" column: the header
// "step,step,loss" could not be read back, so a resume (and `volt report`) failed.
TEST(CSVLogger, AMetricNamedStepIsNotAColumnAndTheFileResumes) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path));
  a.log_metrics({{"step", 5.0}, {"loss", 1.0}}, 0);
  a.log_metrics({{"step", 6.0}, {"loss", 2.0}}, 1);
  a.save();
  EXPECT_EQ(lines(a.metrics_path()), (std::vector<std::string>{"step,loss", "0,1", "1,2"}));
  torch::serialize::OutputArchive out;
  a.save_state(out);
  auto in = volt_test::reread(out);
  volt::CSVLogger b(volt::CSVLoggerOptions(dir.path));
  EXPECT_NO_THROW(b.load_state(in, /*step=*/1));
  b.log_metrics({{"loss", 3.0}}, 1);
  b.save();
  EXPECT_EQ(lines(b.metrics_path()), (std::vector<std::string>{"step,loss", "0,1", "1,3"}));
}

TEST(CSVLogger, ResumeReadsQuotedMetricNames) {
  volt_test::TempDir dir;
  // The writer quotes names holding a comma or a quote; resume split the header at every comma,
  // so these two columns became four and the values landed under the wrong names.
  const std::string odd = "val,loss \"top\"";
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path).flush_logs_every_n_steps(1));
  for (int s = 0; s < 4; ++s) a.log_metrics({{odd, double(s)}, {"acc", s / 10.0}}, s);
  EXPECT_EQ(lines(a.metrics_path()).front(), "step,acc,\"val,loss \"\"top\"\"\"");
  torch::serialize::OutputArchive out;
  a.save_state(out);
  auto in = volt_test::reread(out);
  // A run killed while appending leaves half a line behind.
  std::ofstream(a.metrics_path(), std::ios::app) << "4,0.4,4";
  volt::CSVLogger b(volt::CSVLoggerOptions(dir.path));
  b.load_state(in, /*step=*/2);
  b.log_metrics({{odd, 20.0}}, 2);
  b.save();
  EXPECT_EQ(lines(b.metrics_path()), (std::vector<std::string>{"step,acc,\"val,loss \"\"top\"\"\"",
                                                               "0,0,0", "1,0.1,1", "2,,20"}));
}

// A version folder whose metrics.csv Lightning wrote ("step" among the sorted names, CRLF,
// "1.0"): the resumed logger reads every row's values by name and rewrites the file in its own
// layout, step first, the rows from the checkpoint's step on dropped.
TEST(CSVLogger, ResumeReadsAFileWhoseStepIsNotTheFirstColumn) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path));
  a.log_metrics({{"train_loss", 1.0}}, 0);
  a.save();
  torch::serialize::OutputArchive out;
  a.save_state(out);
  auto in = volt_test::reread(out);
  std::ofstream(a.metrics_path(), std::ios::trunc | std::ios::binary)
      << "epoch,step,train_loss,val_loss\r\n0,0,1.0,\r\n0,1,0.5,\r\n0,1,,0.75\r\n"
         "1,2,0.25,\r\n";
  volt::CSVLogger b(volt::CSVLoggerOptions(dir.path));
  b.load_state(in, /*step=*/2);
  b.log_metrics({{"train_loss", 0.125}, {"epoch", 1.0}}, 2);
  b.save();
  EXPECT_EQ(lines(b.metrics_path()),
            (std::vector<std::string>{"step,epoch,train_loss,val_loss", "0,0,1,", "1,0,0.5,",
                                      "1,0,,0.75", "2,1,0.125,"}));
}

/// What a logger resuming at step 5 throws (the DataError's message) when the run's metrics.csv
/// holds `text`; "<no DataError>" when it resumes.
std::string resume_error_with(const std::string& text) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path));
  torch::serialize::OutputArchive out = one_row_state(a);
  std::ofstream(a.metrics_path(), std::ios::trunc) << text;
  auto in = volt_test::reread(out);
  volt::CSVLogger b(volt::CSVLoggerOptions(dir.path));
  try {
    b.load_state(in, 5);
  } catch (const volt::DataError& e) {
    return e.what();
  }
  return "<no DataError>";
}

TEST(CSVLogger, ResumeFromACorruptedFileIsADataError) {
  const std::string m = resume_error_with("step,loss\n0,1\nx1,2\n");
  EXPECT_NE(m.find("metrics.csv:3: step 'x1' is not an integer"), std::string::npos) << m;
}

// A header the logger could not have written is refused as `volt report` refuses it (found by
// fuzz_metrics_csv, session 90): before, a column named twice was kept twice, and the file the
// resumed run rewrote had the duplicate header the report refuses.
TEST(CSVLogger, ResumeRefusesAHeaderItCouldNotHaveWritten) {
  const std::string twice = resume_error_with("step,a,a\n0,1,2\n");
  EXPECT_NE(twice.find("[CSVLogger] "), std::string::npos) << twice;
  EXPECT_NE(twice.find("metrics.csv:1: column 'a' appears twice in the header; repair the header"),
            std::string::npos)
      << twice;
  EXPECT_NE(resume_error_with("epoch,a,b\n0,1,2\n").find("has no 'step' column"),
            std::string::npos);
  EXPECT_NE(resume_error_with("step,a,step\n0,1,2\n").find("column 'step' appears twice"),
            std::string::npos);
  EXPECT_NE(resume_error_with("step,a,\n0,1,2\n").find("column 3 of the header has no name"),
            std::string::npos);
  EXPECT_EQ(resume_error_with("step,a,b\n0,1,2\n"), "<no DataError>");
}

// Values are written as the shortest text that reads back as the same double (Python's repr,
// which Lightning writes); "%.10g" before session 81 turned 12345678901 into 1.23456789e+10.
TEST(CSVLogger, ValuesRoundTripExactly) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path));
  const double big = 12345678901.0, sum = 0.1 + 0.2, tiny = 1e-300;
  a.log_metrics({{"a", big}, {"b", sum}, {"c", tiny}}, 0);
  a.save();
  const auto got = lines(a.metrics_path());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1], "0,12345678901,0.30000000000000004,1e-300");
}

// Rows reach the disk when the step passes a multiple of flush_logs_every_n_steps (Lightning's
// (step + 1) % n == 0), not after n log calls: with log_every_n_steps=50 that was one write per
// 5000 steps before session 81.
TEST(CSVLogger, RowsAreFlushedWhenTheStepPassesAMultipleOfTheFlushInterval) {
  volt_test::TempDir dir;
  volt::CSVLogger every50(volt::CSVLoggerOptions(dir / "a"));  // default 100
  every50.log_metrics({{"loss", 1.0}}, 49);
  EXPECT_FALSE(std::ifstream(every50.metrics_path()).good());
  every50.log_metrics({{"loss", 2.0}}, 99);
  EXPECT_EQ(lines(every50.metrics_path()).size(), 3u);  // header and both rows
  every50.log_metrics({{"loss", 3.0}}, 149);
  EXPECT_EQ(lines(every50.metrics_path()).size(), 3u);
  // An interval that does not divide 100: written at the first step past each multiple.
  volt::CSVLogger every30(volt::CSVLoggerOptions(dir / "b"));
  for (int64_t step : {29, 59, 89}) every30.log_metrics({{"loss", 1.0}}, step);
  EXPECT_FALSE(std::ifstream(every30.metrics_path()).good());
  every30.log_metrics({{"loss", 1.0}}, 119);
  EXPECT_EQ(lines(every30.metrics_path()).size(), 5u);
}

// Rows logged at one step (a Fabric loop logging without stepping: its default step stays) are
// written every flush_logs_every_n_steps rows: before session 99 they stayed buffered, without
// bound, until the logger closed. An empty metric name is a ValueError (its header could not be
// read back by a resume or volt report).
TEST(CSVLogger, RowsAtOneStepAreFlushedEveryNRowsAndAnEmptyNameIsRefused) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path).flush_logs_every_n_steps(10));
  for (int i = 0; i < 9; ++i) a.log_metrics({{"acc", 0.5}}, 0);
  EXPECT_FALSE(std::ifstream(a.metrics_path()).good());
  a.log_metrics({{"acc", 0.5}}, 0);
  EXPECT_EQ(lines(a.metrics_path()).size(), 11u);
  for (int i = 0; i < 25; ++i) a.log_metrics({{"acc", 0.5}}, 0);
  EXPECT_EQ(lines(a.metrics_path()).size(), 31u);  // 5 still buffered
  try {
    a.log_metrics({{"", 1.0}}, 0);
    ADD_FAILURE() << "no error";
  } catch (const volt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("a metric has an empty name"), std::string::npos);
  }
  a.save();
  EXPECT_EQ(lines(a.metrics_path()).size(), 36u);
  EXPECT_EQ(lines(a.metrics_path())[0], "step,acc");
}

// An append that fails (a full disk) is an error and loses no row: the next save rewrites the
// file (before session 81 the rows were dropped without a word). The disk fills part-way through
// the append (RLIMIT_FSIZE), leaving rows and a torn line behind: the rewrite keeps the rows
// written before that append once each (since session 92 it copies the file's rows, up to what
// was whole, instead of keeping every row of the run in memory).
TEST(CSVLogger, AFailedAppendIsAnErrorAndTheRowsAreWrittenLater) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path).flush_logs_every_n_steps(1000000));
  a.log_metrics({{"loss", 1.0}}, 0);
  a.save();
  const std::string path = a.metrics_path();
  std::vector<std::string> expected = {"step,loss", "0,1"};
  for (int s = 1; s <= 50; ++s) {
    a.log_metrics({{"loss", 2.0}}, s);
    expected.push_back(std::to_string(s) + ",2");
  }
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  rlimit small = saved;
  small.rlim_cur = static_cast<rlim_t>(st.st_size) + 100;  // room for about 20 of the 50 rows
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  try {
    a.save();
  } catch (const volt::ConfigError& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find("free disk space"), std::string::npos) << e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);  // the disk has room again
  std::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(threw);
  EXPECT_GT(lines(path).size(), 10u);  // the append wrote part of its rows
  a.save();
  EXPECT_EQ(lines(path), expected);
}

// The logger kept every row of the run in memory to rewrite the file when a new metric appeared
// (about 390 bytes per row of four metrics: a run logging every step grew without bound; 78.7
// MB held for these 200,000 rows, measured). It keeps only the rows not written yet now: a rewrite
// reads the written rows back from the file and widens them.
TEST(CSVLogger, MemoryHoldsOnlyTheRowsNotYetWritten) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path));
  a.log_metrics({{"loss", 0.0}}, 0);
  a.save();
  const size_t before = heap_in_use();
  constexpr int64_t kRows = 200000;
  for (int64_t s = 1; s < kRows; ++s) {
    a.log_metrics({{"loss", 0.5}, {"acc", 0.25}, {"lr", 0.125}, {"grad_norm", 1.5}}, s);
  }
  const size_t after = heap_in_use();
  EXPECT_LT(after > before ? after - before : 0, size_t{8} << 20) << "bytes held";
  a.log_metrics({{"val_loss", 0.75}}, kRows);
  a.save();
  const auto got = lines(a.metrics_path());
  ASSERT_EQ(got.size(), size_t{kRows} + 2);
  EXPECT_EQ(got[0], "step,loss,acc,grad_norm,lr,val_loss");
  EXPECT_EQ(got[1], "0,0,,,,");
  EXPECT_EQ(got[2], "1,0.5,0.25,1.5,0.125,");
  EXPECT_EQ(got[kRows], "199999,0.5,0.25,1.5,0.125,");
  EXPECT_EQ(got[kRows + 1], "200000,,,,,0.75");
}

// A resume read the whole metrics.csv into memory, then every cell of it as a string, then kept
// the rows before the checkpoint (242 MB more at the peak for this 14 MB file of a million rows,
// measured). It reads one record at a time now and keeps none: the next save copies them.
TEST(CSVLogger, ResumeReadsTheFileInTheMemoryOfARow) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path));
  torch::serialize::OutputArchive out = one_row_state(a);
  constexpr int kRows = 1000000;
  {
    std::string text = "step,loss,acc\n";
    for (int s = 0; s < kRows; ++s) text += std::to_string(s) + ",0.5,0.25\n";
    std::ofstream(a.metrics_path(), std::ios::trunc) << text;
  }
  auto in = volt_test::reread(out);
  volt::CSVLogger b(volt::CSVLoggerOptions(dir.path));
  const long before = volt_test::peak_rss_kb();
  b.load_state(in, kRows / 2);
  b.log_metrics({{"loss", 7.0}}, kRows / 2);
  b.save();
  // (A high-water mark: run alone, as ctest does, it sees this test's allocations.)
  EXPECT_LT(volt_test::peak_rss_kb() - before, 32 * 1024) << "KB more at the peak";
  const auto got = lines(b.metrics_path());
  ASSERT_EQ(got.size(), size_t{kRows} / 2 + 2);
  EXPECT_EQ(got[1], "0,0.5,0.25");
  EXPECT_EQ(got[kRows / 2], std::to_string(kRows / 2 - 1) + ",0.5,0.25");
  EXPECT_EQ(got.back(), std::to_string(kRows / 2) + ",7,");
}

// Loggers started at once in one root take different versions: each claims its folder with its
// own mkdir (before session 81 both could read the same next free number).
TEST(CSVLogger, LoggersStartedAtOnceTakeDifferentVersions) {
  for (int round = 0; round < 20; ++round) {
    volt_test::TempDir dir;
    constexpr int kThreads = 4;
    std::vector<int64_t> versions(kThreads, -1);
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        volt::CSVLogger logger(volt::CSVLoggerOptions(dir.path));
        ++ready;
        while (ready.load() < kThreads) {
        }
        versions[t] = logger.version();
      });
    }
    for (auto& th : threads) th.join();
    std::sort(versions.begin(), versions.end());
    EXPECT_EQ(versions, (std::vector<int64_t>{0, 1, 2, 3})) << "round " << round;
  }
}

// A resume into a version folder without metrics.csv (nothing flushed before the checkpoint)
// starts the rows afresh: the logger used before kept its count of flushed rows, which the
// flush rule then read past the emptied rows with.
TEST(CSVLogger, AResumeWithoutAFileStartsTheRowsAfresh) {
  volt_test::TempDir dir;
  volt::CSVLogger a(volt::CSVLoggerOptions(dir.path));
  torch::serialize::OutputArchive out = one_row_state(a);
  auto in = volt_test::reread(out);
  ASSERT_EQ(std::remove(a.metrics_path().c_str()), 0);
  a.load_state(in, 0);
  a.log_metrics({{"loss", 5.0}}, 99);  // passes a multiple of 100: saved
  EXPECT_EQ(lines(a.metrics_path()), (std::vector<std::string>{"step,loss", "99,5"}));
}

TEST(CSVLogger, InvalidOptions) {
  EXPECT_THROW(volt::CSVLogger(volt::CSVLoggerOptions("")), volt::ConfigError);
  EXPECT_THROW(volt::CSVLogger(volt::CSVLoggerOptions("x").version(-3)), volt::ConfigError);
}

}  // namespace
