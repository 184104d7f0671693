#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <thread>

#include "file_text.h"
#include "log_capture.h"
#include "requires.h"
#include "tiny.h"

namespace {

// Logs a scripted validation score per epoch: 5, 3, 4, 1, 2.
class Scripted : public volt_test::TinyClassifier {
 public:
  void validation_step(const volt::Batch&, int64_t) override {
    static const double s[] = {5, 3, 4, 1, 2, 6, 7, 8};
    log("score", s[current_epoch()]);
  }
};

bool exists(const std::string& p) {
  return std::ifstream(p).good();
}

TEST(ModelCheckpoint, KeepsTopKAndTracksBest) {
  volt_test::TempDir dir;
  Scripted model;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                          .dirpath(dir / "c")
                                                          .monitor("score")
                                                          .save_top_k(2)
                                                          .filename("{epoch}-{score:.1f}")
                                                          .save_last(true));
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(5).callbacks({ckpt}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(ckpt->best_model_path(), dir / "c/epoch=3-score=1.0.ckpt");
  EXPECT_DOUBLE_EQ(*ckpt->best_model_score(), 1.0);
  EXPECT_EQ(ckpt->best_k_models().size(), 2u);
  EXPECT_TRUE(exists(dir / "c/epoch=3-score=1.0.ckpt"));
  EXPECT_TRUE(exists(dir / "c/epoch=4-score=2.0.ckpt"));
  EXPECT_FALSE(exists(dir / "c/epoch=1-score=3.0.ckpt"));
  EXPECT_FALSE(exists(dir / "c/epoch=0-score=5.0.ckpt"));
  EXPECT_TRUE(exists(dir / "c/last.ckpt"));
  // The best checkpoint loads into a fresh module for testing.
  Scripted fresh;
  volt::Trainer t2(volt_test::quiet(dir.path));
  EXPECT_NO_THROW(t2.test(fresh, volt_test::loader(volt_test::blobs(32)), ckpt->best_model_path()));
  EXPECT_TRUE(fresh.flat_params().defined());
}

std::shared_ptr<volt::ModelCheckpoint> top2(const std::string& dirpath) {
  return std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                     .dirpath(dirpath)
                                                     .monitor("score")
                                                     .save_top_k(2)
                                                     .filename("{epoch}-{score:.1f}")
                                                     .save_last(true));
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ModelCheckpoint, AResumeIntoTheSameFolderKeepsRankingAcrossTheRestart) {
  // Scores 5, 3, 4 in the first run, 1, 2 after the resume: the top 2 of all five epochs, so
  // the resumed run evicts files the first run wrote.
  volt_test::TempDir dir;
  Scripted first;
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(3).callbacks({top2(dir / "c")}));
  t.fit(first, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
  ASSERT_TRUE(exists(dir / "c/epoch=1-score=3.0.ckpt"));
  Scripted resumed;
  auto ckpt = top2(dir / "c");
  volt::Trainer t2(volt_test::quiet(dir.path).max_epochs(5).callbacks({ckpt}));
  t2.fit(resumed, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)),
         dir / "c/last.ckpt");
  EXPECT_EQ(files_in(dir / "c"), (std::vector<std::string>{"epoch=3-score=1.0.ckpt",
                                                           "epoch=4-score=2.0.ckpt", "last.ckpt"}));
  EXPECT_EQ(ckpt->best_model_path(), dir / "c/epoch=3-score=1.0.ckpt");
}

// A Scripted fit of `epochs` epochs under `root` with `ckpt`, resumed from `from` unless "".
void fit_scripted(const std::string& root, int64_t epochs,
                  const std::shared_ptr<volt::ModelCheckpoint>& ckpt, const std::string& from) {
  Scripted model;
  volt::Trainer t(volt_test::quiet(root).max_epochs(epochs).callbacks({ckpt}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)),
        from);
}

TEST(ModelCheckpoint, ATopKFileHoldsTheCallbacksStateAfterItsSave) {
  // Scores 5, 3 with the best 1 kept: epoch=1-score=3.0 replaces epoch=0-score=5.0. Its state
  // was the one before its own save (the list {epoch=0: 5}, the best epoch=0): a fit resumed
  // from it ranked against the deleted file, wrote epoch=2-score=4.0 (4 < 5) and lost track of
  // itself, which was never deleted and no longer the best.
  volt_test::TempDir dir;
  const auto top1 = [&] {
    return std::make_shared<volt::ModelCheckpoint>(
        volt::ModelCheckpointOptions().dirpath(dir / "c").monitor("score").filename(
            "{epoch}-{score:.1f}"));
  };
  const auto fit = [&](int64_t epochs, const std::shared_ptr<volt::ModelCheckpoint>& ckpt,
                       const std::string& from) { fit_scripted(dir.path, epochs, ckpt, from); };
  fit(2, top1(), "");
  const std::string b = dir / "c/epoch=1-score=3.0.ckpt";
  ASSERT_EQ(files_in(dir / "c"), (std::vector<std::string>{"epoch=1-score=3.0.ckpt"}));
  auto resumed = top1();
  fit(3, resumed, b);  // epoch 2 scores 4: not among the best 1
  EXPECT_EQ(files_in(dir / "c"), (std::vector<std::string>{"epoch=1-score=3.0.ckpt"}));
  EXPECT_EQ(resumed->best_k_models(), (std::map<std::string, double>{{b, 3.0}}));
  EXPECT_EQ(resumed->best_model_path(), b);
  // Epoch 3 scores 1 and replaces it, but the file the fit started from stays (Lightning's
  // _should_remove_checkpoint): the list forgets it, the disk keeps it.
  auto again = top1();
  fit(4, again, b);
  EXPECT_EQ(files_in(dir / "c"),
            (std::vector<std::string>{"epoch=1-score=3.0.ckpt", "epoch=3-score=1.0.ckpt"}));
  EXPECT_EQ(again->best_k_models(),
            (std::map<std::string, double>{{dir / "c/epoch=3-score=1.0.ckpt", 1.0}}));
}

// Scores 2, 2, 1.5 under names that sort against the save order (tag=9.0, tag=8.0, tag=7.0).
class TiedScores : public volt_test::TinyClassifier {
 public:
  void validation_step(const volt::Batch&, int64_t) override {
    static const double s[] = {2, 2, 1.5};
    log("score", s[current_epoch()]);
    log("tag", 9.0 - static_cast<double>(current_epoch()));
  }
};

