// ckpt_path "last" and "best": resolved through the run's ModelCheckpoint; a DataModule's state
// in checkpoints.
#include <gtest/gtest.h>

#include <torch/serialize/archive.h>

#include "tiny.h"

namespace {

using volt_test::quiet;
using volt_test::TinyClassifier;

std::shared_ptr<volt::ModelCheckpoint> checkpoint_to(const std::string& dir) {
  return std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                     .dirpath(dir)
                                                     .monitor("val_acc")
                                                     .mode(volt::Mode::kMax)
                                                     .save_last(true));
}

TEST(CheckpointPath, LastResumesFromTheNewestLastCheckpointInANewProcessLikeTrainer) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(64), val = volt_test::blobs(32, 8, 3);
  {
    TinyClassifier model;
    volt::Trainer trainer(quiet(dir.path).max_epochs(2).callbacks({checkpoint_to(dir / "ckpt")}));
    trainer.fit(model, volt_test::loader(train), volt_test::loader(val, 32, false));
    EXPECT_EQ(trainer.state().global_step, 8);
  }
  // A fresh Trainer and model (as after a restart) continue from last.ckpt: epoch 2 only.
  TinyClassifier model;
  volt::Trainer trainer(quiet(dir.path).max_epochs(3).callbacks({checkpoint_to(dir / "ckpt")}));
  trainer.fit(model, volt_test::loader(train), volt_test::loader(val, 32, false), "last");
  EXPECT_EQ(trainer.state().global_step, 12);
  EXPECT_EQ(trainer.state().epoch, 2);
}

TEST(CheckpointPath, LastWithoutACheckpointStartsFreshWithAWarning) {
  volt_test::TempDir dir;
  std::vector<std::string> lines;
  volt::set_log_sink([&](volt::LogLevel level, const std::string& line) {
    if (level == volt::LogLevel::kWarning) lines.push_back(line);
  });
  TinyClassifier model;
  volt::Trainer trainer(quiet(dir.path).max_epochs(1).callbacks({checkpoint_to(dir / "none")}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)), c10::nullopt, "last");
  volt::set_log_sink(nullptr);
  EXPECT_EQ(trainer.state().global_step, 4);
  // Two warnings: this one, and ModelCheckpoint's (its monitor val_acc never comes without
  // validation data, so only last.ckpt is written).
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("no last checkpoint exists; training starts from scratch"),
            std::string::npos)
      << lines[0];
  EXPECT_NE(lines[1].find("monitor \"val_acc\" is not among the logged metrics"), std::string::npos)
      << lines[1];
}

TEST(CheckpointPath, BestLoadsTheBestWeightsForTest) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(128), val = volt_test::blobs(64, 8, 3);
  TinyClassifier model;
  auto ckpt = checkpoint_to(dir / "ckpt");
  volt::Trainer trainer(quiet(dir.path).max_epochs(3).callbacks({ckpt}));
  trainer.fit(model, volt_test::loader(train), volt_test::loader(val, 64, false));
  ASSERT_FALSE(ckpt->best_model_path().empty());
  const double best = *ckpt->best_model_score();
  // Spoil the weights: "best" must bring the best epoch's back.
  {
    torch::NoGradGuard g;
    for (auto& p : model.parameters()) p.zero_();
  }
  auto m = trainer.validate(model, volt_test::loader(val, 64, false), "best");
  EXPECT_DOUBLE_EQ(m.at("val_acc"), best);
}

// TinyClassifier and one parameter more: a checkpoint of the plain one lacks it.
struct WithExtra : TinyClassifier {
  WithExtra() { extra = register_parameter("extra", torch::full({3}, 7.0f)); }
  torch::Tensor extra;
};

