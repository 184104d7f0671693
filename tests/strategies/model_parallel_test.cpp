// ModelParallelStrategy end to end with real processes over loopback (Gloo): tensor-parallel
// training under the Trainer, alone and across data-parallel replicas, equals one process on
// the global batch; its checkpoints (folders of the tensor-parallel ranks' shards, or one file
// gathered on rank 0) resume bit for bit at the same layout (also mid-accumulation), at other
// layouts and in one process; bad settings fail on every rank with a ConfigError. (The engine's
// autograd alone: tests/strategies/ tensor_parallel_test.cpp, TensorParallelTraining.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "build_paths.h"
#include "error_text.h"
#include "processes.h"
#include "requires.h"
#include "tiny.h"
#include "training_jobs.h"
#include "volt/core/registry.h"
#include "volt/io/checkpoint_io.h"
#include "volt/strategies/model_parallel.h"
#include "volt/strategies/single_device.h"

namespace {

using namespace std::chrono_literals;
using volt_test::cat;
using volt_test::expect_ranks_equal_reference;
using volt_test::Job;
using volt_test::load_flat;
using volt_test::run_job;

// The worker's model (tests/support/ddp_worker.cpp) with one deep layer: fc1 row-parallel on
// the whole input, deep.0 column-parallel, head row-parallel after it; w2 and b2 whole. AdamW
// with norm clipping at 0.5 (every step clips: the norm spans every rank's shards).
const std::vector<std::string> kModel = {"--depth", "1", "--optimizer", "adamw", "--clip", "0.5"};

// Runs `common` (world `ranks`, checkpoints every batch) whole under <dir>/a and with rank 1
// SIGKILLed after batch 5 under <dir>/b, resumes b from its newest checkpoint: every rank ends
// bit for bit as in a, each rank reading its own shards of the folder. Then one process (`model`
// flags, global batch 8, accumulating 2) resumes the same folder (consolidated) and ends where a
// ended, to fp32 round-off.
void expect_killed_run_resumes(
    const volt_test::TempDir& dir, const std::vector<std::string>& common, int ranks,
    const std::vector<std::string>& model, const std::string& accum = "2",
    const std::vector<std::pair<std::string, std::string>>& other_layouts = {}) {
  volt_test::run_full_then_killed(dir.path, common);
  if (::testing::Test::HasFatalFailure()) return;
  // The killed run's checkpoint, kept: the resumed run writes over b/every_batch.ckpt at every
  // batch, so the resumes after it read its end of training there and ended as a whatever they
  // did with the accumulated gradients (before session 95 they did).
  const std::string killed = dir / "killed.ckpt";
  std::filesystem::copy(dir / "b/every_batch.ckpt", killed,
                        std::filesystem::copy_options::recursive);
  const Job resumed = run_job(cat(
      {"--root", dir / "b", "--out", dir / "b/w", "--resume", dir / "b/every_batch.ckpt"}, common));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  // The checkpoint is a folder of shards (save_distributed_checkpoint, the default), which the
  // same layout reads without joining the model.
  EXPECT_NE(resumed.output.find("each rank reads its own shards of"), std::string::npos)
      << resumed.output;
  for (int r = 0; r < ranks; ++r) {
    const std::string suffix = "/w.rank" + std::to_string(r) + ".pt";
    EXPECT_TRUE(torch::equal(load_flat(dir / ("a" + suffix)), load_flat(dir / ("b" + suffix))))
        << "rank " << r;
  }
  const Job one = run_job(cat({"--root", dir / "c", "--out", dir / "c/w", "--resume", killed,
                               "--devices", "1", "--batch", "8", "--epochs", "1", "--accum", accum},
                              model));
  ASSERT_EQ(one.code, 0) << one.output;
  const auto whole = load_flat(dir / "a/w.rank0.pt"), single = load_flat(dir / "c/w.rank0.pt");
  EXPECT_TRUE(torch::allclose(single, whole, 1e-5, 1e-6))
      << "max diff " << (single - whole).abs().max().item<double>();
  // Other layouts on the same global batch (each given as --devices and --tp).
  for (const auto& [devices, tp] : other_layouts) {
    SCOPED_TRACE("resumed at --devices " + devices + " --tp " + tp);
    const std::string root = dir / ("d" + devices + "x" + tp);
    const int64_t batch = 8 / (std::stoll(devices) / std::stoll(tp));
    const Job j = run_job(
        cat({"--root", root, "--out", root + "/w", "--resume", killed, "--devices", devices, "--tp",
             tp, "--batch", std::to_string(batch), "--epochs", "1", "--accum", accum},
            model));
    ASSERT_EQ(j.code, 0) << j.output;
    for (int r = 0; r < std::stoi(devices); ++r) {
      const auto w = load_flat(root + "/w.rank" + std::to_string(r) + ".pt");
      EXPECT_TRUE(torch::allclose(w, whole, 1e-5, 1e-6))
          << "rank " << r << " max diff " << (w - whole).abs().max().item<double>();
    }
  }
}

TEST(ModelParallel, TwoTensorParallelRanksEqualOneProcess) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto ref = volt_test::single_process_reference(dir.path, 16, 2, 1, false, kModel);
  const Job j = run_job(cat({"--root", dir.path, "--out", dir / "tp", "--devices", "2", "--tp", "2",
                             "--batch", "16", "--epochs", "2"},
                            kModel));
  ASSERT_EQ(j.code, 0) << j.output;
  EXPECT_NE(j.output.find("1 data-parallel x 2 tensor-parallel processes"), std::string::npos)
      << j.output;
  // fc1 (8x8 weight split by columns, its bias whole): 40 elements; deep.0 (rows): 36; head
  // (columns, its bias whole): 10; w2 and b2 whole: 72. 158 of 234 floats.
  EXPECT_NE(j.output.find("rank 0: 3 layers split 2 ways, holding 632 of 936 parameter bytes"),
            std::string::npos)
      << j.output;
  // One replica: nothing to average over, no buckets.
  EXPECT_NE(j.output.find("rank 1 gradient reducer: none, 0 elements"), std::string::npos)
      << j.output;
  expect_ranks_equal_reference(dir / "tp", 2, ref);  // every rank leaves with the whole model
}