TEST(ModelCheckpoint, AmongEqualScoresTheEarlierSaveIsTheBetter) {
  // Lightning's max / min over its insertion-ordered dict: of two equal scores the older file is
  // the best and the first evicted. volt went by the paths' alphabetical order, so which file
  // stayed depended on the filename template.
  volt_test::TempDir dir;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "c").monitor("score").save_top_k(2).filename(
          "{tag:.1f}"));
  TiedScores model;
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(2).callbacks({ckpt}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(ckpt->best_model_path(), dir / "c/tag=9.0.ckpt");  // epoch 0's
  // Resumed (the order is in the checkpoint), epoch 2's 1.5 evicts epoch 0's file.
  auto resumed = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                             .dirpath(dir / "c")
                                                             .monitor("score")
                                                             .save_top_k(2)
                                                             .filename("{tag:.1f}")
                                                             .save_last(true));
  TiedScores more;
  volt::Trainer t2(volt_test::quiet(dir.path).max_epochs(3).callbacks({resumed}));
  t2.fit(more, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)),
         dir / "c/tag=8.0.ckpt");
  EXPECT_EQ(files_in(dir / "c"),
            (std::vector<std::string>{"last.ckpt", "tag=7.0.ckpt", "tag=8.0.ckpt"}));
  EXPECT_EQ(resumed->best_model_path(), dir / "c/tag=7.0.ckpt");
}

TEST(ModelCheckpoint, AnotherRunsLastCheckpointGetsAVersionInsteadOfBeingOverwritten) {
  // Lightning's _save_last_checkpoint: a fresh fit into a folder holding another run's
  // last.ckpt writes last-v1.ckpt; a fit resumed from it goes on writing last-v1.ckpt. volt
  // wrote last.ckpt over the other run's (its resume point lost), while top-k names got "-v1".
  volt_test::TempDir dir;
  const auto with_last = [&] {
    return std::make_shared<volt::ModelCheckpoint>(
        volt::ModelCheckpointOptions().dirpath(dir / "c").save_top_k(0).save_last(true));
  };
  const auto fit = [&](int64_t epochs, const std::shared_ptr<volt::ModelCheckpoint>& ckpt,
                       const std::string& from) { fit_scripted(dir.path, epochs, ckpt, from); };
  fit(1, with_last(), "");
  const std::string first = volt_test::file_text(dir / "c/last.ckpt");
  auto second = with_last();
  fit(2, second, "");
  EXPECT_EQ(second->last_model_path(), dir / "c/last-v1.ckpt");
  EXPECT_EQ(files_in(dir / "c"), (std::vector<std::string>{"last-v1.ckpt", "last.ckpt"}));
  EXPECT_EQ(volt_test::file_text(dir / "c/last.ckpt"), first);
  // ckpt_path "last" resumes the newest, last-v1.ckpt, which the resumed fit keeps writing.
  auto resumed = with_last();
  fit(3, resumed, "last");
  EXPECT_EQ(resumed->last_model_path(), dir / "c/last-v1.ckpt");
  EXPECT_EQ(files_in(dir / "c"), (std::vector<std::string>{"last-v1.ckpt", "last.ckpt"}));
  EXPECT_EQ(volt_test::file_text(dir / "c/last.ckpt"), first);
}

TEST(ModelCheckpoint, AResumeIntoAnotherFolderLeavesTheResumedRunsFilesAlone) {
  // As Lightning: the folder is this run's (here another dirpath; by default
  // <log_dir>/checkpoints of this run's root), the ranking starts again there with a warning, and
  // the resumed run's files are neither replaced nor evicted. Before, the checkpoint's folder was
  // restored, so a run resumed under another root wrote into (and evicted from) the old one.
  volt_test::TempDir dir;
  Scripted first;
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(3).callbacks({top2(dir / "a")}));
  t.fit(first, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
  const auto before = files_in(dir / "a");
  const auto last_time = std::filesystem::last_write_time(dir / "a/last.ckpt");
  Scripted resumed;
  auto ckpt = top2(dir / "b");
  const auto logs = volt_test::capture_logs([&] {
    volt::Trainer t2(volt_test::quiet(dir.path).max_epochs(5).callbacks({ckpt}));
    t2.fit(resumed, volt_test::loader(volt_test::blobs(64)),
           volt_test::loader(volt_test::blobs(32)), dir / "a/last.ckpt");
  });
  EXPECT_EQ(files_in(dir / "a"), before);
  EXPECT_EQ(std::filesystem::last_write_time(dir / "a/last.ckpt"), last_time);
  EXPECT_EQ(files_in(dir / "b"), (std::vector<std::string>{"epoch=3-score=1.0.ckpt",
                                                           "epoch=4-score=2.0.ckpt", "last.ckpt"}));
  EXPECT_EQ(ckpt->best_model_path(), dir / "b/epoch=3-score=1.0.ckpt");
  EXPECT_EQ(ckpt->last_model_path(), dir / "b/last.ckpt");
  bool warned = false;
  for (const auto& l : logs) {
    warned =
        warned || l.find("the checkpoint folder changed from '" + dir / "a") != std::string::npos;
  }
  EXPECT_TRUE(warned);
}

// A monitor on a training metric logged per epoch, with validation every epoch: as Lightning the
// epoch's checkpoint is written at the train epoch's end, after its validation and with the
// epoch's metrics reduced (before, it was written at the validation's end, where the epoch's
// training mean did not exist yet: the fit failed with a ConfigError).
class EpochLogged : public volt_test::TinyClassifier {
 public:
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    auto loss = volt_test::TinyClassifier::training_step(b, i);
    log("epoch_loss", loss, volt::LogOptions().on_step(false).on_epoch(true));
    return loss;
  }
};

class EpochEndValues : public volt::Callback {
 public:
  explicit EpochEndValues(std::string key) : key_(std::move(key)) {}
  std::string state_key() const override { return "EpochEndValues"; }
  void on_train_epoch_end(volt::RunContext& run, volt::Module&) override {
    values.push_back(run.callback_metrics().at(key_));
  }
  std::vector<double> values;

 private:
  std::string key_;
};

