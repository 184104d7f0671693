// save_checkpoint_folder (the ZeRO and model_parallel folders' save) in one process: a save
// replaces an earlier folder or file whole and leaves nothing beside it; a folder at the path
// that is no checkpoint is refused and kept (it used to be exchanged and deleted); a failed
// shard write keeps the previous checkpoint; a save that stopped between the fallback's two
// renames is mended by the next one. Strategy::remove_checkpoint deletes checkpoint folders
// only. (Several ranks: ModelParallel.ASaveOverAFolderThatIsNoCheckpointFailsEveryRankAtOnce.)
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "file_text.h"
#include "log_capture.h"
#include "strategies/detail/checkpoint_folder.h"
#include "tiny.h"
#include "volt/core/errors.h"
#include "volt/core/registry.h"
#include "volt/io/checkpoint_io.h"
#include "volt/strategies/single_device.h"

namespace {

using volt_test::file_text;

namespace fs = std::filesystem;
using volt::detail::FolderSave;

// A real writer whose saves fail after `ok` successful ones (a full disk, say).
class FailingIO : public volt::TorchCheckpointIO {
 public:
  explicit FailingIO(int ok) : ok_(ok) {}
  void save(torch::serialize::OutputArchive& archive, const std::string& path) override {
    if (ok_-- <= 0) throw volt::CheckpointError("[Test] no space left on the device");
    volt::TorchCheckpointIO::save(archive, path);
  }

 private:
  int ok_;
};

volt::SingleDeviceStrategy strategy(std::shared_ptr<volt::CheckpointIO> io = nullptr) {
  auto& reg = volt::registry();
  return volt::SingleDeviceStrategy(torch::kCPU, reg.accelerators.create("cpu"),
                                    reg.precisions.create("32-true"), std::move(io));
}

// A model_parallel-style folder save of one shard holding `value`.
void save(volt::Strategy& s, const std::string& path, double value) {
  torch::serialize::OutputArchive ar;
  ar.write("value", torch::full({2}, value));
  volt::detail::save_checkpoint_folder(
      s, ar,
      FolderSave{path, volt::detail::tp_shard_name(0, 1), volt::detail::kTpMetaFile,
                 "format 1\ntensor_parallel_size 1\nworld_size 1\n", "[Test]"});
}

double value_in(const std::string& path) {
  volt::TorchCheckpointIO io;
  auto ar = io.load(path + "/" + volt::detail::tp_shard_name(0, 1));
  at::Tensor t;
  ar.read("value", t);
  return t[0].item<double>();
}

TEST(CheckpointFolder, ASaveReplacesAnEarlierFolderOrFileWholeAndLeavesNothingBeside) {
  volt_test::TempDir dir;
  auto s = strategy();
  const std::string path = dir / "a.ckpt";
  save(s, path, 1.0);
  EXPECT_TRUE(volt::detail::is_checkpoint_folder(path));
  EXPECT_EQ(value_in(path), 1.0);
  save(s, path, 2.0);  // exchanged with the first
  EXPECT_EQ(value_in(path), 2.0);
  std::ofstream(dir / "b.ckpt") << "a single-file checkpoint";
  save(s, dir / "b.ckpt", 3.0);  // a file moved aside, then removed
  EXPECT_EQ(value_in(dir / "b.ckpt"), 3.0);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path)) names.insert(e.path().filename());
  EXPECT_EQ(names, (std::set<std::string>{"a.ckpt", "b.ckpt"}));
}

TEST(CheckpointFolder, AFolderThatIsNoCheckpointIsRefusedAndKept) {
  volt_test::TempDir dir;
  auto s = strategy();
  const std::string logs = dir / "logs";
  fs::create_directories(logs);
  std::ofstream(logs + "/metrics.csv") << "step,loss\n";
  try {
    save(s, logs, 1.0);
    FAIL() << "a folder holding no checkpoint was replaced";
  } catch (const volt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no volt checkpoint"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(file_text(logs + "/metrics.csv"), "step,loss\n");
  EXPECT_FALSE(fs::exists(logs + ".partial"));
  // Nor does a checkpoint's removal (ModelCheckpoint's top-k) delete it: rank 0 warns and goes
  // on (a throw on rank 0 alone would leave the others waiting in their next collective).
  const auto lines = volt_test::capture_logs([&] { s.remove_checkpoint(logs); });
  EXPECT_TRUE(volt_test::has(lines, "holds no volt checkpoint")) << lines.size();
  EXPECT_EQ(file_text(logs + "/metrics.csv"), "step,loss\n");
  save(s, dir / "c.ckpt", 1.0);
  s.remove_checkpoint(dir / "c.ckpt");
  EXPECT_FALSE(fs::exists(dir / "c.ckpt"));
}

TEST(CheckpointFolder, AFailedShardWriteKeepsThePreviousCheckpoint) {
  volt_test::TempDir dir;
  auto s = strategy(std::make_shared<FailingIO>(1));
  const std::string path = dir / "a.ckpt";
  save(s, path, 1.0);
  try {
    save(s, path, 2.0);
    FAIL() << "the failed write was not reported";
  } catch (const volt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("no space left"), std::string::npos) << e.what();
  }
  EXPECT_EQ(value_in(path), 1.0);
  // The failed save's staging folder is gone (it stayed until a save to the same path).
  EXPECT_FALSE(fs::exists(path + ".partial"));
}

// Rank 0 swaps a folder in only when every rank's shard is in it: a rank writing elsewhere
// (a disk local to its node) left rank 0 a folder whose metadata named shards it lacked.
TEST(CheckpointFolder, AShardMissingFromTheFolderFailsTheSaveAndKeepsThePreviousOne) {
  volt_test::TempDir dir;
  auto s = strategy();
  const std::string path = dir / "a.ckpt";
  save(s, path, 1.0);
  torch::serialize::OutputArchive ar;
  ar.write("value", torch::full({2}, 2.0));
  FolderSave two{path, volt::detail::tp_shard_name(0, 2), volt::detail::kTpMetaFile,
                 "format 1\ntensor_parallel_size 2\nworld_size 2\n", "[Test]"};
  two.shards = {volt::detail::tp_shard_name(0, 2), volt::detail::tp_shard_name(1, 2)};
  try {
    volt::detail::save_checkpoint_folder(s, ar, two);
    FAIL() << "a folder without every shard was swapped in";
  } catch (const volt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("is missing from"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("do not share this folder"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(value_in(path), 1.0);
  EXPECT_FALSE(fs::exists(path + ".partial"));
}

TEST(CheckpointFolder, TheNextSaveMendsASaveStoppedBetweenTheFallbacksRenames) {
  volt_test::TempDir dir;
  const std::string path = dir / "a.ckpt";
  {
    auto s = strategy();
    save(s, path, 1.0);
  }
  // Stopped after moving the previous checkpoint aside: nothing at the path.
  fs::rename(path, path + ".old");
  auto failing = strategy(std::make_shared<FailingIO>(0));
  EXPECT_THROW(save(failing, path, 2.0), volt::CheckpointError);
  EXPECT_EQ(value_in(path), 1.0);  // put back before anything else
  EXPECT_FALSE(fs::exists(path + ".old"));
  auto s = strategy();
  save(s, path, 3.0);
  EXPECT_EQ(value_in(path), 3.0);
}

}  // namespace
