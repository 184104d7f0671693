// TensorBoardLogger: event files read back by an independent stdlib-only Python reader
// (tools/read_tfevents.py) that checks every record's framing and both CRCs.
#include <gtest/gtest.h>

#include <dirent.h>

#include <yaml-cpp/yaml.h>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "build_paths.h"
#include "python_tool.h"
#include "tiny.h"

namespace {

volt_test::ToolRun read_events(const std::string& path) {
  return volt_test::run_python_tool("read_tfevents.py", {path}, /*merge_stderr=*/true);
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.find("tfevents") != std::string::npos) out.push_back(dir + "/" + n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(TensorBoardLogger, MaskedCrc32cMatchesTheStandardCheckValue) {
  // CRC-32C("123456789") = 0xE3069283 (RFC 3720 check value); undo TFRecord's mask.
  const uint32_t masked = volt::tfrecord_masked_crc32c("123456789", 9);
  const uint32_t c = masked - 0xa282ead8u;
  EXPECT_EQ((c << 15) | (c >> 17), 0xE3069283u);
}

// Lightning's TensorBoardLogger writes hparams.yaml beside the events too; volt report and the
// tools reading a run folder find the hparams there (a TensorBoard-only run showed none).
TEST(TensorBoardLogger, WritesHparamsYamlBesideTheEventsMergingEachCall) {
  volt_test::TempDir dir;
  volt::TensorBoardLogger logger(volt::TensorBoardLoggerOptions(dir.path));
  logger.log_hyperparams({{"lr", "0.001"}, {"note", "a: b"}});
  logger.log_hyperparams({{"lr", "0.01"}, {"flag", "yes"}});
  const YAML::Node n = YAML::LoadFile(logger.log_dir() + "/hparams.yaml");
  ASSERT_TRUE(n.IsMap());
  EXPECT_EQ(n.size(), 3u);
  EXPECT_EQ(n["lr"].as<std::string>(), "0.01");
  EXPECT_EQ(n["note"].as<std::string>(), "a: b");
  // Quoted: PyYAML (YAML 1.1) would read a plain yes as a boolean.
  std::ifstream in(logger.log_dir() + "/hparams.yaml");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("flag: \"yes\""), std::string::npos) << text;
  logger.finalize(volt::RunStatus::kFinished);
}

TEST(TensorBoardLogger, IndependentReaderVerifiesEveryRecordAndValue) {
  volt_test::TempDir dir;
  volt::TensorBoardLogger logger(
      volt::TensorBoardLoggerOptions(dir.path).flush_logs_every_n_steps(7));
  // "0x1F" and "010" are text (strtod took the first as 31), as Lightning sends a str value.
  logger.log_hyperparams(
      {{"lr", "0.001"}, {"net", "mlp"}, {"batch_size", "64"}, {"hex", "0x1F"}, {"id", "010"}});
  std::vector<std::pair<int64_t, volt::Metrics>> logged;
  for (int64_t s = 1; s <= 25; ++s) {
    volt::Metrics m{{"train_loss", 1.0 / s}, {"lr", 0.001 * s}};
    if (s % 5 == 0) m["val_acc"] = 0.5 + 0.01 * s;
    logger.log_metrics(m, s);
    logged.emplace_back(s, m);
  }
  logger.finalize(volt::RunStatus::kFinished);
  auto files = event_files(logger.log_dir());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(logger.log_dir().find("volt_logs/version_0"), std::string::npos);
  auto r = read_events(files[0]);
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["file_version"], "brain.Event:2");
  // version, hp_metric, hparams, metrics, session end
  EXPECT_EQ(j["records"], 1 + 1 + 1 + 25 + 1);
  EXPECT_EQ(j["hparams"]["lr"], 0.001);
  EXPECT_EQ(j["hparams"]["batch_size"], 64.0);
  EXPECT_EQ(j["hparams"]["net"], "mlp");
  EXPECT_EQ(j["hparams"]["hex"], "0x1F");
  EXPECT_EQ(j["hparams"]["id"], "010");
  // No experiment summary: TensorBoard builds the experiment from the runs, with every scalar
  // tag as a metric column (one listing only the hparams showed no metric columns at all).
  EXPECT_EQ(j["experiment_hparams"].size(), 0u);
  EXPECT_EQ(j["session_end_status"], 1);
  // Lightning's default_hp_metric: hp_metric = -1 at step 0, with the hyper-parameters.
  ASSERT_GE(j["scalars"].size(), 1u);
  EXPECT_EQ(j["scalars"][0][0], "hp_metric");
  EXPECT_EQ(j["scalars"][0][1], 0);
  EXPECT_FLOAT_EQ(j["scalars"][0][2].get<float>(), -1.0f);
  size_t i = 1;
  for (const auto& [step, m] : logged) {
    for (const auto& [tag, value] : m) {
      ASSERT_LT(i, j["scalars"].size());
      const auto& s = j["scalars"][i++];
      EXPECT_EQ(s[0], tag);
      EXPECT_EQ(s[1], step);
      EXPECT_FLOAT_EQ(s[2].get<float>(), static_cast<float>(value));
    }
  }
  EXPECT_EQ(i, j["scalars"].size());
}