TEST(ModelCheckpoint, AMonitorOnAnEpochMeanOfTrainingIsRankedByThatEpochsMean) {
  volt_test::TempDir dir;
  EpochLogged model;
  auto seen = std::make_shared<EpochEndValues>("epoch_loss");
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "c").monitor("epoch_loss").save_top_k(-1));
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(3).callbacks({seen, ckpt}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
  ASSERT_EQ(seen->values.size(), 3u);
  ASSERT_EQ(ckpt->best_k_models().size(), 3u);
  for (int e = 0; e < 3; ++e) {
    const std::string path =
        dir / ("c/epoch=" + std::to_string(e) + "-step=" + std::to_string(4 * (e + 1)) + ".ckpt");
    ASSERT_EQ(ckpt->best_k_models().count(path), 1u) << path;
    EXPECT_DOUBLE_EQ(ckpt->best_k_models().at(path), seen->values[e]);
  }
}

// check_val_every_n_epoch=2: the checkpoints come after each validation only. Before, the
// epochs without one saved too, ranked by the score of the validation before them.
TEST(ModelCheckpoint, EpochsWithoutAValidationAreNotRankedByAnOlderOnesScore) {
  volt_test::TempDir dir;
  Scripted model;  // validations at epochs 1 and 3: scores 3 and 1
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "c").monitor("score").save_top_k(-1).filename(
          "{epoch}-{score:.1f}"));
  volt::Trainer t(
      volt_test::quiet(dir.path).max_epochs(4).check_val_every_n_epoch(2).callbacks({ckpt}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(files_in(dir / "c"),
            (std::vector<std::string>{"epoch=1-score=3.0.ckpt", "epoch=3-score=1.0.ckpt"}));
  // Without validation data the epoch checkpoints come at each epoch's end whatever the schedule
  // says (Lightning would save none).
  volt_test::TempDir none;
  volt_test::TinyClassifier plain;
  auto every = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(none / "c").save_top_k(-1));
  volt::Trainer t2(
      volt_test::quiet(none.path).max_epochs(2).check_val_every_n_epoch(2).callbacks({every}));
  t2.fit(plain, volt_test::loader(volt_test::blobs(64)));
  EXPECT_EQ(files_in(none / "c"),
            (std::vector<std::string>{"epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt"}));
}

// Two validations per epoch and a filename of the epoch alone: the second gets "-v1" instead of
// overwriting the first (which kept the first's rank: a worse file under a better score); a
// name whose file this save evicts is reused.
class ScoredPerValidation : public volt_test::TinyClassifier {
 public:
  void validation_step(const volt::Batch&, int64_t) override {
    static const double s[] = {5, 3, 4, 1};
    log("score", s[calls_]);
  }
  void on_validation_epoch_end() override { ++calls_; }

 private:
  int calls_ = 0;
};

TEST(ModelCheckpoint, ATakenFileNameGetsAVersionInsteadOfBeingOverwritten) {
  volt_test::TempDir dir;
  ScoredPerValidation model;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "c").monitor("score").save_top_k(2).filename(
          "{epoch}"));
  volt::Trainer t(volt_test::quiet(dir.path)
                      .max_epochs(2)
                      .val_check_interval(0.5)
                      .num_sanity_val_steps(0)
                      .callbacks({ckpt}));
  t.fit(model, volt_test::loader(volt_test::blobs(128)), volt_test::loader(volt_test::blobs(32)));
  // Scores 5 (epoch=0), 3 (epoch=0-v1), 4 (epoch=1, evicting 5), 1 (epoch=1 again: the evicted
  // name is free).
  EXPECT_EQ(files_in(dir / "c"), (std::vector<std::string>{"epoch=0-v1.ckpt", "epoch=1.ckpt"}));
  EXPECT_EQ(ckpt->best_k_models(), (std::map<std::string, double>{{dir / "c/epoch=0-v1.ckpt", 3.0},
                                                                  {dir / "c/epoch=1.ckpt", 1.0}}));
  // Without the counter the name is overwritten, as asked.
  volt_test::TempDir other;
  ScoredPerValidation again;
  auto plain = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                           .dirpath(other / "c")
                                                           .monitor("score")
                                                           .save_top_k(2)
                                                           .filename("{epoch}")
                                                           .enable_version_counter(false));
  volt::Trainer t2(volt_test::quiet(other.path)
                       .max_epochs(1)
                       .val_check_interval(0.5)
                       .num_sanity_val_steps(0)
                       .callbacks({plain}));
  t2.fit(again, volt_test::loader(volt_test::blobs(128)), volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(files_in(other / "c"), (std::vector<std::string>{"epoch=0.ckpt"}));
}

TEST(ModelCheckpoint, EveryNTrainStepsWithoutMonitorKeepsLatest) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir.path).every_n_train_steps(4));
  volt::Trainer t(volt_test::quiet(dir.path).max_steps(10).callbacks({ckpt}));
  t.fit(model, volt_test::loader(volt_test::blobs(160)));
  EXPECT_EQ(ckpt->best_model_path(), dir / "epoch=0-step=8.ckpt");
  EXPECT_FALSE(exists(dir / "epoch=0-step=4.ckpt"));
}

TEST(ModelCheckpoint, FilenameTemplate) {
  volt::ModelCheckpoint c(volt::ModelCheckpointOptions().filename("{epoch:02d}-{val/loss:.3f}-x"));
  EXPECT_EQ(c.format_filename({{"val/loss", 0.12345}}, 3, 100), "epoch=03-val_loss=0.123-x");
  // A field nothing logs renders as 0, as Lightning (it stopped the fit at the first save, a
  // step save possibly hours in), with a warning naming the logged metrics once. The warning is
  // once per process: a field name of this run of the test alone (--gtest_repeat).
  static int run = 0;
  const std::string field = "val/missing" + std::to_string(run++);
  volt::ModelCheckpoint missing(
      volt::ModelCheckpointOptions().filename("{epoch:02d}-{" + field + ":.3f}-x"));
  std::string name;
  const auto logs = volt_test::capture_logs([&] {
    for (int i = 0; i < 2; ++i) {
      name = missing.format_filename({{"val_loss", 1.0}, {"train_loss", 2.0}}, 0, 0);
    }
  });
  std::string rendered = field;
  std::replace(rendered.begin(), rendered.end(), '/', '_');
  EXPECT_EQ(name, "epoch=00-" + rendered + "=0.000-x");
  int warned = 0;
  for (const auto& l : logs) {
    warned += l.find("filename field {" + field +
                     "} is not a logged metric (logged: [train_loss, val_loss]); it renders as "
                     "0 (as Lightning)") != std::string::npos;
  }
  EXPECT_EQ(warned, 1);
  // Without a spec Lightning's field is torch.tensor(0): "0".
  volt::ModelCheckpoint plain(volt::ModelCheckpointOptions().filename("{epoch}-{acc}"));
  EXPECT_EQ(plain.format_filename({}, 1, 2), "epoch=1-acc=0");
  // auto_insert_metric_name(false): the values alone (Lightning's "epoch{epoch:02d}" pattern).
  volt::ModelCheckpoint bare(volt::ModelCheckpointOptions()
                                 .filename("epoch{epoch:02d}-loss{val_loss:.2f}")
                                 .auto_insert_metric_name(false));
  EXPECT_EQ(bare.format_filename({{"val_loss", 0.25}}, 4, 10), "epoch04-loss0.25");
}