// bf16-mixed with a GEMM size rule keeping every GEMM of this small model in fp32: the split
// layers follow it as one process does, so the runs agree to fp32 round-off (a row-parallel
// addmm's product used to run as mm, which autocast always lowers: 1e-3 away).
TEST(ModelParallel, Bf16MixedSplitLayersFollowTheCpuGemmSizeRule) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto model = cat(kModel, {"--linear-min-macs", "1000000000"});
  const auto ref = volt_test::single_process_reference(dir.path, 16, 1, 1, false, model);
  const Job j = run_job(cat({"--root", dir.path, "--out", dir / "tp", "--devices", "2", "--tp", "2",
                             "--batch", "16", "--epochs", "1"},
                            model));
  ASSERT_EQ(j.code, 0) << j.output;
  expect_ranks_equal_reference(dir / "tp", 2, ref);
}

TEST(ModelParallel, TwoReplicasOfTwoTensorParallelRanksEqualOneProcessOnTheGlobalBatch) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto ref = volt_test::single_process_reference(dir.path, 16, 1, 1, false, kModel);
  // 4 processes: ranks {0, 1} and {2, 3} split the layers, each pair reads half the data.
  const Job j = run_job(cat({"--root", dir.path, "--out", dir / "tp", "--devices", "4", "--tp", "2",
                             "--batch", "8", "--epochs", "1"},
                            kModel));
  ASSERT_EQ(j.code, 0) << j.output;
  EXPECT_NE(j.output.find("2 data-parallel x 2 tensor-parallel processes"), std::string::npos)
      << j.output;
  // The replicas average during backward with DDP's buckets, laid out over each rank's shards
  // (158 of the model's 234 gradient elements).
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(j.output.find("rank " + std::to_string(r) +
                            " gradient reducer: buckets of 158 "
                            "elements"),
              std::string::npos)
        << j.output;
  }
  expect_ranks_equal_reference(dir / "tp", 4, ref);
}

// sync_batchnorm: the BatchNorm after fc1 (on its summed, whole output) normalises over both
// replicas' batches, so every rank of 2 replicas of 2 tensor-parallel ranks ends as one process
// on the global batch, weights and running statistics; with one replica there is nothing to
// synchronise and the same holds. Without it each replica's statistics are its own half's (the
// control: the comparison can fail).
TEST(ModelParallel, SyncBatchnormOverReplicasEqualsOneProcessOnTheGlobalBatch) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  // SGD: behind the BatchNorm one hidden unit's gradient is round-off around zero, which AdamW
  // scales up to a whole step (one process and tensor parallelism sum in another order, 7e-3
  // apart with AdamW even without replicas).
  const std::vector<std::string> model = {"--depth", "1",   "--optimizer", "sgd",
                                          "--clip",  "0.5", "--batchnorm", "1"};
  const auto ref = volt_test::single_process_reference(dir.path, 16, 1, 1, false, model);
  const Job j = run_job(cat({"--root", dir.path, "--out", dir / "sync", "--devices", "4", "--tp",
                             "2", "--batch", "8", "--epochs", "1", "--sync-bn", "1"},
                            model));
  ASSERT_EQ(j.code, 0) << j.output;
  EXPECT_NE(j.output.find("sync_batchnorm: 1 BatchNorm layers normalise over 2 data-parallel "
                          "replicas' batches"),
            std::string::npos)
      << j.output;
  expect_ranks_equal_reference(dir / "sync", 4, ref);
  const Job one = run_job(cat({"--root", dir.path, "--out", dir / "one", "--devices", "2", "--tp",
                               "2", "--batch", "16", "--epochs", "1", "--sync-bn", "1"},
                              model));
  ASSERT_EQ(one.code, 0) << one.output;
  expect_ranks_equal_reference(dir / "one", 2, ref);
  const Job local = run_job(cat({"--root", dir.path, "--out", dir / "local", "--devices", "4",
                                 "--tp", "2", "--batch", "8", "--epochs", "1"},
                                model));
  ASSERT_EQ(local.code, 0) << local.output;
  EXPECT_FALSE(torch::allclose(load_flat(dir / "local.rank0.pt"), ref, 1e-3, 1e-4))
      << "per-replica BatchNorm matched the global batch: the test above could not fail";
}