// prefix puts "<prefix>-" before every tag (hp_metric's too); default_hp_metric=false logs none.
TEST(TensorBoardLogger, PrefixAndDefaultHpMetric) {
  volt_test::TempDir dir;
  volt::TensorBoardLogger logger(
      volt::TensorBoardLoggerOptions(dir.path).prefix("fold1").version(3));
  EXPECT_EQ(logger.version_name(), "3");
  EXPECT_EQ(logger.root_dir(), dir.path + "/volt_logs");
  logger.log_hyperparams({{"lr", "0.1"}});
  logger.log_metrics({{"loss", 0.5}}, 1);
  logger.finalize(volt::RunStatus::kFinished);
  auto r = read_events(event_files(logger.log_dir()).at(0));
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["scalars"].size(), 2u) << r.out;
  EXPECT_EQ(j["scalars"][0][0], "fold1-hp_metric");
  EXPECT_EQ(j["scalars"][1][0], "fold1-loss");

  volt::TensorBoardLogger plain(
      volt::TensorBoardLoggerOptions(dir.path).name("plain").default_hp_metric(false));
  plain.log_hyperparams({{"lr", "0.1"}});
  plain.log_metrics({{"loss", 0.5}}, 1);
  plain.finalize(volt::RunStatus::kFinished);
  r = read_events(event_files(plain.log_dir()).at(0));
  ASSERT_EQ(r.status, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["scalars"].size(), 1u) << r.out;
  EXPECT_EQ(j["scalars"][0][0], "loss");
  EXPECT_EQ(j["hparams"]["lr"], 0.1);
}

// The hparams plugin's Status has no "aborted": 3 is RUNNING. A failed run ends FAILURE (2); an
// interrupted one records no end (TensorBoard keeps the first, and the run may be resumed).
TEST(TensorBoardLogger, SessionEndStatusIsTheHparamsPluginsOwn) {
  volt_test::TempDir dir;
  for (const auto& [status, expected] : std::vector<std::pair<volt::RunStatus, nlohmann::json>>{
           {volt::RunStatus::kFinished, 1},
           {volt::RunStatus::kFailed, 2},
           {volt::RunStatus::kInterrupted, nullptr}}) {
    volt::TensorBoardLogger logger(volt::TensorBoardLoggerOptions(dir.path));
    logger.log_hyperparams({{"lr", "0.1"}});
    logger.log_metrics({{"loss", 0.5}}, 0);
    logger.finalize(status);
    auto r = read_events(logger.events_path());
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(nlohmann::json::parse(r.out)["session_end_status"], expected)
        << static_cast<int>(status);
  }
}

TEST(TensorBoardLogger, ReaderRejectsACorruptedRecord) {
  volt_test::TempDir dir;
  std::string path;
  {
    volt::TensorBoardLogger logger(volt::TensorBoardLoggerOptions(dir.path));
    logger.log_metrics({{"loss", 0.25}}, 3);
    logger.finalize(volt::RunStatus::kFinished);
    path = logger.events_path();
  }
  ASSERT_EQ(read_events(path).status, 0);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-6, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-6, std::ios::end);
  f.put(static_cast<char>(c ^ 0x40));
  f.close();
  auto r = read_events(path);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("CRC mismatch"), std::string::npos) << r.out;
}

