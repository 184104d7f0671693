// load_weights: a checkpoint's weights into a module the program built, without a Trainer
// (Lightning's load_from_checkpoint); and the module's on_load_checkpoint at every entry point
// given a checkpoint.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <sys/stat.h>

#include <fstream>

#include "error_text.h"
#include "tiny.h"

namespace {

using volt_test::error_of;
using volt_test::quiet;
using volt_test::TinyClassifier;

// A classifier that keeps its own state in checkpoints (a class-name table, say).
class WithVocab : public TinyClassifier {
 public:
  using TinyClassifier::TinyClassifier;
  void on_save_checkpoint(torch::serialize::OutputArchive& archive) override {
    archive.write("vocab", torch::arange(5) * 10);
  }
  void on_load_checkpoint(torch::serialize::InputArchive& archive) override {
    archive.read("vocab", vocab);
    ++loads;
  }
  at::Tensor vocab;
  int loads = 0;
};

// Trains a WithVocab for an epoch and returns the path of its last checkpoint.
std::string fit_and_checkpoint(const volt_test::TempDir& dir, WithVocab& model) {
  auto checkpoint = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().dirpath(dir / "ckpt").save_last(true));
  volt::Trainer trainer(
      quiet(dir.path).max_epochs(1).enable_checkpointing(true).callbacks({checkpoint}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)));
  return checkpoint->last_model_path();
}

void expect_same_weights(const torch::nn::Module& got, const torch::nn::Module& want) {
  const auto w = want.named_parameters();
  for (const auto& p : got.named_parameters()) EXPECT_TRUE(p.value().equal(w[p.key()])) << p.key();
  const auto wb = want.named_buffers();
  for (const auto& b : got.named_buffers()) EXPECT_TRUE(b.value().equal(wb[b.key()])) << b.key();
}

TEST(LoadWeights, AFitsCheckpointLoadsIntoANewModuleWithItsOwnState) {
  volt_test::TempDir dir;
  torch::manual_seed(1);
  WithVocab trained;
  const std::string ckpt = fit_and_checkpoint(dir, trained);
  ASSERT_FALSE(ckpt.empty());

  torch::manual_seed(2);  // other initial weights
  WithVocab fresh;
  EXPECT_FALSE(fresh.fc1->weight.equal(trained.fc1->weight));
  volt::load_weights(fresh, ckpt);
  expect_same_weights(fresh, trained);
  EXPECT_EQ(fresh.loads, 1);
  ASSERT_TRUE(fresh.vocab.defined());
  EXPECT_TRUE(fresh.vocab.equal(torch::arange(5) * 10));

  // A plain torch::nn::Module of the same shape takes the weights too (no hook to call).
  struct Shape : torch::nn::Module {
    Shape() {
      register_module("fc1", torch::nn::Linear(8, 16));
      register_module("drop", torch::nn::Dropout(0.2));
      register_module("fc2", torch::nn::Linear(16, 2));
    }
  } shape;
  volt::load_weights(shape, ckpt);
  expect_same_weights(shape, trained);

  // The same weights as a safetensors file.
  volt::save_safetensors(trained, dir / "w.safetensors");
  torch::manual_seed(3);
  TinyClassifier from_safetensors;
  volt::load_weights(from_safetensors, dir / "w.safetensors");
  expect_same_weights(from_safetensors, trained);
}

TEST(LoadWeights, ValidateTestAndPredictCallTheModulesOnLoadCheckpoint) {
  // As Lightning's restore_model: the module's own state comes with the weights at every entry
  // point (before session 53 only a resumed fit read it).
  volt_test::TempDir dir;
  WithVocab trained;
  const std::string ckpt = fit_and_checkpoint(dir, trained);
  ASSERT_FALSE(ckpt.empty());
  WithVocab other;
  volt::Trainer trainer(quiet(dir.path));
  const auto data = volt_test::loader(volt_test::blobs(32), 16, false);
  trainer.validate(other, data, ckpt);
  EXPECT_EQ(other.loads, 1);
  trainer.test(other, data, ckpt);
  EXPECT_EQ(other.loads, 2);
  trainer.predict(other, data, ckpt);
  EXPECT_EQ(other.loads, 3);
  ASSERT_TRUE(other.vocab.defined());
  EXPECT_TRUE(other.vocab.equal(torch::arange(5) * 10));
  trainer.validate(other, data);  // no checkpoint, no hook
  EXPECT_EQ(other.loads, 3);
}