// BackboneFinetuning over 2 replicas of 2 tensor-parallel ranks: fc1 (row-parallel) is frozen
// when the replicas' buckets are built and unfrozen at epoch 1, when the strategy builds them
// again over the new set, so fc1's shards are averaged over the replicas from then on (not
// rebuilding leaves them each replica's own: the ranks drift apart).
TEST(ModelParallel, BackboneFinetuningOverReplicasEqualsOneProcess) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto model = cat(kModel, {"--finetune", "1"});
  const auto ref = volt_test::single_process_reference(dir.path, 16, 3, 1, false, model);
  const Job j = run_job(cat({"--root", dir.path, "--out", dir / "tp", "--devices", "4", "--tp", "2",
                             "--batch", "8", "--epochs", "3"},
                            model));
  ASSERT_EQ(j.code, 0) << j.output;
  EXPECT_NE(j.output.find("the parameters that require a gradient changed"), std::string::npos)
      << j.output;
  expect_ranks_equal_reference(dir / "tp", 4, ref);
}

// The replicas' buckets are DDP's, with its options (tests/strategies/ddp_test.cpp has DDP's
// side). A parameter the forward never uses ("spare") over 2 replicas of 2 tensor-parallel
// ranks: find_unused_parameters trains it as one process does; without it DDP's reducer stops
// the job at the second step, naming the option. Activation checkpointing trains with the
// defaults, and with find_unused_parameters it fails naming static_graph, which covers both.
TEST(ModelParallel, ReplicaBucketsTakeDdpsOptionsForUnusedParametersAndCheckpointing) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto common = cat({"--root", dir.path, "--devices", "4", "--tp", "2", "--batch", "8",
                           "--epochs", "1", "--timeout", "20"},
                          kModel);
  const auto unused = volt_test::single_process_reference(dir.path, 16, 1, 1, false,
                                                          cat(kModel, {"--unused", "1"}));
  const Job found =
      run_job(cat({"--out", dir / "found", "--unused", "1", "--find-unused", "1"}, common));
  ASSERT_EQ(found.code, 0) << found.output;
  expect_ranks_equal_reference(dir / "found", 4, unused);
  const Job missing = run_job(cat({"--out", dir / "missing", "--unused", "1"}, common), 90s);
  EXPECT_EQ(missing.code, 1) << missing.output;
  EXPECT_NE(missing.output.find("set find_unused_parameters(true)"), std::string::npos)
      << missing.output;

  const auto plain = volt_test::single_process_reference(dir.path, 16, 1, 1, false, kModel);
  const Job ckpt = run_job(cat({"--out", dir / "ckpt", "--checkpoint-activations", "1"}, common));
  ASSERT_EQ(ckpt.code, 0) << ckpt.output;
  expect_ranks_equal_reference(dir / "ckpt", 4, plain);
  const Job both = run_job(
      cat({"--out", dir / "both", "--checkpoint-activations", "1", "--find-unused", "1"}, common),
      90s);
  EXPECT_EQ(both.code, 1) << both.output;
  EXPECT_NE(both.output.find("use static_graph(true) instead"), std::string::npos) << both.output;
  const Job fixed = run_job(cat({"--out", dir / "static", "--checkpoint-activations", "1",
                                 "--unused", "1", "--static-graph", "1"},
                                common));
  ASSERT_EQ(fixed.code, 0) << fixed.output;
  expect_ranks_equal_reference(dir / "static", 4, unused);
}