// Lightning's strict_loading: a module that sets it false takes a checkpoint's matching weights
// and keeps the rest; by default the mismatch is a CheckpointError that changes nothing.
TEST(CheckpointPath, StrictLoadingFalseLoadsTheWeightsThatMatch) {
  volt_test::TempDir dir;
  auto train = volt_test::blobs(64), val = volt_test::blobs(32, 8, 3);
  TinyClassifier trained;
  auto ckpt = checkpoint_to(dir / "ckpt");
  volt::Trainer trainer(quiet(dir.path).max_epochs(1).callbacks({ckpt}));
  trainer.fit(trained, volt_test::loader(train), volt_test::loader(val, 32, false));
  const std::string path = dir / "ckpt/last.ckpt";

  WithExtra strict;
  const at::Tensor before = strict.flat_params();
  volt::Trainer other(quiet(dir / "b"));
  try {
    other.validate(strict, volt_test::loader(val, 32, false), path);
    ADD_FAILURE() << "no CheckpointError";
  } catch (const volt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("missing 'extra'"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(at::equal(strict.flat_params(), before)) << "a refused load changes nothing";

  WithExtra lenient;
  lenient.set_strict_loading(false);
  const auto m = other.validate(lenient, volt_test::loader(val, 32, false), path);
  EXPECT_TRUE(at::equal(lenient.fc1->weight, trained.fc1->weight));
  EXPECT_TRUE(at::equal(lenient.fc2->bias, trained.fc2->bias));
  EXPECT_TRUE(at::equal(lenient.extra, torch::full({3}, 7.0f))) << "not in the file: kept";
  EXPECT_DOUBLE_EQ(m.at("val_acc"),
                   trainer.validate(trained, volt_test::loader(val, 32, false)).at("val_acc"));
}

TEST(CheckpointPath, BestBeforeAnyFitIsAConfigError) {
  volt_test::TempDir dir;
  TinyClassifier model;
  volt::Trainer trainer(quiet(dir.path).callbacks({checkpoint_to(dir / "ckpt")}));
  try {
    trainer.test(model, volt_test::loader(volt_test::blobs(32)), "best");
    FAIL() << "expected ConfigError";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no best checkpoint exists yet"), std::string::npos);
  }
}

TEST(CheckpointPath, LastNeedsAModelCheckpoint) {
  volt_test::TempDir dir;
  TinyClassifier model;
  volt::Trainer trainer(quiet(dir.path).max_epochs(1));  // enable_checkpointing(false)
  try {
    trainer.fit(model, volt_test::loader(volt_test::blobs(32)), c10::nullopt, "last");
    FAIL() << "expected ConfigError";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs a ModelCheckpoint callback"), std::string::npos);
  }
}

/// A curriculum: `level` (its checkpointed state) sets how many 16-row batches the training
/// loader has; Harder raises it at each epoch's end.
class Curriculum : public volt::DataModule {
 public:
  volt::DataLoader train_dataloader() override {
    ++built;
    return volt_test::loader(volt_test::blobs(16 * (level + 1)), 16, false);
  }
  c10::optional<volt::DataLoader> val_dataloader() override {
    val_built_at = level;
    return volt_test::loader(volt_test::blobs(16 * (level + 1), 8, 1), 16, false);
  }
  void save_state(torch::serialize::OutputArchive& ar) const override {
    ar.write("level", c10::IValue(level));
  }
  void load_state(torch::serialize::InputArchive& ar) override {
    c10::IValue v;
    ar.read("level", v);
    level = v.toInt();
  }
  int64_t level = 0;
  int built = 0;
  int64_t val_built_at = -1;  // the level val_dataloader() last saw
};

class Harder : public volt::Callback {
 public:
  std::string state_key() const override { return "Harder"; }
  void on_train_epoch_end(volt::RunContext& run, volt::Module&) override {
    ++dynamic_cast<Curriculum&>(*run.data_module()).level;
  }
};

TEST(DataModuleState, AResumedFitBuildsItsLoadersFromTheRestoredState) {
  for (const int64_t reload_every : {0, 1}) {
    SCOPED_TRACE("reload_dataloaders_every_n_epochs=" + std::to_string(reload_every));
    volt_test::TempDir dir;
    // The uninterrupted run writes into a folder of its own: a fresh run finding another run's
    // last.ckpt writes last-v1.ckpt (Lightning's rule), and the resume below reads the first run's.
    auto options = [&](int64_t epochs, const std::string& folder) {
      return quiet(dir.path)
          .max_epochs(epochs)
          .limit_val_batches(int64_t{0})
          .reload_dataloaders_every_n_epochs(reload_every)
          .callbacks({std::make_shared<Harder>(),
                      std::make_shared<volt::ModelCheckpoint>(
                          volt::ModelCheckpointOptions().dirpath(dir / folder).save_last(true))});
    };
    // Levels 0, 1, 2 in one run: 1 + 2 + 3 batches with reloads, 3 x 1 without.
    Curriculum whole;
    TinyClassifier model;
    volt::Trainer uninterrupted(options(3, "whole"));
    uninterrupted.fit(model, whole);
    const int64_t steps = uninterrupted.state().global_step;
    EXPECT_EQ(steps, reload_every == 1 ? 6 : 3);
    EXPECT_EQ(whole.level, 3);
    // Two epochs, then a fresh DataModule (level 0) resumed from last.ckpt: level 2 comes back
    // before the loaders are built again. With reloads the third epoch is the uninterrupted
    // one; without, the resumed fit builds its loader from the restored level (3 batches, as
    // Lightning, which restores the state before asking for loaders), where the uninterrupted
    // fit kept the one it built from level 0.
    {
      Curriculum first;
      TinyClassifier m;
      volt::Trainer t(options(2, "ckpt"));
      t.fit(m, first);
    }
    Curriculum resumed;
    TinyClassifier m;
    volt::Trainer t(options(3, "ckpt"));
    t.fit(m, resumed, dir / "ckpt/last.ckpt");
    EXPECT_EQ(resumed.level, 3);
    EXPECT_EQ(t.state().global_step, reload_every == 1 ? steps : 2 + 3);
    EXPECT_EQ(resumed.built, 2);  // before the restore, and from the restored state
    // validate() with the checkpoint reads the state before asking for its loader (it asked
    // first, and validated level 0's one batch).
    Curriculum evaluated;
    TinyClassifier e;
    volt::Trainer v(quiet(dir.path));
    v.validate(e, evaluated, dir / "ckpt/last.ckpt");
    EXPECT_EQ(evaluated.level, 3);
    EXPECT_EQ(evaluated.val_built_at, 3);
  }
}

}  // namespace