// A module whose number of classes is part of its checkpointed state: on_load_checkpoint shapes
// its head to the checkpoint before the weights are loaded (Lightning's restore_model calls the
// hook first). It ran after, so a module built for 2 classes met a shape mismatch on a 3-class
// checkpoint before its hook could resize the head.
class WithClasses : public TinyClassifier {
 public:
  explicit WithClasses(int64_t classes) { set_classes(classes); }
  void set_classes(int64_t classes) { fc2 = replace_module("fc2", torch::nn::Linear(16, classes)); }
  void on_save_checkpoint(torch::serialize::OutputArchive& archive) override {
    archive.write("classes", c10::IValue(fc2->options.out_features()));
  }
  void on_load_checkpoint(torch::serialize::InputArchive& archive) override {
    c10::IValue classes;
    archive.read("classes", classes);
    if (classes.toInt() != fc2->options.out_features()) set_classes(classes.toInt());
  }
};

TEST(LoadWeights, OnLoadCheckpointShapesTheModuleBeforeTheWeightsLoad) {
  volt_test::TempDir dir;
  WithClasses trained(3);
  volt::Trainer t(quiet(dir.path).max_epochs(1));
  t.fit(trained, volt_test::loader(volt_test::blobs(64)));
  t.save_checkpoint(dir / "three.ckpt");
  WithClasses loaded(2);
  volt::load_weights(loaded, dir / "three.ckpt");
  EXPECT_EQ(loaded.fc2->weight.size(0), 3);
  expect_same_weights(loaded, trained);
  WithClasses validated(2);  // an entry point's restore
  volt::Trainer v(quiet(dir.path));
  v.validate(validated, volt_test::loader(volt_test::blobs(32), 16, false), dir / "three.ckpt");
  expect_same_weights(validated, trained);
}

TEST(LoadWeights, AMismatchListsEveryNameAndTheCheckpointUnlessNotStrict) {
  volt_test::TempDir dir;
  WithVocab trained;
  const std::string ckpt = fit_and_checkpoint(dir, trained);
  TinyClassifier wider(5);  // fc1 takes 5 features instead of 8
  const at::Tensor fc2_before = wider.fc2->weight.clone();
  ASSERT_FALSE(fc2_before.equal(trained.fc2->weight));
  const std::string err = error_of<volt::CheckpointError>([&] { volt::load_weights(wider, ckpt); });
  // Strict: nothing changed, not even the entries that match (fc2 was loaded before session 81).
  EXPECT_TRUE(wider.fc2->weight.equal(fc2_before));
  EXPECT_NE(err.find("shape of 'fc1.weight': checkpoint [16, 8] vs model [16, 5]"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("(checkpoint: '" + ckpt + "')"), std::string::npos) << err;
  // Not strict: what matches loads, the rest stays.
  TinyClassifier loose(5);
  const at::Tensor loose_fc1 = loose.fc1->weight.clone();
  testing::internal::CaptureStderr();
  volt::load_weights(loose, ckpt, /*strict=*/false);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(loose.fc2->weight.equal(trained.fc2->weight));
  EXPECT_TRUE(loose.fc1->weight.equal(loose_fc1));
  // The skipped entry is named (torch raises for it even with strict=False); volt warns.
  EXPECT_NE(said.find("strict=false left entries whose shape differs as the model had them: "
                      "shape of 'fc1.weight': checkpoint [16, 8] vs model [16, 5]"),
            std::string::npos)
      << said;
}

TEST(LoadWeights, PathsThatHoldNoCheckpointAreCheckpointErrors) {
  volt_test::TempDir dir;
  TinyClassifier model;
  auto expect = [&](const std::string& path, const std::string& phrase) {
    const std::string err =
        error_of<volt::CheckpointError>([&] { volt::load_weights(model, path); });
    EXPECT_NE(err.find(phrase), std::string::npos) << "expected \"" << phrase << "\" in: " << err;
  };
  expect(dir / "missing.ckpt", "does not exist; pass a checkpoint the Trainer wrote");
  expect("", "does not exist");
  std::ofstream(dir / "noise.ckpt") << "not a checkpoint at all";
  expect(dir / "noise.ckpt", "is not a volt checkpoint");
  ASSERT_EQ(::mkdir((dir / "folder.ckpt").c_str(), 0755), 0);
  expect(dir / "folder.ckpt", "is a folder but not a complete ZeRO or model_parallel checkpoint");
  // A volt archive that is not a Trainer checkpoint (no volt_format).
  torch::serialize::OutputArchive archive;
  archive.write("weights", torch::ones({2}));
  volt::TorchCheckpointIO().save(archive, dir / "other.ckpt");
  expect(dir / "other.ckpt", "has no volt_format entry");
  std::ofstream(dir / "bad.safetensors") << "12345678";
  EXPECT_THROW(volt::load_weights(model, dir / "bad.safetensors"), volt::CheckpointError);
}

}  // namespace