TEST(ModelParallel, FourTensorParallelRanksWithAccumulationEqualOneProcess) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto ref = volt_test::single_process_reference(dir.path, 8, 1, 2, false, kModel);
  const Job j = run_job(cat({"--root", dir.path, "--out", dir / "tp", "--devices", "4", "--tp", "4",
                             "--batch", "8", "--epochs", "1", "--accum", "2"},
                            kModel));
  ASSERT_EQ(j.code, 0) << j.output;
  expect_ranks_equal_reference(dir / "tp", 4, ref);
}

// A whole parameter used on split activations (a scalar scaling deep.0's column-parallel
// output before the row-parallel head) gets from each rank's backward only its features' part
// of the gradient. Listed in partial_grads, the parts are summed over the tensor-parallel group
// as each backward reaches it: 2 tensor-parallel ranks (2 epochs), and 2 replicas of 2 ranks
// accumulating 2 micro-batches, end as one process. Unlisted, the first optimizer step stops
// every rank with a ConfigError naming it (before session 99 the ranks' copies drifted apart and
// training went on).
TEST(ModelParallel, AWholeParameterOnSplitActivationsIsSummedWhenListedAndRefusedOtherwise) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto model = cat(kModel, {"--deep-scale", "1"});
  for (const char* sub : {"acc", "u", "n", "s"}) std::filesystem::create_directories(dir / sub);
  const auto ref = volt_test::single_process_reference(dir.path, 16, 2, 1, false, model);
  const Job j = run_job(cat({"--root", dir.path, "--out", dir / "tp", "--devices", "2", "--tp", "2",
                             "--batch", "16", "--epochs", "2", "--partial-grads", "scale"},
                            model));
  ASSERT_EQ(j.code, 0) << j.output;
  expect_ranks_equal_reference(dir / "tp", 2, ref);

  // 2 replicas of batch 4: a global batch of 8, accumulated over 2.
  const auto accumulated = volt_test::single_process_reference(dir / "acc", 8, 1, 2, false, model);
  const Job k =
      run_job(cat({"--root", dir / "acc", "--out", dir / "acc/tp", "--devices", "4", "--tp", "2",
                   "--batch", "4", "--epochs", "1", "--accum", "2", "--partial-grads", "scale"},
                  model));
  ASSERT_EQ(k.code, 0) << k.output;
  expect_ranks_equal_reference(dir / "acc/tp", 4, accumulated);

  const Job unlisted = run_job(cat({"--root", dir / "u", "--out", dir / "u/tp", "--devices", "2",
                                    "--tp", "2", "--batch", "16", "--epochs", "1"},
                                   model),
                               60s);
  EXPECT_EQ(unlisted.code, 1) << unlisted.output;
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(unlisted.output.find("rank " + std::to_string(r)), std::string::npos);
  }
  const std::string message =
      "[ModelParallelStrategy] the gradients of the whole parameters 'scale' differ across the "
      "tensor-parallel group";
  size_t seen = 0;
  for (size_t at = unlisted.output.find(message); at != std::string::npos;
       at = unlisted.output.find(message, at + 1)) {
    ++seen;
  }
  EXPECT_EQ(seen, 2u) << unlisted.output;  // every rank

  // A pattern matching nothing, or a split weight, is refused when the strategy splits.
  const Job nothing =
      run_job(cat({"--root", dir / "n", "--out", dir / "n/tp", "--devices", "2", "--tp", "2",
                   "--batch", "16", "--epochs", "1", "--partial-grads", "scale,nope"},
                  model),
              60s);
  EXPECT_NE(nothing.output.find("partial_grads entry \"nope\" matches no parameter"),
            std::string::npos)
      << nothing.output;
  const Job split =
      run_job(cat({"--root", dir / "s", "--out", dir / "s/tp", "--devices", "2", "--tp", "2",
                   "--batch", "16", "--epochs", "1", "--partial-grads", "deep.0.weight"},
                  model),
              60s);
  EXPECT_NE(split.output.find("matches 'deep.0.weight', which the plan splits"), std::string::npos)
      << split.output;
}

TEST(ModelParallel, AKilledRankResumesBitForBitMidAccumulationAndTheCheckpointLoadsInOneProcess) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  // 2 replicas of 2 tensor-parallel ranks, accumulating 3 batches: rank 1 dies at batch 5
  // (before that batch's checkpoint), so the newest checkpoint (batch 4) holds one micro-batch of
  // the second accumulation (with 2 it held none: a step's end).
  const auto common = cat({"--devices", "4", "--tp", "2", "--batch", "4", "--epochs", "1",
                           "--accum", "3", "--ckpt-every-batch", "1"},
                          kModel);
  // The checkpoint's accumulated gradients are the replicas' mean for the one-process resume and
  // for other layouts (1 x 4, 1 x 2), which read it since the layout is recorded beside them:
  // they read the rank's own entry, at 1 x 4 another replica's sums for ranks 2 and 3 (0.027 off
  // the uninterrupted run), at 1 x 2 replica 0's alone.
  expect_killed_run_resumes(dir, common, 4, kModel, "3", {{"4", "4"}, {"2", "2"}});
}