TEST(ModelCheckpoint, FilenameSpecsFollowPythonAndAreCheckedAtConstruction) {
  const auto render = [](const std::string& tmpl) {
    return volt::ModelCheckpoint(volt::ModelCheckpointOptions().filename(tmpl))
        .format_filename({{"val_loss", 0.5}}, 7, 1234);
  };
  // Without a spec a metric is Python's repr, as Lightning's tensor.__format__ (it was .4f).
  EXPECT_EQ(render("{epoch}-{step}-{val_loss}"), "epoch=7-step=1234-val_loss=0.5");
  const auto repr = [](double v) {
    return volt::ModelCheckpoint(volt::ModelCheckpointOptions().filename("{m}"))
        .format_filename({{"m", v}}, 0, 0);
  };
  // A float32 value read as a double, as Lightning's tensor.item() gives it (Python's repr).
  EXPECT_EQ(repr(static_cast<double>(0.12345679f)), "m=0.12345679104328156");
  EXPECT_EQ(repr(2.0), "m=2.0");
  EXPECT_EQ(repr(1e-05), "m=1e-05");
  EXPECT_EQ(repr(1e16), "m=1e+16");
  EXPECT_EQ(repr(123.5), "m=123.5");
  EXPECT_EQ(repr(-std::numeric_limits<double>::infinity()), "m=-inf");
  EXPECT_EQ(render("{step:06d}-{val_loss:.2e}"), "step=001234-val_loss=5.00e-01");
  EXPECT_EQ(render("{epoch:.1f}-{step:x}-{val_loss:+.3g}"), "epoch=7.0-step=4d2-val_loss=+0.5");
  EXPECT_EQ(render("{epoch:_>4}"), "epoch=___7");

  const auto error_of = [](const std::string& tmpl) -> std::string {
    try {
      volt::ModelCheckpoint c(volt::ModelCheckpointOptions().filename(tmpl));
    } catch (const volt::ConfigError& e) {
      return e.what();
    }
    return "<no ConfigError>";
  };
  // {val_loss:s} reached printf as %s with a double: undefined behaviour at the first save.
  const std::string s = error_of("{epoch}-{val_loss:s}");
  EXPECT_NE(s.find("[ModelCheckpoint] filename \"{epoch}-{val_loss:s}\": {val_loss:s} has an "
                   "invalid format spec for a float metric"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("use a Python-style spec such as {val_loss:.3f}"), std::string::npos) << s;
  EXPECT_NE(error_of("{val_loss:d}").find("invalid format spec for a float metric"),
            std::string::npos);
  EXPECT_NE(error_of("{epoch:n}").find("invalid format spec for an integer"), std::string::npos);
  EXPECT_NE(error_of("{epoch:s}").find("such as {epoch:02d}"), std::string::npos);
  EXPECT_NE(error_of("{step:{}}").find("invalid format spec"), std::string::npos);
  EXPECT_NE(error_of("{val_loss:%n}").find("invalid format spec"), std::string::npos);
  EXPECT_NE(error_of("{val_loss:999999999}")
                .find("asks for width or precision 999999999, over "
                      "a file name's 255 bytes"),
            std::string::npos);
  EXPECT_NE(error_of("{val_loss:.300f}").find("width or precision 300"), std::string::npos);
}

TEST(ModelCheckpoint, AMonitorNothingLogsFailsOnceValidationHasRun) {
  // Before, the callback returned quietly: a typo in monitor meant a run without checkpoints
  // (and without last.ckpt). As Lightning: a ConfigError once validation has run.
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "c").monitor("val_los").save_last(true));
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(2).callbacks({ckpt}));
  try {
    t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
    ADD_FAILURE() << "fit ran to the end with a monitor nothing logs";
  } catch (const volt::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("monitor \"val_los\" is not among the logged metrics [epoch, step, "
                        "train_loss, val_acc, val_loss]"),
              std::string::npos)
        << what;
    EXPECT_EQ(t.state().epoch, 0);  // the first validation's end
  }
}

TEST(ModelCheckpoint, AMonitorNotLoggedYetWarnsAndStillWritesLast) {
  // Saves every 2 steps without validation batches: val_loss never comes, so each step save
  // waits, and at the epoch's end no top-k file is written (warned once), but last.ckpt is, and
  // the run resumes from it.
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                          .dirpath(dir / "c")
                                                          .monitor("val_loss")
                                                          .every_n_train_steps(2)
                                                          .save_last(true));
  const auto logs = volt_test::capture_logs([&] {
    volt::Trainer t(volt_test::quiet(dir.path).max_steps(6).callbacks({ckpt}));
    t.fit(model, volt_test::loader(volt_test::blobs(160)));
  });
  EXPECT_EQ(files_in(dir / "c"), std::vector<std::string>{"last.ckpt"});
  EXPECT_TRUE(ckpt->best_model_path().empty());
  int warnings = 0;
  for (const auto& l : logs) {
    warnings += l.find(
                    "monitor \"val_loss\" is not among the logged metrics [epoch, step, "
                    "train_loss] yet "
                    "(no validation has run)") != std::string::npos;
  }
  EXPECT_EQ(warnings, 1);
  volt_test::TinyClassifier resumed;
  volt::Trainer t2(volt_test::quiet(dir.path).max_steps(8));
  t2.fit(resumed, volt_test::loader(volt_test::blobs(160)), c10::nullopt, dir / "c/last.ckpt");
  EXPECT_EQ(t2.state().global_step, 8);
}