TEST(TensorBoardLogger, TrainerRunAndResumeWriteStartMarker) {
  volt_test::TempDir dir;
  auto tb = std::make_shared<volt::TensorBoardLogger>(volt::TensorBoardLoggerOptions(dir / "tb"));
  volt_test::TinyClassifier model;
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(2).log_every_n_steps(4).loggers({tb}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
  auto r = read_events(tb->events_path());
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  std::set<int64_t> loss_steps;
  for (const auto& s : j["scalars"]) {
    if (s[0] == "train_loss") loss_steps.insert(s[1].get<int64_t>());
  }
  EXPECT_EQ(loss_steps, (std::set<int64_t>{3, 7, 11, 15}));  // every 4th step, 0-based as Lightning

  // A resumed logger opens a new file in the same version folder, starting with SessionLog START.
  torch::serialize::OutputArchive ar;
  tb->save_state(ar);
  std::ostringstream os;
  ar.save_to(os);
  torch::serialize::InputArchive in;
  std::istringstream is(os.str());
  in.load_from(is);
  volt::TensorBoardLogger resumed(volt::TensorBoardLoggerOptions(dir / "tb"));
  resumed.load_state(in, 8);
  resumed.log_metrics({{"train_loss", 0.1}}, 9);
  resumed.finalize(volt::RunStatus::kFinished);
  EXPECT_EQ(resumed.log_dir(), tb->log_dir());
  EXPECT_NE(resumed.events_path(), tb->events_path());
  auto j2 = nlohmann::json::parse(read_events(resumed.events_path()).out);
  EXPECT_EQ(j2["session_log_start_steps"], nlohmann::json::array({8}));
  // In Event.session_log (field 7), not in the deprecated log_message (6), which TensorBoard
  // never purges by (written there before session 81).
  EXPECT_EQ(j2["log_messages"], 0);
  EXPECT_EQ(event_files(tb->log_dir()).size(), 2u);

  // Resumed under another save_dir: a version of its own there, no START marker in a folder of
  // another run (before session 99 it took version_0 of whatever run was there).
  torch::serialize::InputArchive again;
  std::istringstream is2(os.str());
  again.load_from(is2);
  volt::TensorBoardLogger elsewhere(volt::TensorBoardLoggerOptions(dir / "tb2"));
  volt::TensorBoardLogger first(volt::TensorBoardLoggerOptions(dir / "tb2"));
  first.log_metrics({{"train_loss", 0.5}}, 1);
  first.finalize(volt::RunStatus::kFinished);
  elsewhere.load_state(again, 8);
  elsewhere.log_metrics({{"train_loss", 0.1}}, 9);
  elsewhere.finalize(volt::RunStatus::kFinished);
  EXPECT_EQ(first.version(), 0);
  EXPECT_EQ(elsewhere.version(), 1);
  EXPECT_EQ(
      nlohmann::json::parse(read_events(elsewhere.events_path()).out)["session_log_start_steps"],
      nlohmann::json::array());
}

// SummaryWriter also writes every flush_secs (120 s), so a run that logs rarely shows up before
// its tenth log call: here every call is due (flush_secs 0), where only the count decided.
TEST(TensorBoardLogger, ALogCallLongAfterTheLastWriteWritesTheRecords) {
  volt_test::TempDir dir;
  volt::TensorBoardLogger logger(
      volt::TensorBoardLoggerOptions(dir.path).flush_logs_every_n_steps(1000).flush_secs(0));
  logger.log_metrics({{"loss", 1.0}}, 1);
  const auto files = event_files(logger.log_dir());
  ASSERT_EQ(files.size(), 1u);
  auto r = read_events(files[0]);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["scalars"].size(), 1u);
  volt::TensorBoardLogger counted(
      volt::TensorBoardLoggerOptions(dir / "b").flush_logs_every_n_steps(1000));
  counted.log_metrics({{"loss", 1.0}}, 1);
  const auto none = event_files(counted.log_dir());
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(std::filesystem::file_size(none[0]), 0u);  // 120 s not passed: still buffered
}

TEST(TensorBoardLogger, RejectsBadOptionsAndUnwritableFolders) {
  EXPECT_THROW(volt::TensorBoardLogger(volt::TensorBoardLoggerOptions("")), volt::ConfigError);
  EXPECT_THROW(volt::TensorBoardLogger(volt::TensorBoardLoggerOptions("/tmp").version(-2)),
               volt::ConfigError);
  try {
    volt::TensorBoardLogger(volt::TensorBoardLoggerOptions("/tmp").flush_logs_every_n_steps(0));
    FAIL();
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("must be >= 1"), std::string::npos);
  }
  EXPECT_THROW(volt::TensorBoardLogger(volt::TensorBoardLoggerOptions("/tmp").flush_secs(-1)),
               volt::ConfigError);
  EXPECT_THROW(volt::TensorBoardLogger(volt::TensorBoardLoggerOptions("/tmp").flush_secs(NAN)),
               volt::ConfigError);
  volt::TensorBoardLogger bad(volt::TensorBoardLoggerOptions("/proc/volt_cannot_write"));
  try {
    bad.log_metrics({{"x", 1.0}}, 1);
    FAIL();
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create folder"), std::string::npos) << e.what();
  }
}

}  // namespace