// EMAWeightAveraging under tensor parallelism: each rank averages its shards, and checkpoints
// hold the average whole (joined over the group, as the weights), so a killed run resumes bit
// for bit and one process resumes the same checkpoint (before, the shards' shapes were saved and
// one process refused them).
TEST(ModelParallel, WeightAveragesAreSavedWholeAndResumeAtAnyLayout) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto model = cat(kModel, {"--ema", "0.9"});
  const auto common = cat({"--devices", "2", "--tp", "2", "--batch", "8", "--epochs", "1",
                           "--accum", "2", "--ckpt-every-batch", "1"},
                          model);
  expect_killed_run_resumes(dir, common, 2, model);
}

// Every entry of a checkpoint's tree by its path ("state_dict/fc1.weight"), sub-archives
// flattened.
void flatten(torch::serialize::InputArchive& ar, const std::string& prefix,
             std::map<std::string, c10::IValue>& out) {
  for (const auto& key : ar.keys()) {
    torch::serialize::InputArchive sub;
    if (ar.try_read(key, sub)) {
      flatten(sub, prefix + key + "/", out);
      continue;
    }
    c10::IValue v;
    if (ar.try_read(key, v)) out[prefix + key] = v;
  }
}

std::map<std::string, c10::IValue> entries_of_file(const std::string& path) {
  auto in = volt::TorchCheckpointIO().load(path);
  std::map<std::string, c10::IValue> out;
  flatten(in, "", out);
  return out;
}