TEST(ModelCheckpoint, ValidateAloneSavesNothing) {
  // Trainer::validate() with the callbacks of a fit config (the shipped CLI config has a
  // ModelCheckpoint on val_acc): before, its on_validation_end tried to save and validate()
  // failed ("save_checkpoint() needs a module set up by fit()"). As Lightning: only fit saves.
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "c").monitor("val_acc").mode(volt::Mode::kMax));
  auto stop = std::make_shared<volt::EarlyStopping>(
      volt::EarlyStoppingOptions("val_acc").mode(volt::Mode::kMax).patience(0));
  volt::Trainer t(volt_test::quiet(dir.path).callbacks({ckpt, stop}));
  for (int i = 0; i < 3; ++i) {
    const auto m = t.validate(model, volt_test::loader(volt_test::blobs(32)));
    EXPECT_EQ(m.count("val_acc"), 1u);
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "c"));
  EXPECT_EQ(stop->wait_count(), 0);  // validate() does not count towards patience
  EXPECT_FALSE(t.state().should_stop);
}

TEST(ModelCheckpoint, InvalidOptions) {
  EXPECT_THROW(volt::ModelCheckpoint(volt::ModelCheckpointOptions().save_top_k(-2)),
               volt::ConfigError);
  EXPECT_THROW(volt::ModelCheckpoint(volt::ModelCheckpointOptions().save_top_k(3)),
               volt::ConfigError);
  EXPECT_THROW(volt::ModelCheckpoint(volt::ModelCheckpointOptions().every_n_train_steps(-1)),
               volt::ConfigError);
  // Lightning's mutually exclusive triggers (both fired before session 107); an explicit
  // every_n_epochs=0 with steps is fine.
  try {
    volt::ModelCheckpoint(
        volt::ModelCheckpointOptions().every_n_train_steps(100).every_n_epochs(int64_t{1}));
    ADD_FAILURE() << "no error";
  } catch (const volt::ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "[ModelCheckpoint] every_n_train_steps=100 and every_n_epochs=1 are mutually "
                 "exclusive (as Lightning); keep one.");
  }
  EXPECT_NO_THROW(volt::ModelCheckpoint(
      volt::ModelCheckpointOptions().every_n_train_steps(100).every_n_epochs(int64_t{0})));
}

// Lightning's _monitor_candidates: "step" and "epoch" can be monitored (the usual way to keep
// the newest k checkpoints: it was a ConfigError, "not among the logged metrics"), and a field
// name may hold any character but ":" and "}".
TEST(ModelCheckpoint, StepAndEpochCanBeMonitoredAndFieldsTakeAnyName) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                          .dirpath(dir / "c")
                                                          .monitor("step")
                                                          .mode(volt::Mode::kMax)
                                                          .save_top_k(2)
                                                          .every_n_train_steps(2)
                                                          .filename("{step}"));
  volt::Trainer t(volt_test::quiet(dir.path).max_steps(8).callbacks({ckpt}));
  t.fit(model, volt_test::loader(volt_test::blobs(160)), volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(files_in(dir / "c"), (std::vector<std::string>{"step=6.ckpt", "step=8.ckpt"}));
  EXPECT_EQ(ckpt->best_model_score(), c10::optional<double>(8.0));
  volt::ModelCheckpoint at(volt::ModelCheckpointOptions().filename("{acc@1:.2f}-{val loss}"));
  EXPECT_EQ(at.format_filename({{"acc@1", 0.5}, {"val loss", 2.0}}, 0, 0),
            "acc@1=0.50-val loss=2.0");
}

// Lightning's _save_none_monitor_checkpoint: without a monitor no score is kept (best_k_models()
// held every file at score 0.0 and best_model_score() said 0.0), and a name the template repeats
// replaces the newest file (it got -v1, -v2...). save_top_k 0 ranks nothing, so a monitor nothing
// logs is no error there; last.ckpt is written.
TEST(ModelCheckpoint, WithoutAMonitorNoScoreIsKeptAndTopKZeroLooksUpNoMonitor) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto all = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "all").save_top_k(-1).filename("model"));
  auto latest = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "latest"));
  for (const auto& c : {all, latest}) {
    volt::Trainer t(volt_test::quiet(dir.path).max_epochs(3).callbacks({c}));
    t.fit(model, volt_test::loader(volt_test::blobs(64)));
  }
  EXPECT_EQ(files_in(dir / "all"), (std::vector<std::string>{"model.ckpt"}));
  EXPECT_EQ(all->best_model_path(), dir / "all/model.ckpt");
  EXPECT_FALSE(all->best_model_score().has_value());
  EXPECT_TRUE(all->best_k_models().empty());
  EXPECT_EQ(files_in(dir / "latest"), (std::vector<std::string>{"epoch=2-step=12.ckpt"}));
  EXPECT_TRUE(latest->best_k_models().empty());

  auto none = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                          .dirpath(dir / "none")
                                                          .monitor("never_logged")
                                                          .save_top_k(0)
                                                          .save_last(true));
  volt::Trainer t2(volt_test::quiet(dir.path).max_epochs(2).callbacks({none}));
  EXPECT_NO_THROW(t2.fit(model, volt_test::loader(volt_test::blobs(64)),
                         volt_test::loader(volt_test::blobs(32))));
  EXPECT_EQ(files_in(dir / "none"), (std::vector<std::string>{"last.ckpt"}));
}

}  // namespace

namespace {

// A classifier with AdamW (full checkpoints then hold two moments per weight) whose steps take
// at least `step_ms` each.
class Slow : public volt_test::TinyClassifier {
 public:
  explicit Slow(int step_ms = 0) : TinyClassifier(8, 0.01, /*adam=*/true), step_ms_(step_ms) {}
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms_));
    return TinyClassifier::training_step(b, i);
  }
  int step_ms_;
};

// When each checkpoint write began, and at which step.
class SaveTimes : public volt::Callback {
 public:
  std::string state_key() const override { return "SaveTimes"; }
  void on_save_checkpoint(volt::RunContext& run, volt::Module&) override {
    times.push_back(std::chrono::steady_clock::now());
    steps.push_back(run.state().global_step);
  }
  std::vector<std::chrono::steady_clock::time_point> times;
  std::vector<int64_t> steps;
};