// save_distributed_checkpoint (the default): a 2x2 run's checkpoint is a folder of the first
// group's two shard files and the metadata file; a shard holds its rank's half of a split weight
// and its optimizer state; consolidated, the folder is the file the same run writes with the
// option off (weights and optimizer state gathered on rank 0), entry for entry and bit for bit.
// A damaged folder is a CheckpointError naming what is wrong.
TEST(ModelParallel, DistributedCheckpointsAreShardFoldersThatConsolidateToTheGatheredFile) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto common = cat({"--devices", "4", "--tp", "2", "--batch", "4", "--epochs", "1",
                           "--accum", "2", "--ckpt-every-batch", "1"},
                          kModel);
  const Job sharded = run_job(cat({"--root", dir / "s", "--out", dir / "s/w"}, common));
  ASSERT_EQ(sharded.code, 0) << sharded.output;
  const Job gathered =
      run_job(cat({"--root", dir / "g", "--out", dir / "g/w", "--save-distributed", "0"}, common));
  ASSERT_EQ(gathered.code, 0) << gathered.output;
  const std::string folder = dir / "s/every_batch.ckpt";
  ASSERT_TRUE(volt::is_model_parallel_checkpoint(folder));
  EXPECT_FALSE(volt::is_model_parallel_checkpoint(dir / "g/every_batch.ckpt"));
  std::set<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(folder)) {
    files.insert(e.path().filename().string());
  }
  EXPECT_EQ(files, (std::set<std::string>{"model_parallel_checkpoint.txt", "tp_rank_0_of_2.ckpt",
                                          "tp_rank_1_of_2.ckpt"}));
  // The worker's deep.0 (8 x 8 whole) is column-parallel: each shard holds 4 output rows.
  auto shard = entries_of_file(folder + "/tp_rank_1_of_2.ckpt");
  auto whole = entries_of_file(dir / "g/every_batch.ckpt");
  ASSERT_TRUE(shard.count("state_dict/deep.0.weight") && whole.count("state_dict/deep.0.weight"));
  const at::Tensor w_shard = shard["state_dict/deep.0.weight"].toTensor();
  const at::Tensor w_whole = whole["state_dict/deep.0.weight"].toTensor();
  EXPECT_EQ(w_shard.size(0) * 2, w_whole.size(0));
  EXPECT_TRUE(at::equal(w_shard, w_whole.narrow(0, w_shard.size(0), w_shard.size(0))));

  volt::consolidate_model_parallel_checkpoint(folder, dir / "c.ckpt");
  auto joined = entries_of_file(dir / "c.ckpt");
  std::set<std::string> joined_keys, whole_keys;
  for (const auto& kv : joined) joined_keys.insert(kv.first);
  for (const auto& kv : whole) whole_keys.insert(kv.first);
  EXPECT_EQ(joined_keys, whole_keys);
  int tensors = 0;
  for (const auto& [key, v] : whole) {
    auto it = joined.find(key);
    if (it == joined.end() || key == "loop/fit_elapsed_s") continue;  // the runs' own clocks
    if (v.isTensor()) {
      ++tensors;
      EXPECT_TRUE(it->second.isTensor() && at::equal(it->second.toTensor(), v.toTensor())) << key;
    } else {
      EXPECT_EQ(it->second, v) << key;
    }
  }
  EXPECT_GT(tensors, 20);
  volt::consolidate_model_parallel_checkpoint(folder, dir / "weights.ckpt", /*weights_only=*/true);
  for (const auto& kv : entries_of_file(dir / "weights.ckpt")) {
    EXPECT_NE(kv.first.rfind("optimizers/optimizer_", 0), 0u) << kv.first;  // the count stays
  }

  // Damage, on copies of the folder.
  const auto copy = [&](const std::string& name) {
    const std::string to = dir / name;
    std::filesystem::copy(folder, to, std::filesystem::copy_options::recursive);
    return to;
  };
  const auto consolidate_error = [&](const std::string& f) {
    return volt_test::error_of<volt::CheckpointError>(
        [&] { volt::consolidate_model_parallel_checkpoint(f, dir / "out.ckpt"); });
  };
  const std::string partial = copy("partial.ckpt");
  std::filesystem::remove(partial + "/model_parallel_checkpoint.txt");
  EXPECT_FALSE(volt::is_model_parallel_checkpoint(partial));
  EXPECT_NE(consolidate_error(partial).find("is not a complete model_parallel checkpoint folder"),
            std::string::npos);
  // Any strategy refuses it as incomplete (before, a folder reached torch's reader).
  volt::SingleDeviceStrategy one(c10::Device(c10::kCPU),
                                 volt::registry().accelerators.create("cpu"),
                                 volt::registry().precisions.create("32-true"));
  EXPECT_NE(volt_test::error_of<volt::CheckpointError>([&] {
              one.load_checkpoint(partial);
            }).find("an incomplete checkpoint folder"),
            std::string::npos);
  // A complete folder loads in one process consolidated: the gathered file's weights.
  auto loaded = one.load_checkpoint(folder);
  torch::serialize::InputArchive dict;
  loaded.read("state_dict", dict);
  at::Tensor w;
  dict.read("deep.0.weight", w);
  EXPECT_TRUE(at::equal(w, w_whole));
  const std::string missing = copy("missing.ckpt");
  std::filesystem::remove(missing + "/tp_rank_1_of_2.ckpt");
  EXPECT_NE(consolidate_error(missing).find("lacks the shard of tensor-parallel rank 1 of 2"),
            std::string::npos)
      << consolidate_error(missing);
  const std::string swapped = copy("swapped.ckpt");
  std::filesystem::rename(swapped + "/tp_rank_0_of_2.ckpt", swapped + "/x");
  std::filesystem::rename(swapped + "/tp_rank_1_of_2.ckpt", swapped + "/tp_rank_0_of_2.ckpt");
  std::filesystem::rename(swapped + "/x", swapped + "/tp_rank_1_of_2.ckpt");
  EXPECT_NE(consolidate_error(swapped).find("the folder mixes checkpoints"), std::string::npos)
      << consolidate_error(swapped);
  const std::string damaged = copy("damaged.ckpt");
  std::ofstream(damaged + "/model_parallel_checkpoint.txt", std::ios::trunc) << "format 7\n";
  EXPECT_NE(consolidate_error(damaged).find("is damaged or from another volt"), std::string::npos)
      << consolidate_error(damaged);
}