TEST(ModelCheckpoint, WeightsOnlyCheckpointsServeValidateAndLoadWeightsButNotAResume) {
  volt_test::TempDir dir;
  torch::manual_seed(6);
  Slow model;
  auto weights = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "w").save_last(true).save_weights_only(true));
  auto full = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "f").save_last(true).monitor("val_loss"));
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(2).callbacks({weights, full}));
  const auto val = volt_test::loader(volt_test::blobs(32), 16, false);
  t.fit(model, volt_test::loader(volt_test::blobs(64)), val);
  const std::string w = weights->last_model_path(), f = full->last_model_path();
  ASSERT_TRUE(exists(w) && exists(f));
  // No optimizer moments, RNG, callback or logger state.
  EXPECT_LT(std::filesystem::file_size(w) * 2, std::filesystem::file_size(f));

  // The weights, bit for bit, for load_weights and for validate.
  Slow other;
  volt::load_weights(other, w);
  for (const auto& p : other.named_parameters()) {
    EXPECT_TRUE(p.value().equal(model.named_parameters()[p.key()])) << p.key();
  }
  volt::Trainer v(volt_test::quiet(dir.path));
  Slow fresh;
  const auto from_weights = v.validate(fresh, val, w);
  const auto from_full = v.validate(fresh, val, f);
  EXPECT_EQ(from_weights.at("val_loss"), from_full.at("val_loss"));

  // A fit cannot resume from it: one line saying why and what to do, before anything loads.
  Slow resumed;
  const at::Tensor before = resumed.fc1->weight.clone();
  volt::Trainer r(volt_test::quiet(dir.path).max_epochs(3));
  try {
    r.fit(resumed, volt_test::loader(volt_test::blobs(64)), val, w);
    FAIL() << "a fit resumed from a weights-only checkpoint";
  } catch (const volt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("holds the weights only (ModelCheckpoint's "
                                         "save_weights_only): a fit cannot resume from it"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(resumed.fc1->weight.equal(before));

  // Trainer::save_checkpoint writes one too.
  t.save_checkpoint(dir / "by_hand.ckpt", /*weights_only=*/true);
  EXPECT_THROW(r.fit(resumed, volt_test::loader(volt_test::blobs(64)), val, dir / "by_hand.ckpt"),
               volt::CheckpointError);
  volt::load_weights(other, dir / "by_hand.ckpt");

  // DeepSpeed's checkpoints are shard folders: refused before training (a one-process
  // DeepSpeed fit on the CPU makes a Gloo group).
  if (volt_test::gloo()) {
    Slow zero;
    const at::Tensor untouched = zero.fc1->weight.clone();
    auto mc = std::make_shared<volt::ModelCheckpoint>(
        volt::ModelCheckpointOptions().dirpath(dir / "z").save_weights_only(true));
    volt::Trainer z(
        volt_test::quiet(dir.path).strategy("deepspeed_stage_2").max_epochs(1).callbacks({mc}));
    try {
      z.fit(zero, volt_test::loader(volt_test::blobs(64)));
      FAIL() << "weights-only checkpoints accepted under DeepSpeed";
    } catch (const volt::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("save_weights_only with DeepSpeedStrategy"),
                std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(zero.fc1->weight.equal(untouched));
  }
}

TEST(ModelCheckpoint, TrainTimeIntervalSavesOnceEachIntervalOfTraining) {
  volt_test::TempDir dir;
  Slow model(/*step_ms=*/25);
  const double interval = 0.1;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                          .dirpath(dir / "t")
                                                          .filename("{step}")
                                                          .save_top_k(-1)
                                                          .train_time_interval(interval));
  auto times = std::make_shared<SaveTimes>();
  // 2 epochs of 8 steps, 25 ms or more each: 0.4 s or more of training.
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(2).callbacks({ckpt, times}));
  t.fit(model, volt_test::loader(volt_test::blobs(128)));
  ASSERT_GE(times->times.size(), 2u);
  EXPECT_LT(times->times.size(), 16u);  // not at every step (nor at epoch ends)
  for (size_t i = 1; i < times->times.size(); ++i) {
    const double gap = std::chrono::duration<double>(times->times[i] - times->times[i - 1]).count();
    EXPECT_GE(gap, interval * 0.9) << "save " << i << " at step " << times->steps[i];
    EXPECT_GT(times->steps[i], times->steps[i - 1]);
  }
  for (int64_t s : times->steps)
    EXPECT_TRUE(exists(dir / ("t/step=" + std::to_string(s) + ".ckpt")));

  // Bad values and a second trigger are refused at construction.
  for (double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW(volt::ModelCheckpoint(volt::ModelCheckpointOptions().train_time_interval(bad)),
                 volt::ConfigError)
        << bad;
  }
  try {
    volt::ModelCheckpoint(
        volt::ModelCheckpointOptions().train_time_interval(60).every_n_train_steps(10));
    FAIL() << "two triggers accepted";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("mutually exclusive"), std::string::npos) << e.what();
  }
  EXPECT_THROW(volt::ModelCheckpoint(
                   volt::ModelCheckpointOptions().train_time_interval(60).every_n_epochs(1)),
               volt::ConfigError);
}

// Lightning 2.6's deferral: a step save due before the monitored metric is logged, or right
// before the validation that logs it, is written after that validation, ranked by its fresh
// score. Before, the first (monitor missing) wrote no top-k file and the one at each epoch's last
// batch was ranked and named by the previous epoch's score (epoch=1-step=8-score=5.0). A save
// due mid-epoch with an older score still uses it, as Lightning's.
TEST(ModelCheckpoint, AStepSaveWaitsForTheValidationItsMonitorComesFrom) {
  volt_test::TempDir dir;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                          .dirpath(dir / "c")
                                                          .monitor("score")
                                                          .save_top_k(-1)
                                                          .every_n_train_steps(2)
                                                          .filename("{epoch}-{step}-{score:.1f}"));
  fit_scripted(dir.path, 2, ckpt, "");  // 4 batches an epoch
  EXPECT_EQ(files_in(dir / "c"), (std::vector<std::string>{"epoch=0-step=4-score=5.0.ckpt",
                                                           "epoch=1-step=6-score=5.0.ckpt",
                                                           "epoch=1-step=8-score=3.0.ckpt"}));
}

// The deferral is part of the callback's state: a fit resumed from a checkpoint written after a
// deferred save and before its validation writes it, as the uninterrupted fit does.
TEST(ModelCheckpoint, ADeferredSaveSurvivesAResume) {
  volt_test::TempDir dir;
  const auto ranked = [&] {
    return std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                       .dirpath(dir / "c")
                                                       .monitor("score")
                                                       .save_top_k(-1)
                                                       .every_n_train_steps(3)
                                                       .filename("{epoch}-{step}-{score:.1f}"));
  };
  // Listed after the ranked one, so its file at step 3 holds the deferral taken there.
  auto every3 = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                            .dirpath(dir / "all")
                                                            .save_top_k(-1)
                                                            .every_n_train_steps(3)
                                                            .filename("{step}"));
  {
    Scripted model;
    volt::Trainer t(volt_test::quiet(dir.path).max_steps(3).callbacks({ranked(), every3}));
    t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
  }
  ASSERT_TRUE(exists(dir / "all/step=3.ckpt"));
  ASSERT_FALSE(std::filesystem::exists(dir / "c"));
  // Resumed at step 3: batch 4 triggers nothing, then the epoch's validation scores 5.
  auto resumed = ranked();
  Scripted model;
  volt::Trainer t(volt_test::quiet(dir.path).max_epochs(1).callbacks({resumed}));
  t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)),
        dir / "all/step=3.ckpt");
  EXPECT_EQ(files_in(dir / "c"), std::vector<std::string>{"epoch=0-step=4-score=5.0.ckpt"});
}

// Lightning 2.6: save_last gives last.ckpt at the end of a fit in which no trigger fired (it gave
// no file at all); nothing is saved before the first optimizer step (a validation before it,
// under gradient accumulation, wrote epoch=0-step=0.ckpt).
TEST(ModelCheckpoint, SaveLastAtTheEndOfAFitThatSavedNothingAndNothingBeforeTheFirstStep) {
  volt_test::TempDir dir;
  {
    volt_test::TinyClassifier model;
    auto ckpt = std::make_shared<volt::ModelCheckpoint>(
        volt::ModelCheckpointOptions().dirpath(dir / "a").every_n_epochs(3).save_last(true));
    volt::Trainer t(volt_test::quiet(dir.path).max_epochs(2).callbacks({ckpt}));
    t.fit(model, volt_test::loader(volt_test::blobs(64)));
    EXPECT_EQ(files_in(dir / "a"), std::vector<std::string>{"last.ckpt"});
    EXPECT_EQ(ckpt->last_model_path(), dir / "a/last.ckpt");
    volt::Trainer again(volt_test::quiet(dir.path).max_epochs(3));
    volt_test::TinyClassifier resumed;
    again.fit(resumed, volt_test::loader(volt_test::blobs(64)), c10::nullopt, dir / "a/last.ckpt");
    EXPECT_EQ(again.state().epoch, 2);  // went on from the end of epoch 1
  }
  {
    // 4 batches an epoch, a step every 4, a validation after every 2: the first comes before
    // any step.
    volt_test::TinyClassifier model;
    auto ckpt = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                            .dirpath(dir / "b")
                                                            .filename("{epoch}-{step}")
                                                            .save_top_k(-1));
    volt::Trainer t(volt_test::quiet(dir.path)
                        .max_epochs(1)
                        .accumulate_grad_batches(4)
                        .val_check_interval(int64_t{2})
                        .callbacks({ckpt}));
    t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
    EXPECT_EQ(files_in(dir / "b"), std::vector<std::string>{"epoch=0-step=1.ckpt"});
  }
}

// verbose logs each ranking decision on rank 0, in Lightning's words.
TEST(ModelCheckpoint, VerboseLogsEachRankingDecision) {
  volt_test::TempDir dir;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                          .dirpath(dir / "c")
                                                          .monitor("score")
                                                          .filename("{epoch}")
                                                          .verbose(true));
  const auto logs = volt_test::capture_logs([&] { fit_scripted(dir.path, 3, ckpt, ""); });
  const auto has = [&](const std::string& text) {
    return std::any_of(logs.begin(), logs.end(),
                       [&](const std::string& l) { return l.find(text) != std::string::npos; });
  };
  EXPECT_TRUE(
      has("Epoch 0, global step 4: 'score' reached 5.00000 (best 5.00000), saving model "
          "to '" +
          dir / "c/epoch=0.ckpt" + "' as top 1"));
  EXPECT_TRUE(
      has("Epoch 1, global step 8: 'score' reached 3.00000 (best 3.00000), saving model "
          "to '" +
          dir / "c/epoch=1.ckpt" + "' as top 1"));
  EXPECT_TRUE(has("Epoch 2, global step 12: 'score' was not in top 1"));
}

// A dirpath under "~" is the home folder's, and a relative one is made absolute, as Lightning.
TEST(ModelCheckpoint, ADirpathUnderTheHomeFolderIsExpanded) {
  volt_test::TempDir dir;
  struct Home {  // HOME is the test folder while the fit runs, and back after it, also on a throw
    explicit Home(const std::string& to) : had(std::getenv("HOME") != nullptr) {
      if (had) old = std::getenv("HOME");
      ::setenv("HOME", to.c_str(), 1);
    }
    ~Home() {
      if (had) {
        ::setenv("HOME", old.c_str(), 1);
      } else {
        ::unsetenv("HOME");
      }
    }
    bool had;
    std::string old;
  };
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath("~/runs/../ckpts/").filename("{epoch}"));
  {
    Home home(dir.path);
    volt_test::TinyClassifier model;
    volt::Trainer t(volt_test::quiet(dir.path).max_epochs(1).callbacks({ckpt}));
    t.fit(model, volt_test::loader(volt_test::blobs(64)));
  }
  EXPECT_EQ(ckpt->dirpath(), dir / "ckpts");
  EXPECT_TRUE(exists(dir / "ckpts/epoch=0.ckpt"));
  EXPECT_FALSE(std::filesystem::exists("~"));
}