// A folder resumes wherever a file does: at another tensor-parallel size (4 ranks of one
// replica: consolidated, then split four ways) and under a plan that splits fewer layers at the
// same size (the shards do not fit: consolidated), each ending within fp32 round-off of the
// uninterrupted run; a folder missing a shard fails every rank quickly, naming it.
TEST(ModelParallel, AShardFolderResumesAtAnotherSizeAndUnderAnotherPlan) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto common = cat({"--devices", "4", "--tp", "2", "--batch", "4", "--epochs", "1",
                           "--accum", "2", "--ckpt-every-batch", "1"},
                          kModel);
  volt_test::run_full_then_killed(dir.path, common);
  const std::string folder = dir / "b/every_batch.ckpt";
  ASSERT_TRUE(volt::is_model_parallel_checkpoint(folder));
  const auto whole = load_flat(dir / "a/w.rank0.pt");
  const Job four =
      run_job(cat({"--root", dir / "t", "--out", dir / "t/w", "--resume", folder, "--devices", "4",
                   "--tp", "4", "--batch", "8", "--epochs", "1", "--accum", "2"},
                  kModel));
  ASSERT_EQ(four.code, 0) << four.output;
  const Job other = run_job(
      cat({"--root", dir / "p", "--out", dir / "p/w", "--resume", folder, "--devices", "2", "--tp",
           "2", "--tp-plan", "fc1=rowwise", "--batch", "8", "--epochs", "1", "--accum", "2"},
          kModel));
  ASSERT_EQ(other.code, 0) << other.output;
  EXPECT_NE(other.output.find("does not fit this layout's shards (another plan"), std::string::npos)
      << other.output;
  // A shard missing at the same size fails every rank, naming it, well inside the timeout (the
  // rank that cannot read its file does not leave the other waiting).
  std::filesystem::copy(folder, dir / "half.ckpt", std::filesystem::copy_options::recursive);
  std::filesystem::remove(dir / "half.ckpt/tp_rank_1_of_2.ckpt");
  const auto start = std::chrono::steady_clock::now();
  const Job half = run_job(
      cat({"--root", dir / "h", "--out", dir / "h/w", "--resume", dir / "half.ckpt", "--devices",
           "2", "--tp", "2", "--batch", "8", "--epochs", "1", "--accum", "2", "--timeout", "20"},
          kModel),
      60s);
  EXPECT_EQ(half.code, 1) << half.output;
  EXPECT_NE(half.output.find("lacks the shard of tensor-parallel rank 1 of 2"), std::string::npos)
      << half.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  for (const std::string got : {"t/w.rank0.pt", "t/w.rank3.pt", "p/w.rank0.pt", "p/w.rank1.pt"}) {
    const auto w = load_flat(dir / got);
    EXPECT_TRUE(torch::allclose(w, whole, 1e-5, 1e-6))
        << got << " max diff " << (w - whole).abs().max().item<double>();
  }
}

// ModelPruning ranks and masks whole weights: refused before training (it used to fail after
// the first epoch with a shape mismatch).
// A checkpoint path naming a folder that holds no checkpoint (a log folder, say): rank 0 refuses
// to replace it (the swap would have deleted what it holds) and every rank stops at once, the
// other one told that rank 0 failed, long before the 60 s collective timeout; the folder is kept.
TEST(ModelParallel, ASaveOverAFolderThatIsNoCheckpointFailsEveryRankAtOnce) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  std::filesystem::create_directories(dir / "every_batch.ckpt");
  std::ofstream(dir / "every_batch.ckpt/notes.txt") << "mine";
  const Job j = run_job(cat({"--root", dir.path, "--out", dir / "w", "--devices", "2", "--tp", "2",
                             "--batch", "8", "--epochs", "1", "--ckpt-every-batch", "1"},
                            kModel),
                        40s);
  EXPECT_EQ(j.code, 1) << j.output;
  EXPECT_NE(j.output.find("holds no volt checkpoint"), std::string::npos) << j.output;
  EXPECT_NE(j.output.find("another rank failed to stage"), std::string::npos) << j.output;
  std::ifstream kept(dir / "every_batch.ckpt/notes.txt");
  std::string text;
  kept >> text;
  EXPECT_EQ(text, "mine");
}

TEST(ModelParallel, ModelPruningIsAConfigErrorBeforeTraining) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const Job j = run_job(cat({"--root", dir.path, "--out", dir / "x", "--devices", "2", "--tp", "2",
                             "--batch", "8", "--epochs", "1", "--prune", "0.5"},
                            kModel),
                        60s);
  EXPECT_EQ(j.code, 1) << j.output;
  EXPECT_NE(j.output.find("does not work with the model_parallel strategy"), std::string::npos)
      << j.output;
  EXPECT_EQ(j.output.find("on_train_epoch_end"), std::string::npos) << j.output;  // at setup
}

TEST(ModelParallel, BadSettingsAreConfigErrors) {
  auto cpu = volt::registry().accelerators.create("cpu");
  auto fp32 = volt::registry().precisions.create("32-true");
  auto make = [&](volt::ModelParallelStrategyOptions o) {
    volt::ModelParallelStrategy s(std::move(o), cpu, fp32, 2);
  };
  const auto plan = volt::parse_tp_plan({"fc1=colwise"});
  EXPECT_THROW(make(volt::ModelParallelStrategyOptions()), volt::ConfigError);  // nothing split
  EXPECT_THROW(make(volt::ModelParallelStrategyOptions().plan(plan).tensor_parallel_size(-1)),
               volt::ConfigError);
  EXPECT_THROW(make(volt::ModelParallelStrategyOptions().plan(plan).num_heads(-2)),
               volt::ConfigError);
  EXPECT_THROW(make(volt::ModelParallelStrategyOptions().plan(plan).timeout_s(0)),
               volt::ConfigError);
  EXPECT_THROW(make(volt::ModelParallelStrategyOptions().plan(plan).bucket_cap_mb(0)),
               volt::ConfigError);
  EXPECT_NO_THROW(make(volt::ModelParallelStrategyOptions().plan(plan)));
}