// Lightning's kth_best_model_path, kth_value and current_score, and to_yaml. Scores 5, 3, 4, 1,
// 2, 6 with the best 2 kept (min): the kth is the worst kept once two are; the current score
// the latest that made the top 2 (epoch 5's 6 did not).
TEST(ModelCheckpoint, KthBestCurrentScoreAndToYamlAsLightning) {
  volt_test::TempDir dir;
  auto ckpt = top2(dir / "c");
  EXPECT_EQ(ckpt->kth_best_model_path(), "");
  EXPECT_EQ(ckpt->kth_value(), std::numeric_limits<double>::infinity());
  EXPECT_FALSE(ckpt->current_score().has_value());
  EXPECT_THROW(ckpt->to_yaml(), volt::ConfigError);  // no folder before a fit
  fit_scripted(dir.path, 1, ckpt, "");
  EXPECT_EQ(ckpt->kth_best_model_path(), "");  // one of two kept
  EXPECT_DOUBLE_EQ(*ckpt->current_score(), 5.0);
  fit_scripted(dir.path, 3, ckpt, dir / "c/last.ckpt");
  EXPECT_EQ(ckpt->kth_best_model_path(), dir / "c/epoch=2-score=4.0.ckpt");
  EXPECT_DOUBLE_EQ(ckpt->kth_value(), 4.0);
  auto resumed = top2(dir / "c");
  fit_scripted(dir.path, 6, resumed, dir / "c/last.ckpt");
  EXPECT_EQ(resumed->kth_best_model_path(), dir / "c/epoch=4-score=2.0.ckpt");
  EXPECT_DOUBLE_EQ(resumed->kth_value(), 2.0);
  EXPECT_DOUBLE_EQ(*resumed->current_score(), 2.0);
  // Restored from a checkpoint (written at epoch 5's end: epoch 5 was not in the top 2).
  auto restored = top2(dir / "c");
  fit_scripted(dir.path, 6, restored, dir / "c/last.ckpt");
  EXPECT_DOUBLE_EQ(restored->current_score().value_or(-1), 2.0);
  resumed->to_yaml();
  EXPECT_EQ(volt_test::file_text(dir / "c/best_k_models.yaml"),
            "\"" + (dir / "c/epoch=3-score=1.0.ckpt") + "\": 1.0\n\"" +
                (dir / "c/epoch=4-score=2.0.ckpt") + "\": 2.0\n");
  // Max mode without a full list: -inf; PyYAML's float forms.
  auto max = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().monitor("score").mode(volt::Mode::kMax).save_top_k(3));
  EXPECT_EQ(max->kth_value(), -std::numeric_limits<double>::infinity());
  // save_top_k -1 keeps every file: the kth is the worst kept, as Lightning's (its k is one
  // more than the list held before each save).
  auto all = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                         .dirpath(dir / "all")
                                                         .monitor("score")
                                                         .save_top_k(-1)
                                                         .filename("{epoch}"));
  fit_scripted(dir.path, 2, all, "");
  EXPECT_EQ(all->kth_best_model_path(), dir / "all/epoch=0.ckpt");
  EXPECT_DOUBLE_EQ(all->kth_value(), 5.0);
  EXPECT_DOUBLE_EQ(*all->current_score(), 3.0);
  all->to_yaml(dir / "k.yaml");
  EXPECT_EQ(
      volt_test::file_text(dir / "k.yaml"),
      "\"" + (dir / "all/epoch=0.ckpt") + "\": 5.0\n\"" + (dir / "all/epoch=1.ckpt") + "\": 3.0\n");
}

// Lightning's save_last="link": last.ckpt a relative link to the newest file this fit wrote,
// left where it is when a save does not make the top k; a real file until the fit has written
// one (a resumed fit), and with save_top_k 0. It resumes like the file it names.
TEST(ModelCheckpoint, SaveLastLinkNamesTheNewestCheckpointWrittenAndResumes) {
  namespace fs = std::filesystem;
  volt_test::TempDir dir;
  const auto linked = [&](int64_t k, const std::string& folder = "c") {
    return std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                       .dirpath(dir / folder)
                                                       .monitor("score")
                                                       .save_top_k(k)
                                                       .filename("{epoch}-{score:.1f}")
                                                       .save_last(volt::SaveLast::kLink));
  };
  auto ckpt = linked(2);
  fit_scripted(dir.path, 3, ckpt, "");  // 5, 3, 4: epoch 2's file is the newest
  ASSERT_TRUE(fs::is_symlink(dir / "c/last.ckpt"));
  EXPECT_EQ(fs::read_symlink(dir / "c/last.ckpt"), fs::path("epoch=2-score=4.0.ckpt"));
  EXPECT_EQ(ckpt->last_model_path(), dir / "c/last.ckpt");
  fit_scripted(dir.path, 6, ckpt, dir / "c/last.ckpt");  // 1, 2 kept; 6 is not in the top 2
  EXPECT_EQ(fs::read_symlink(dir / "c/last.ckpt"), fs::path("epoch=4-score=2.0.ckpt"));
  EXPECT_EQ(files_in(dir / "c"), (std::vector<std::string>{"epoch=3-score=1.0.ckpt",
                                                           "epoch=4-score=2.0.ckpt", "last.ckpt"}));
  // Resumed through the link (epoch 4's state): epoch 5 again (6), then 7, neither in the top
  // 2: this fit wrote nothing to link to, so last.ckpt becomes a file of its own.
  auto resumed = linked(2);
  fit_scripted(dir.path, 7, resumed, dir / "c/last.ckpt");
  EXPECT_FALSE(fs::is_symlink(dir / "c/last.ckpt"));
  EXPECT_TRUE(fs::is_regular_file(dir / "c/last.ckpt"));
  EXPECT_EQ(files_in(dir / "c"), (std::vector<std::string>{"epoch=3-score=1.0.ckpt",
                                                           "epoch=4-score=2.0.ckpt", "last.ckpt"}));
  // save_top_k 0: nothing to link to, a file each time.
  fit_scripted(dir.path, 2, linked(0, "zero"), "");
  EXPECT_FALSE(fs::is_symlink(dir / "zero/last.ckpt"));
  EXPECT_EQ(files_in(dir / "zero"), (std::vector<std::string>{"last.ckpt"}));
  // Through AsyncCheckpointIO the link is queued behind the save it names.
  {
    Scripted model;
    volt::Trainer t(volt_test::quiet(dir.path)
                        .max_epochs(2)
                        .checkpoint_io(std::make_shared<volt::AsyncCheckpointIO>())
                        .callbacks({linked(1, "async")}));
    t.fit(model, volt_test::loader(volt_test::blobs(64)), volt_test::loader(volt_test::blobs(32)));
  }
  EXPECT_EQ(fs::read_symlink(dir / "async/last.ckpt"), fs::path("epoch=1-score=3.0.ckpt"));
  EXPECT_EQ(files_in(dir / "async"),
            (std::vector<std::string>{"epoch=1-score=3.0.ckpt", "last.ckpt"}));
}

}  // namespace