// The registered name (CLI / YAML) passes every option on; static_graph did not reach the
// strategy before session 78.
TEST(ModelParallel, TheRegisteredNameTakesEveryOption) {
  auto& reg = volt::registry();
  volt::StrategyContext ctx{reg.accelerators.create("cpu"), reg.precisions.create("32-true"), 2, 1};
  auto s = std::dynamic_pointer_cast<volt::ModelParallelStrategy>(reg.strategies.create(
      "model_parallel",
      volt::Args("model_parallel", {{"tp_plan", std::vector<std::string>{"fc1=colwise"}},
                                    {"static_graph", true},
                                    {"find_unused_parameters", true},
                                    {"bucket_cap_mb", 5.0},
                                    {"save_distributed_checkpoint", false},
                                    {"tensor_parallel_size", int64_t{2}},
                                    {"num_heads", int64_t{4}},
                                    {"partial_grads", std::vector<std::string>{"*.scale"}},
                                    {"timeout_s", 9.0}}),
      ctx));
  ASSERT_NE(s, nullptr);
  const auto& o = s->model_parallel_options();
  EXPECT_TRUE(o.static_graph());
  EXPECT_TRUE(o.find_unused_parameters());
  EXPECT_DOUBLE_EQ(o.bucket_cap_mb(), 5.0);
  EXPECT_FALSE(o.save_distributed_checkpoint());
  EXPECT_EQ(o.tensor_parallel_size(), 2);
  EXPECT_EQ(o.num_heads(), 4);
  EXPECT_DOUBLE_EQ(o.timeout_s(), 9.0);
  EXPECT_EQ(o.plan().size(), 1u);
  EXPECT_EQ(o.partial_grads(), std::vector<std::string>{"*.scale"});
  // The defaults are Lightning's: a checkpoint is a folder of shards.
  EXPECT_TRUE(volt::ModelParallelStrategyOptions().save_distributed_checkpoint());
}

TEST(ModelParallel, ASizeNotDividingTheWorldFailsEveryRank) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const Job three = run_job(cat({"--root", dir.path, "--out", dir / "x", "--devices", "2", "--tp",
                                 "3", "--batch", "8", "--epochs", "1"},
                                kModel),
                            60s);
  EXPECT_EQ(three.code, 1) << three.output;
  EXPECT_NE(three.output.find("tensor_parallel_size=3 does not divide the 2 processes"),
            std::string::npos)
      << three.output;
}

// An optimizer whose state the strategy cannot split and join (LBFGS's history) is refused at
// setup, before anything collective, naming the optimizers that work.
TEST(ModelParallel, AnOptimizerWithUnknownStateIsAConfigError) {
  auto cpu = volt::registry().accelerators.create("cpu");
  auto fp32 = volt::registry().precisions.create("32-true");
  volt::ModelParallelStrategy s(
      volt::ModelParallelStrategyOptions().plan(volt::parse_tp_plan({"fc1=colwise"})), cpu, fp32,
      1);
  volt_test::TinyClassifier m;
  std::vector<volt::OptimizerConfig> configs{
      volt::OptimizerConfig(std::make_shared<torch::optim::LBFGS>(m.parameters()))};
  try {
    s.setup_optimizers(m, configs);
    ADD_FAILURE() << "LBFGS was accepted";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("has no known state layout; use SGD, Adam, AdamW, "
                                         "RMSprop, Adagrad, FusedSGD or FusedAdamW"),
              std::string::npos)
        << e.what();
  }
}

// volt's fused AdamW (state in flat buffers laid out at its first step, after the split) trains
// split as one process does with it, and its checkpoints hold its state: 2 tensor-parallel
// ranks accumulating 2 batches, a rank SIGKILLed mid-accumulation, resume bit for bit, and one
// process resumes the checkpoint to where the 2 processes ended.
TEST(ModelParallel, VoltsFusedAdamWTrainsSplitAndResumes) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const std::vector<std::string> fused = {"--depth",     "1",      "--optimizer",
                                          "fused_adamw", "--clip", "0.5"};
  const auto ref = volt_test::single_process_reference(dir / "ref", 8, 1, 2, false, fused);
  const auto common = cat({"--devices", "2", "--tp", "2", "--batch", "8", "--epochs", "1",
                           "--accum", "2", "--ckpt-every-batch", "1"},
                          fused);
  expect_killed_run_resumes(dir, common, 2, fused);
  expect_ranks_equal_reference(dir / "a/w", 2, ref);
}

}  // namespace
