// DeepSpeedStrategy (ZeRO stages 1, 2 and 3) end to end with real processes over loopback (Gloo):
// weights after training equal one process on the global batch (and so DDP, which
// tests/strategies/ddp_test.cpp holds to the same reference), per-rank memory follows the
// paper's formulas, checkpoints are per-rank shard folders that resume exactly and load at
// another world size; bad options are typed errors.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "deepspeed_testing.h"
#include "processes.h"
#include "requires.h"
#include "tiny.h"
#include "training_jobs.h"
#include "volt/accelerators/cpu_memory.h"
#include "volt/io/checkpoint_io.h"
#include "volt/strategies/deepspeed.h"

namespace {

using namespace std::chrono_literals;
using volt_test::expect_ranks_equal_reference;
using volt_test::Job;
using volt_test::load_flat;
using volt_test::run_job;
using volt_test::single_process_reference;

using volt_test::cat;
struct Case {
  int stage;
  int devices;
  const char* optimizer;
  int accum;
};

struct Memory {
  double params, grads, state, numel, master;
};

Memory memory_of(const std::string& output, int rank) {
  std::smatch m;
  const std::regex re("rank " + std::to_string(rank) +
                      " done .* zero_memory params=(\\d+) grads=(\\d+) state=(\\d+) "
                      "master=(\\d+) numel=(\\d+)");
  EXPECT_TRUE(std::regex_search(output, m, re)) << output;
  if (m.size() < 6) return {};
  return {std::stod(m[1]), std::stod(m[2]), std::stod(m[3]), std::stod(m[5]), std::stod(m[4])};
}

// Returns the ZeRO run's output.
std::string expect_zero_equals_one_process(const Case& c,
                                           const std::vector<std::string>& extra = {},
                                           double rtol = 1e-5, double atol = 1e-6) {
  volt_test::TempDir dir;
  const int global = 16;
  const std::vector<std::string> common = cat({"--optimizer", c.optimizer}, extra);
  const auto ref = single_process_reference(dir.path, global, 1, c.accum, false, common);
  auto job = run_job(
      cat({"--root", dir.path, "--out", dir / "zero", "--devices", std::to_string(c.devices),
           "--batch", std::to_string(global / c.devices), "--epochs", "1", "--accum",
           std::to_string(c.accum), "--zero", std::to_string(c.stage)},
          common));
  EXPECT_EQ(job.code, 0) << job.output;
  if (job.code != 0) return job.output;
  EXPECT_NE(job.output.find("zero_memory"), std::string::npos) << job.output;
  expect_ranks_equal_reference(dir / "zero", c.devices, ref, rtol, atol);
  return job.output;
}

// ------------------------------------------------------------------------------ equality

// One rank: the engine skips its buckets and collectives (the reduction of one addend is the
// gradient itself), so every stage gives the single-process bits exactly, with accumulation
// (stage 1 sums locally, stages 2 and 3 add each micro-batch into the gradient chunks).
TEST(DeepSpeed, AtOneRankEveryStageGivesTheSingleProcessBitsExactly) {
  VOLT_REQUIRE_GLOO();
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string out = expect_zero_equals_one_process({stage, 1, "adam", 2}, {}, 0.0, 0.0);
    if (stage == 3) {
      // Stage 3 keeps the parameters whole at one rank (nothing is offloaded): no partitioned
      // chunk, no gather, and the parameters' bytes are the model's (fp32), not more.
      EXPECT_NE(out.find("stage 3 at one rank: the parameters stay whole"), std::string::npos)
          << out;
      EXPECT_NE(out.find(" gathers=0 "), std::string::npos) << out;
      EXPECT_NE(out.find(" max_chunk=0"), std::string::npos) << out;
      const Memory m = memory_of(out, 0);
      EXPECT_EQ(m.params, 4 * m.numel) << out;
    }
  }
}

// Frozen parameters in the optimizer (Adam(module.parameters()) beside a frozen fc1) stay whole
// and unstepped, as DeepSpeed keeps only the trainable ones and a torch optimizer skips a
// parameter without a gradient: every stage equals one process. It was a ConfigError.
TEST(DeepSpeed, FrozenParametersInTheOptimizerStayAsTheyAre) {
  VOLT_REQUIRE_GLOO();
  for (int stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    expect_zero_equals_one_process({stage, 2, "adam", 1}, {"--frozen-fc1", "1"});
  }
}

// A module whose optimizer_zero_grad calls optimizer.zero_grad() itself clears only the chunk
// views the optimizer holds: before session 82 the full gradients (stage 1) and the reduced
// shard (stage 2) carried their sums into the next window. The engine clears them at the
// window's first backward, as DeepSpeed's step does, and the step's gradients stay readable
// until then.
TEST(DeepSpeed, AnOptimizerZeroGradOverrideCallingTheOptimizerClearsTheEnginesGradients) {
  VOLT_REQUIRE_GLOO();
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    expect_zero_equals_one_process({stage, 2, "adam", 2}, {"--own-zero-grad", "1"});
  }
}

TEST(DeepSpeed, Stage1TwoRanksWithSgdMomentumEqualOneProcess) {
  VOLT_REQUIRE_GLOO();
  expect_zero_equals_one_process({1, 2, "sgd", 1});
}

TEST(DeepSpeed, Stage2TwoRanksWithAdamEqualOneProcess) {
  VOLT_REQUIRE_GLOO();
  expect_zero_equals_one_process({2, 2, "adam", 1});
}

TEST(DeepSpeed, Stage2FourRanksWithFusedAdamWAndSmallBucketsEqualOneProcess) {
  VOLT_REQUIRE_GLOO();
  // 64-element buckets: several reduce-scatters and all-gathers per step; 2-element biases give
  // ranks 2 and 3 empty chunks.
  expect_zero_equals_one_process({2, 4, "fused_adamw", 1}, {"--bucket", "64"});
}

TEST(DeepSpeed, Stage1FourRanksWithAdamWEqualOneProcess) {
  VOLT_REQUIRE_GLOO();
  expect_zero_equals_one_process({1, 4, "adamw", 1});
}

TEST(DeepSpeed, AccumulationStage1NoSyncAndStage2PerMicroBatchEqualOneProcess) {
  VOLT_REQUIRE_GLOO();
  expect_zero_equals_one_process({1, 2, "adam", 2});
  expect_zero_equals_one_process({2, 2, "adam", 2});
}

TEST(DeepSpeed, GradientClippingByNormSpansEveryRanksChunks) {
  VOLT_REQUIRE_GLOO();
  // A norm of 0.05 clips every step: a per-rank norm would clip differently.
  expect_zero_equals_one_process({2, 2, "sgd", 1}, {"--clip", "0.05"});
}

TEST(DeepSpeed, Stage3TwoRanksWithAdamEqualOneProcess) {
  VOLT_REQUIRE_GLOO();
  // Every parameter partitioned (persistence threshold 0): gathered per module when read.
  expect_zero_equals_one_process({3, 2, "adam", 1});
}

TEST(DeepSpeed, Stage3FourRanksWithALiveBoundAndAccumulationEqualOneProcess) {
  VOLT_REQUIRE_GLOO();
  // At most 16 gathered elements: every layer evicts the previous one and backward regathers.
  expect_zero_equals_one_process({3, 4, "fused_adamw", 2}, {"--max-live", "16", "--bucket", "64"});
}

TEST(DeepSpeed, Bf16MixedWithoutMasterWeightsEqualsDdpWithBf16Mixed) {
  VOLT_REQUIRE_GLOO();
  // master_weights off, bf16-mixed autocasts over fp32 weights as without ZeRO: with the same
  // per-rank micro-batches, ZeRO's reduce-scattered fp32 gradients and chunked Adam step must
  // give DDP's weights (fp32 round-off), while differing from an fp32 run by bf16 round-off.
  volt_test::TempDir dir;
  const std::vector<std::string> common{"--devices",   "2",    "--batch",    "8", "--epochs", "1",
                                        "--optimizer", "adam", "--bf16-all", "1"};
  auto ddp = run_job(cat({"--root", dir.path, "--out", dir / "ddp"}, common));
  ASSERT_EQ(ddp.code, 0) << ddp.output;
  const auto ref = load_flat(dir / "ddp.rank0.pt");
  auto fp32 = run_job({"--root", dir.path, "--out", dir / "fp32", "--devices", "2", "--batch", "8",
                       "--epochs", "1", "--optimizer", "adam", "--zero", "2"});
  ASSERT_EQ(fp32.code, 0) << fp32.output;
  const double bf16_vs_fp32 = (load_flat(dir / "fp32.rank0.pt") - ref).abs().max().item<double>();
  EXPECT_GT(bf16_vs_fp32, 1e-5) << "the bf16 runs must really differ from fp32";
  for (const char* stage : {"2", "3"}) {
    const std::string out = dir / (std::string("zero") + stage);
    auto job = run_job(
        cat({"--root", dir.path, "--out", out, "--zero", stage, "--master-weights", "0"}, common));
    ASSERT_EQ(job.code, 0) << job.output;
    expect_ranks_equal_reference(out, 2, ref, 1e-5, 1e-6);
    std::printf("[ measured ] bf16-mixed stage %s vs DDP: max diff %.2e (bf16 vs fp32 %.2e)\n",
                stage, (load_flat(out + ".rank0.pt") - ref).abs().max().item<double>(),
                bf16_vs_fp32);
  }
}

// Ranks that name different paths for one save (a name made from metrics each computed itself)
// save into global rank 0's, as Lightning's DeepSpeedStrategy broadcasts the file path: the
// folder under rank 0's name holds every rank's shard. Each rank wrote into its own path's
// staging folder (the CheckpointIO made it), and rank 0 swapped in a folder whose metadata said
// world_size 2 with rank 1's shard missing; rank 1's `.partial` folder stayed behind.
TEST(DeepSpeed, RanksNamingDifferentPathsSaveIntoRankZerosFolder) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  auto job =
      run_job({"--root", dir.path, "--out", dir / "w", "--devices", "2", "--batch", "8", "--epochs",
               "1", "--optimizer", "adam", "--zero", "2", "--ckpt-every-batch", "2"});
  ASSERT_EQ(job.code, 0) << job.output;
  const std::string folder = dir / "every_batch_rank0.ckpt";
  EXPECT_TRUE(volt::is_zero_checkpoint(folder));
  namespace fs = std::filesystem;
  EXPECT_TRUE(fs::exists(folder + "/rank_0_of_2.ckpt"));
  EXPECT_TRUE(fs::exists(folder + "/rank_1_of_2.ckpt"));
  EXPECT_FALSE(fs::exists(dir / "every_batch_rank1.ckpt"));
  EXPECT_FALSE(fs::exists(dir / "every_batch_rank1.ckpt.partial"));
  EXPECT_FALSE(fs::exists(folder + ".partial"));
}

TEST(DeepSpeed, LossScalingSkipsTheSameStepOnEveryRankAsDdpDoes) {
  VOLT_REQUIRE_GLOO();
  // Dynamic loss scaling with ZeRO (what "16-mixed" needs; bf16 autocast here, since this CPU
  // libtorch has no fp16 autocast). At the third step one element of b2 gets a NaN gradient,
  // and after the reduce-scatter only rank 1 holds it: each rank checks only its own chunks, so
  // the ranks must agree to skip. Had rank 0 stepped and gathered alone, the collectives would
  // pair wrongly. Every stage must skip that one step as DDP does and end with its weights.
  volt_test::TempDir dir;
  const std::vector<std::string> common{
      "--devices",  "2", "--batch",      "8",    "--epochs",      "1", "--optimizer",      "adam",
      "--bf16-all", "1", "--loss-scale", "1024", "--nan-grad-at", "2", "--master-weights", "0"};
  auto ddp = run_job(cat({"--root", dir.path, "--out", dir / "ddp"}, common));
  ASSERT_EQ(ddp.code, 0) << ddp.output;
  // 128 samples, 16 per step: 8 batches, one step skipped.
  EXPECT_NE(ddp.output.find("rank 0 done step=7 "), std::string::npos) << ddp.output;
  const auto ref = load_flat(dir / "ddp.rank0.pt");
  for (const char* stage : {"1", "2", "3"}) {
    SCOPED_TRACE(std::string("stage ") + stage);
    const std::string out = dir / (std::string("zero") + stage);
    auto job = run_job(cat({"--root", dir.path, "--out", out, "--zero", stage}, common));
    ASSERT_EQ(job.code, 0) << job.output;
    for (const char* rank : {"rank 0 done step=7 ", "rank 1 done step=7 "}) {
      EXPECT_NE(job.output.find(rank), std::string::npos) << job.output;
    }
    expect_ranks_equal_reference(out, 2, ref, 1e-5, 1e-6);
  }
}

TEST(DeepSpeed, LossScalingWithNvmeOffloadIsNotAvailable) {
  VOLT_REQUIRE_GLOO();
  // The NVMe paths step sub-group by sub-group, and the scaler updates once per step call.
  volt_test::TempDir dir;
  auto job = run_job({"--root", dir.path, "--out", dir / "x", "--devices", "2", "--zero", "2",
                      "--optimizer", "adam", "--bf16-all", "1", "--loss-scale", "1024", "--nvme",
                      dir.path});
  EXPECT_EQ(job.code, 1) << job.output;
  EXPECT_NE(job.output.find("scales the loss (dynamic loss scaling), which is not built with NVMe"),
            std::string::npos)
      << job.output;
}

TEST(DeepSpeed, Fp8PrecisionWithZeroEqualsDdpWithFp8) {
  VOLT_REQUIRE_GLOO();
  // precision "fp8" swaps the Linear layers for Fp8Linear (E4M3 operands, E5M2 gradients) and
  // keeps fp32 weights, so ZeRO partitions them like any fp32 parameters: stages 2 and 3 must
  // give DDP-with-fp8's weights (fp32 round-off), which differ from fp32 training. The two deep
  // 16x16 layers are the ones fp8 takes (fc1's 8 inputs are not a multiple of 16).
  volt_test::TempDir dir;
  const std::vector<std::string> model{"--devices",   "2",    "--batch", "8",  "--epochs", "1",
                                       "--optimizer", "adam", "--width", "16", "--depth",  "2"};
  const std::vector<std::string> common = cat(model, {"--precision", "fp8"});
  auto ddp = run_job(cat({"--root", dir.path, "--out", dir / "ddp"}, common));
  ASSERT_EQ(ddp.code, 0) << ddp.output;
  EXPECT_NE(ddp.output.find("2 Linear layers in fp8"), std::string::npos) << ddp.output;
  const auto ref = load_flat(dir / "ddp.rank0.pt");
  // Each rank read its own shard, yet both hold the same amax histories (their max, agreed after
  // every backward), so both quantize with the same scales.
  const auto amax = load_flat(dir / "ddp.amax.rank0.pt");
  EXPECT_GT(amax.abs().max().item<double>(), 0);
  EXPECT_TRUE(torch::equal(load_flat(dir / "ddp.amax.rank1.pt"), amax));
  auto fp32 = run_job(cat({"--root", dir.path, "--out", dir / "fp32"}, model));
  ASSERT_EQ(fp32.code, 0) << fp32.output;
  const double fp8_vs_fp32 = (load_flat(dir / "fp32.rank0.pt") - ref).abs().max().item<double>();
  EXPECT_GT(fp8_vs_fp32, 1e-4) << "the fp8 runs must really differ from fp32";
  for (const char* stage : {"2", "3"}) {
    const std::string out = dir / (std::string("zero") + stage);
    auto job = run_job(cat({"--root", dir.path, "--out", out, "--zero", stage}, common));
    ASSERT_EQ(job.code, 0) << job.output;
    expect_ranks_equal_reference(out, 2, ref);
    std::printf("[ measured ] fp8 stage %s vs DDP: max diff %.2e (fp8 vs fp32 %.2e)\n", stage,
                (load_flat(out + ".rank0.pt") - ref).abs().max().item<double>(), fp8_vs_fp32);
  }
}

TEST(DeepSpeed, AnFp32ShardFolderResumesInFp8WithTheScalingStartingFresh) {
  VOLT_REQUIRE_GLOO();
  // Fine-tuning in fp8 from a checkpoint trained without it: the folder holds no fp8 scaling
  // state, which the converted layers start fresh (before: "missing '...fp8_amax_history'").
  volt_test::TempDir dir;
  const std::vector<std::string> model{"--devices",         "2",    "--batch", "8",  "--zero",  "3",
                                       "--optimizer",       "adam", "--width", "16", "--depth", "2",
                                       "--ckpt-every-step", "1"};
  auto fp32 = run_job(cat({"--root", dir / "a", "--out", dir / "a/w", "--epochs", "1"}, model));
  ASSERT_EQ(fp32.code, 0) << fp32.output;
  const std::string ckpt = dir / "a/ckpt/last.ckpt";
  ASSERT_TRUE(volt::is_zero_checkpoint(ckpt)) << fp32.output;
  auto fp8 = run_job(cat({"--root", dir / "b", "--out", dir / "b/w", "--epochs", "2", "--resume",
                          ckpt, "--precision", "fp8"},
                         model));
  ASSERT_EQ(fp8.code, 0) << fp8.output;
  EXPECT_NE(fp8.output.find("2 Linear layers in fp8"), std::string::npos) << fp8.output;
  EXPECT_NE(fp8.output.find("the model's fp8 layers start theirs fresh (8 buffers)"),
            std::string::npos)
      << fp8.output;
}

TEST(DeepSpeed, Bf16TrueWithZeroKeepsBf16WeightsOnFp32Masters) {
  VOLT_REQUIRE_GLOO();
  // precision "bf16-true": the module is bf16 for the whole run (no autocast, no cast back).
  // With master weights (default) every stage steps fp32 masters of its chunks and rounds them
  // into the bf16 weights: stages 1-3 do the same arithmetic, so their bf16 weights are bitwise
  // equal, and nearer fp32 training than DDP's pure-bf16 Adam (whose updates round away).
  // Without masters ZeRO is DDP's bf16-true: both reduce the bf16 gradients in fp32 (DDP
  // through volt's comm hook), so the weights are bitwise equal.
  volt_test::TempDir dir;
  const std::vector<std::string> common{"--devices",   "2",        "--batch",     "8",
                                        "--epochs",    "1",        "--optimizer", "adam",
                                        "--precision", "bf16-true"};
  auto fp32 = run_job({"--root", dir.path, "--out", dir / "fp32", "--devices", "2", "--batch", "8",
                       "--epochs", "1", "--optimizer", "adam"});
  ASSERT_EQ(fp32.code, 0) << fp32.output;
  const at::Tensor full = load_flat(dir / "fp32.rank0.pt");
  auto ddp = run_job(cat({"--root", dir.path, "--out", dir / "ddp"}, common));
  ASSERT_EQ(ddp.code, 0) << ddp.output;
  const at::Tensor ddp_w = load_flat(dir / "ddp.rank0.pt");
  ASSERT_EQ(ddp_w.scalar_type(), torch::kBFloat16) << "bf16-true keeps the module bf16";
  const double ddp_vs_fp32 = (ddp_w.to(torch::kFloat) - full).abs().max().item<double>();
  at::Tensor first;
  for (const char* stage : {"1", "2", "3"}) {
    const std::string out = dir / (std::string("m") + stage);
    auto job = run_job(cat({"--root", dir.path, "--out", out, "--zero", stage}, common));
    ASSERT_EQ(job.code, 0) << job.output;
    const at::Tensor w = load_flat(out + ".rank0.pt");
    EXPECT_EQ(w.scalar_type(), torch::kBFloat16) << "stage " << stage;
    EXPECT_TRUE(torch::equal(w, load_flat(out + ".rank1.pt"))) << "stage " << stage;
    if (!first.defined()) {
      first = w;
    } else {
      EXPECT_TRUE(torch::equal(w, first)) << "stage " << stage << " differs from stage 1";
    }
    const double vs_fp32 = (w.to(torch::kFloat) - full).abs().max().item<double>();
    EXPECT_GT(vs_fp32, 1e-6) << "the bf16 run must really differ from fp32";
    EXPECT_LE(vs_fp32, ddp_vs_fp32) << "stage " << stage << ": masters must not be worse";
    std::printf(
        "[ measured ] bf16-true stage %s with masters vs fp32: max diff %.2e (DDP bf16-true "
        "%.2e)\n",
        stage, vs_fp32, ddp_vs_fp32);
  }
  for (const char* stage : {"2", "3"}) {
    const std::string out = dir / (std::string("plain") + stage);
    auto job = run_job(
        cat({"--root", dir.path, "--out", out, "--zero", stage, "--master-weights", "0"}, common));
    ASSERT_EQ(job.code, 0) << job.output;
    const at::Tensor w = load_flat(out + ".rank0.pt");
    EXPECT_EQ(w.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(w, load_flat(out + ".rank1.pt"))) << "stage " << stage;
    const double vs_ddp =
        (w.to(torch::kFloat) - ddp_w.to(torch::kFloat)).abs().max().item<double>();
    EXPECT_EQ(vs_ddp, 0) << "stage " << stage;  // the same fp32 sums of bf16 gradients
    std::printf("[ measured ] bf16-true stage %s without masters vs DDP bf16-true: max diff %.2e\n",
                stage, vs_ddp);
  }
}

TEST(DeepSpeed, TiedWeightsArePartitionedOnceAndStayTied) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto ref = single_process_reference(dir.path, 16, 1, 1, true, {"--optimizer", "adam"});
  for (const char* stage : {"2", "3"}) {
    auto job = run_job({"--root", dir.path, "--out", dir / "zero", "--devices", "2", "--batch", "8",
                        "--epochs", "1", "--tied", "1", "--zero", stage, "--optimizer", "adam"});
    ASSERT_EQ(job.code, 0) << job.output;
    EXPECT_EQ(job.output.find("tied=0"), std::string::npos) << job.output;
    expect_ranks_equal_reference(dir / "zero", 2, ref);
  }
}

TEST(DeepSpeed, UnusedParametersCountAsZeroGradientsOrStopTheRunWhenNotIgnored) {
  VOLT_REQUIRE_GLOO();
  // A layer the forward never uses ("spare", after fc1, w2, b2 and head: 162 used elements, then
  // 72 unused). DeepSpeed's default (ignore_unused_parameters=true): its gradient counts as
  // zero, so SGD without weight decay leaves it alone and every stage equals one process, while
  // Adam's L2 weight decay still steps it (one process leaves an unused parameter's gradient
  // undefined and skips it), as DeepSpeed's flat partitions do. ignore_unused_parameters=false
  // (the JSON key): every rank stops with an error naming the parameters, none hangs.
  volt_test::TempDir dir;
  const int64_t used = 8 * 8 + 8 + 8 * 8 + 8 + 2 * 8 + 2, unused = 8 * 8 + 8;
  const auto sgd =
      single_process_reference(dir.path, 16, 1, 1, false, {"--optimizer", "sgd", "--unused", "1"});
  const auto adam =
      single_process_reference(dir.path, 16, 1, 1, false, {"--optimizer", "adam", "--unused", "1"});
  ASSERT_EQ(sgd.numel(), used + unused);
  for (const char* stage : {"1", "2", "3"}) {
    SCOPED_TRACE(std::string("stage ") + stage);
    for (const char* optimizer : {"sgd", "adam"}) {
      auto job =
          run_job({"--root", dir.path, "--out", dir / "zero", "--devices", "2", "--batch", "8",
                   "--epochs", "1", "--unused", "1", "--zero", stage, "--optimizer", optimizer});
      ASSERT_EQ(job.code, 0) << job.output;
      if (optimizer[0] == 's') {
        expect_ranks_equal_reference(dir / "zero", 2, sgd);
        continue;
      }
      const auto w = load_flat(dir / "zero.rank0.pt");
      EXPECT_TRUE(torch::allclose(w.narrow(0, 0, used), adam.narrow(0, 0, used), 1e-5, 1e-6));
      const auto spare = w.narrow(0, used, unused), ref_spare = adam.narrow(0, used, unused);
      EXPECT_FALSE(torch::equal(spare, ref_spare)) << "weight decay did not step 'spare'";
      // The gradient is all weight decay (0.01 p), so Adam's normalised update moves an element
      // toward zero by about lr (0.01) per step, 8 steps; checked where it cannot cross zero.
      const auto far = ref_spare.abs() > 0.1;
      ASSERT_GT(far.sum().item<int64_t>(), 10);
      const auto moved = (ref_spare - spare).abs().masked_select(far);
      EXPECT_TRUE(
          (spare.abs().masked_select(far) < ref_spare.abs().masked_select(far)).all().item<bool>());
      EXPECT_GE(moved.min().item<double>(), 0.07);
      EXPECT_LE(moved.max().item<double>(), 0.0801);
    }
  }
  // Not ignored: both ranks raise after the reductions of the first backward.
  auto strict = [&](const std::string& out, std::vector<std::string> more) {
    return run_job(
        cat({"--root", dir.path, "--out", dir / out, "--devices", "2", "--batch", "8", "--epochs",
             "1", "--unused", "1", "--optimizer", "sgd", "--timeout", "20", "--ds-config",
             R"({"zero_optimization": {"stage": 2, "ignore_unused_parameters": false}})"},
            std::move(more)));
  };
  const auto start = std::chrono::steady_clock::now();
  auto job = strict("strict", {});
  EXPECT_EQ(job.code, 1) << job.output;
  EXPECT_NE(job.output.find("[ZeroEngine] rank 0: parameters 'spare.weight', 'spare.bias' got no "
                            "gradient in this backward"),
            std::string::npos)
      << job.output;
  EXPECT_NE(job.output.find("set ignore_unused_parameters=true"), std::string::npos) << job.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s) << "a rank waited for the other";
  // Unused on one rank only (rank 1's forward uses the spare layer): rank 1 stops with rank 0,
  // told why, instead of going on into collectives rank 0 never joins (before: a lost-peer
  // DistributedError there, which hid the cause).
  const auto one_sided = std::chrono::steady_clock::now();
  job = strict("one_sided", {"--spare-on-rank", "1"});
  EXPECT_EQ(job.code, 1) << job.output;
  EXPECT_NE(job.output.find("[ZeroEngine] rank 0: parameters 'spare.weight', 'spare.bias' got no "
                            "gradient in this backward"),
            std::string::npos)
      << job.output;
  EXPECT_NE(job.output.find("[ZeroEngine] rank 1: another rank's forward left parameters without "
                            "a gradient"),
            std::string::npos)
      << job.output;
  EXPECT_EQ(job.output.find("[ProcessGroup]"), std::string::npos) << job.output;  // no lost peer
  EXPECT_LT(std::chrono::steady_clock::now() - one_sided, 60s) << "a rank waited for the other";
}

// ------------------------------------------------------------------------------ memory

struct Comm {
  int64_t reductions = -1, overlapped = -1, gathers = -1, prefetched = -1, discarded = -1;
};

Comm comm_of(const std::string& output, int rank) {
  std::smatch m;
  const std::regex re("rank " + std::to_string(rank) +
                      " done .* zero_comm reductions=(\\d+) overlapped=(\\d+) gathers=(\\d+) "
                      "prefetched=(\\d+) discarded=(\\d+)");
  EXPECT_TRUE(std::regex_search(output, m, re)) << output;
  if (m.size() < 6) return {};
  return {std::stoll(m[1]), std::stoll(m[2]), std::stoll(m[3]), std::stoll(m[4]), std::stoll(m[5])};
}

TEST(DeepSpeed, OverlappedReductionsAndStage3PrefetchChangeNoBit) {
  VOLT_REQUIRE_GLOO();
  // overlap_comm starts each full gradient bucket's reduction and lets backward go on (two in
  // flight); stage 3's prefetch gathers the modules the learned order says come next. Neither
  // changes what is computed: with small buckets (many reductions) and a deeper model (several
  // gather units), 2 ranks give bitwise the weights of the blocking run in every stage, and the
  // counters show the overlap and the prefetches happened.
  volt_test::TempDir dir;
  const std::vector<std::string> common{"--devices",   "2",    "--batch", "8", "--epochs", "1",
                                        "--optimizer", "adam", "--depth", "3", "--bucket", "40"};
  for (const char* stage : {"1", "2", "3"}) {
    const std::string blocking = dir / (std::string("blocking") + stage);
    const std::string overlapped = dir / (std::string("overlapped") + stage);
    auto off = run_job(cat({"--root", dir.path, "--out", blocking, "--zero", stage, "--overlap",
                            "0", "--prefetch", "0"},
                           common));
    ASSERT_EQ(off.code, 0) << off.output;
    auto on = run_job(cat({"--root", dir.path, "--out", overlapped, "--zero", stage}, common));
    ASSERT_EQ(on.code, 0) << on.output;
    for (int r = 0; r < 2; ++r) {
      const std::string suffix = ".rank" + std::to_string(r) + ".pt";
      EXPECT_TRUE(torch::equal(load_flat(blocking + suffix), load_flat(overlapped + suffix)))
          << "stage " << stage << " rank " << r;
    }
    const Comm a = comm_of(off.output, 0), b = comm_of(on.output, 0);
    EXPECT_GT(a.reductions, 8) << "small buckets: many reductions";
    EXPECT_EQ(a.reductions, b.reductions) << "stage " << stage;
    EXPECT_EQ(a.overlapped, 0) << "stage " << stage;
    EXPECT_GT(b.overlapped, b.reductions / 2) << "stage " << stage;
    EXPECT_EQ(a.gathers, b.gathers) << "stage " << stage;
    EXPECT_EQ(a.prefetched, 0);
    if (stage[0] == '3') {
      EXPECT_GT(b.prefetched, b.gathers / 2) << "stage 3 prefetches after the first step";
    } else {
      EXPECT_EQ(b.gathers, 0) << "stages 1 and 2 keep whole parameters";
    }
    std::printf(
        "[ measured ] stage %s: %lld reductions, %lld overlapped; %lld gathers, %lld "
        "prefetched, %lld prefetches dropped\n",
        stage, static_cast<long long>(b.reductions), static_cast<long long>(b.overlapped),
        static_cast<long long>(b.gathers), static_cast<long long>(b.prefetched),
        static_cast<long long>(b.discarded));
  }
}

TEST(DeepSpeed, PerRankBytesFollowThePapersFormulasForAdam) {
  VOLT_REQUIRE_GLOO();
  // Psi ~ 69k parameters (width 256), fp32 Adam, N = 2 and 4: ZeRO's per-rank bytes are
  // stage 1: 4Psi weights + 4Psi gradients + 8Psi/N state; stage 2: 4Psi + 4Psi/N + 8Psi/N;
  // stage 3: 4Psi/N + 4Psi/N + 8Psi/N (measured at the end of training, parameters released).
  for (int stage : {1, 2, 3}) {
    for (int n : {2, 4}) {
      volt_test::TempDir dir;
      auto job = run_job({"--root", dir.path, "--out", dir / "zero", "--devices", std::to_string(n),
                          "--batch", "4", "--epochs", "1", "--samples", "32", "--width", "256",
                          "--zero", std::to_string(stage), "--optimizer", "adam"});
      ASSERT_EQ(job.code, 0) << job.output;
      for (int r = 0; r < n; ++r) {
        const Memory m = memory_of(job.output, r);
        const double psi = m.numel;
        const double grads = stage == 1 ? 4 * psi : 4 * psi / n;
        const double params = stage == 3 ? 4 * psi / n : 4 * psi;
        EXPECT_NEAR(m.params, params, 0.05 * params) << "stage " << stage << " N " << n;
        EXPECT_NEAR(m.grads, grads, 0.05 * grads) << "stage " << stage << " N " << n;
        EXPECT_NEAR(m.state, 8 * psi / n, 0.05 * 8 * psi / n) << "stage " << stage << " N " << n;
        EXPECT_EQ(m.master, 0) << "fp32 parameters need no master copy";
        const double total = m.params + m.grads + m.state;
        const double formula = stage == 1   ? 8 * psi + 8 * psi / n
                               : stage == 2 ? 4 * psi + 12 * psi / n
                                            : 16 * psi / n;
        EXPECT_NEAR(total, formula, 0.05 * formula);
        if (r == 0) {
          std::printf(
              "[ measured ] stage %d N=%d rank 0: %.0f bytes (formula %.0f, DDP 16Psi "
              "%.0f)\n",
              stage, n, total, formula, 16 * psi);
        }
      }
    }
  }
}

TEST(DeepSpeed, Bf16MasterWeightsGiveOneResultInEveryStageAndTrackFp32) {
  VOLT_REQUIRE_GLOO();
  // bf16-mixed with master weights (the default, DeepSpeed's BF16Optimizer): the module trains
  // in bf16 and each rank's fp32 master chunks are stepped. Stages 1, 2 and 3 do the same
  // arithmetic (bf16 gradients summed in fp32, fp32 Adam on the masters, bf16 rounding), so
  // their weights are bitwise equal; at the end the module gets the fp32 masters, which stay
  // near fp32 training (bf16 forward/backward error only).
  volt_test::TempDir dir;
  const auto fp32 = single_process_reference(dir.path, 16, 1, 1, false, {"--optimizer", "adam"});
  const std::vector<std::string> common{"--devices",   "2",    "--batch",    "8", "--epochs", "1",
                                        "--optimizer", "adam", "--bf16-all", "1"};
  at::Tensor first;
  for (const char* stage : {"1", "2", "3"}) {
    const std::string out = dir / (std::string("m") + stage);
    auto job = run_job(cat({"--root", dir.path, "--out", out, "--zero", stage}, common));
    ASSERT_EQ(job.code, 0) << job.output;
    const Memory m = memory_of(job.output, 0);
    EXPECT_NEAR(m.master, 4 * m.numel / 2, 0.05 * 4 * m.numel / 2) << "stage " << stage;
    const at::Tensor w = load_flat(out + ".rank0.pt");
    EXPECT_EQ(w.scalar_type(), torch::kFloat) << "the module goes back to fp32";
    EXPECT_TRUE(torch::equal(w, load_flat(out + ".rank1.pt"))) << "stage " << stage;
    if (!first.defined()) {
      first = w;
    } else {
      EXPECT_TRUE(torch::equal(w, first)) << "stage " << stage << " differs from stage 1 by "
                                          << (w - first).abs().max().item<double>();
    }
    const double vs_fp32 = (w - fp32).abs().max().item<double>();
    EXPECT_GT(vs_fp32, 1e-6) << "the bf16 run must really differ from fp32";
    EXPECT_LT(vs_fp32, 2e-2) << "stage " << stage;
    // The masters are not bf16 values: the module holds more than bf16 roundings.
    EXPECT_FALSE(torch::equal(w, w.to(torch::kBFloat16).to(torch::kFloat))) << "stage " << stage;
    std::printf("[ measured ] bf16 master weights stage %s vs fp32 one process: max diff %.2e\n",
                stage, vs_fp32);
  }
}

TEST(DeepSpeed, PerRankBytesFollowThePapersBf16MixedFormulas) {
  VOLT_REQUIRE_GLOO();
  // bf16-mixed with master weights, Adam, N = 2 and 4: bf16 weights and gradients, fp32 masters
  // and moments: stage 1: 2Psi + 2Psi + 12Psi/N; stage 2: 2Psi + 14Psi/N; stage 3: 16Psi/N.
  for (int stage : {1, 2, 3}) {
    for (int n : {2, 4}) {
      volt_test::TempDir dir;
      auto job = run_job({"--root",      dir.path,
                          "--out",       dir / "zero",
                          "--devices",   std::to_string(n),
                          "--batch",     "4",
                          "--epochs",    "1",
                          "--samples",   "32",
                          "--width",     "256",
                          "--zero",      std::to_string(stage),
                          "--optimizer", "adam",
                          "--bf16-all",  "1"});
      ASSERT_EQ(job.code, 0) << job.output;
      for (int r = 0; r < n; ++r) {
        const Memory m = memory_of(job.output, r);
        const double psi = m.numel;
        const double params = stage == 3 ? 2 * psi / n : 2 * psi;
        const double grads = stage == 1 ? 2 * psi : 2 * psi / n;
        EXPECT_NEAR(m.params, params, 0.05 * params) << "stage " << stage << " N " << n;
        EXPECT_NEAR(m.grads, grads, 0.05 * grads) << "stage " << stage << " N " << n;
        EXPECT_NEAR(m.state, 8 * psi / n, 0.05 * 8 * psi / n) << "stage " << stage << " N " << n;
        EXPECT_NEAR(m.master, 4 * psi / n, 0.05 * 4 * psi / n) << "stage " << stage << " N " << n;
        const double total = m.params + m.grads + m.state + m.master;
        const double formula = stage == 1   ? 4 * psi + 12 * psi / n
                               : stage == 2 ? 2 * psi + 14 * psi / n
                                            : 16 * psi / n;
        EXPECT_NEAR(total, formula, 0.05 * formula);
        if (r == 0) {
          std::printf("[ measured ] bf16-mixed stage %d N=%d rank 0: %.0f bytes (formula %.0f)\n",
                      stage, n, total, formula);
        }
      }
    }
  }
}

TEST(DeepSpeed, AModelWhoseAdamStateBreaksAMemoryBudgetTrainsWithStage3) {
  VOLT_REQUIRE_GLOO();
  // MLP of 9 hidden 768-wide layers: Psi = 5.33 M parameters, 21 MB of fp32 weights. The
  // budget: what fit() may add to a rank's tensor memory = the size of fp32 Adam state (8 Psi
  // bytes), measured exactly by volt's counting CPU allocator (peak bytes held by tensors; RSS
  // is printed too, but glibc keeps freed heap pages). Plain DDP adds gradients and Adam state
  // (12 Psi, plus its buckets): over budget. Stage 3 on 4 ranks holds 16 Psi / 4 = 4 Psi,
  // gives back the whole weights it started with and gathers one layer at a time (reduce and
  // gather buckets of one layer); at the end it makes the module whole again: within budget.
  const std::vector<std::string> common{
      "--devices",   "4",    "--batch",    "4",      "--epochs", "1",
      "--samples",   "64",   "--width",    "768",    "--depth",  "8",
      "--optimizer", "adam", "--max-live", "700000", "--bucket", "700000"};
  struct Growth {
    double tensors = 0, rss = 0;
  };
  auto growth = [](const std::string& output, int rank) {
    std::smatch m;
    const std::regex re("rank " + std::to_string(rank) +
                        " done .* rss_before_kib=(\\d+) rss_peak_kib=(\\d+) "
                        "tensors_before=(\\d+) tensors_peak=(\\d+)");
    EXPECT_TRUE(std::regex_search(output, m, re)) << output;
    if (m.size() < 5) return Growth{};
    return Growth{std::stod(m[4]) - std::stod(m[3]), 1024 * (std::stod(m[2]) - std::stod(m[1]))};
  };
  const double psi = 8 * 768 + 768 + 9 * (768 * 768 + 768) + 768 * 2 + 2;
  const double budget = 8 * psi;
  volt_test::TempDir dir;
  auto ddp = run_job(cat({"--root", dir / "ddp", "--out", dir / "ddp/w"}, common));
  ASSERT_EQ(ddp.code, 0) << ddp.output;
  auto zero = run_job(cat({"--root", dir / "z", "--out", dir / "z/w", "--zero", "3"}, common));
  ASSERT_EQ(zero.code, 0) << zero.output;
  for (int r = 0; r < 4; ++r) {
    const Growth d = growth(ddp.output, r), z = growth(zero.output, r);
    EXPECT_GT(d.tensors, budget) << "rank " << r << ": DDP stayed within the budget";
    EXPECT_LT(z.tensors, budget) << "rank " << r << ": stage 3 broke the budget";
    if (r == 0) {
      std::printf(
          "[ measured ] rank 0, growth of fit()'s peak: tensors DDP %.1f MB, ZeRO-3 %.1f "
          "MB (budget %.1f MB = fp32 Adam state); RSS DDP %.1f MB, ZeRO-3 %.1f MB\n",
          d.tensors / 1e6, z.tensors / 1e6, budget / 1e6, d.rss / 1e6, z.rss / 1e6);
    }
  }
}

// ------------------------------------------------------------------------------ checkpoints

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// `resume_extra`: flags only the resumed run gets (a later flag wins in the worker).
void expect_killed_run_resumes_bit_identically(const std::string& stage,
                                               const std::vector<std::string>& extra = {},
                                               const std::vector<std::string>& resume_extra = {}) {
  volt_test::TempDir dir;
  // Mid-epoch, mid-accumulation (3 micro-batches), dropout: each rank's generator and its
  // accumulated gradient chunks are part of the state (stage 3: its parameter chunks too).
  std::vector<std::string> common{
      "--devices", "2", "--batch", "8",   "--epochs",    "2",    "--dropout",          "1",
      "--accum",   "3", "--zero",  stage, "--optimizer", "adam", "--ckpt-every-batch", "1"};
  common.insert(common.end(), extra.begin(), extra.end());
  volt_test::run_full_then_killed(dir.path, common);
  if (::testing::Test::HasFatalFailure()) return;
  const std::string ckpt = dir / "b/every_batch.ckpt";
  ASSERT_TRUE(is_dir(ckpt)) << "a ZeRO checkpoint is a folder of shards";
  EXPECT_TRUE(volt::is_zero_checkpoint(ckpt));
  std::ifstream shard0(ckpt + "/rank_0_of_2.ckpt"), shard1(ckpt + "/rank_1_of_2.ckpt");
  EXPECT_TRUE(shard0.good() && shard1.good());
  auto resumed = run_job(cat(
      cat({"--root", dir / "b", "--out", dir / "b/w", "--resume", ckpt}, common), resume_extra));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  for (int r = 0; r < 2; ++r) {
    const std::string suffix = ".rank" + std::to_string(r) + ".pt";
    EXPECT_TRUE(torch::equal(load_flat(dir / ("a/w" + suffix)), load_flat(dir / ("b/w" + suffix))))
        << "stage " << stage << " rank " << r;
  }
}

TEST(DeepSpeed, AKilledTwoRankRunResumesBitIdenticallyFromItsShardFolder) {
  VOLT_REQUIRE_GLOO();
  expect_killed_run_resumes_bit_identically("2");
}

TEST(DeepSpeed, AKilledStage3RunResumesBitIdenticallyFromItsParameterChunks) {
  VOLT_REQUIRE_GLOO();
  expect_killed_run_resumes_bit_identically("3");
}

// A raised param_persistence_threshold keeps weights whole that the folder holds as chunks
// (Net's biases and head: 20 elements or fewer): each rank's shard no longer fits, so the folder
// is read consolidated (before session 81: "the checkpoint does not match the model: shape of
// 'b2'"). Persistence changes no arithmetic: the resumed run is still bit-identical.
TEST(DeepSpeed, AStage3FolderResumesUnderARaisedPersistenceThreshold) {
  VOLT_REQUIRE_GLOO();
  expect_killed_run_resumes_bit_identically("3", {}, {"--persist", "20"});
}

// The other way with bf16 master weights: weights the folder holds whole (persistence 20) are
// partitioned after the resume (persistence 0); their masters take this rank's part of the whole
// tensor, as the weights do (a raw size error before session 98).
TEST(DeepSpeed, ABf16Stage3FolderResumesUnderALoweredPersistenceThreshold) {
  VOLT_REQUIRE_GLOO();
  expect_killed_run_resumes_bit_identically("3", {"--bf16-all", "1", "--persist", "20"},
                                            {"--persist", "0"});
}

TEST(DeepSpeed, AKilledBf16RunResumesBitIdenticallyWithItsMasterWeights) {
  VOLT_REQUIRE_GLOO();
  // The fp32 masters are part of each shard's optimizer state: without them a resumed run would
  // restart from the bf16 weights and drift.
  expect_killed_run_resumes_bit_identically("2", {"--bf16-all", "1"});
  expect_killed_run_resumes_bit_identically("3", {"--bf16-all", "1"});
  // An optimizer that keeps no state of its own (SGD without momentum): the masters were saved
  // inside each parameter's optimizer state, so none was (DeepSpeed saves them apart).
  expect_killed_run_resumes_bit_identically("2", {"--bf16-all", "1", "--optimizer", "plain_sgd"});
}

// The parameter names and shapes of tests/support/ddp_worker.cpp's Net at its defaults (width 8,
// depth 0, no batch norm): fc1, w2, b2, head.
struct WorkerNetShape : torch::nn::Module {
  WorkerNetShape() {
    register_module("fc1", torch::nn::Linear(8, 8));
    register_parameter("w2", torch::zeros({8, 8}));
    register_parameter("b2", torch::zeros({8}));
    register_module("head", torch::nn::Linear(8, 2));
  }
};

TEST(DeepSpeed, ConsolidatingABf16FolderGivesTheFp32MasterWeights) {
  VOLT_REQUIRE_GLOO();
  // DeepSpeed's zero_to_fp32: the consolidated weights are the fp32 masters, which round to the
  // bf16 weights the run trained with, and equal the module the run ends with.
  volt_test::TempDir dir;
  for (const char* stage : {"2", "3"}) {
    const std::string root = dir / stage;
    auto job = run_job({"--root", root, "--out", root + "/w", "--devices", "2", "--batch", "8",
                        "--epochs", "1", "--optimizer", "adam", "--bf16-all", "1", "--zero", stage,
                        "--ckpt-every-step", "1"});
    ASSERT_EQ(job.code, 0) << job.output;
    const std::string ckpt = root + "/ckpt/last.ckpt";
    ASSERT_TRUE(volt::is_zero_checkpoint(ckpt)) << job.output;
    volt::consolidate_zero_checkpoint(ckpt, root + "/full.ckpt");
    torch::serialize::InputArchive full = volt::TorchCheckpointIO().load(root + "/full.ckpt");
    torch::serialize::InputArchive weights;
    full.read("state_dict", weights);
    std::vector<at::Tensor> flat;
    for (const auto& key : weights.keys()) {
      at::Tensor t;
      weights.read(key, t);
      EXPECT_EQ(t.scalar_type(), torch::kFloat) << key;
      flat.push_back(t.reshape({-1}));
    }
    const at::Tensor consolidated = torch::cat(flat);
    const at::Tensor final_weights = load_flat(root + "/w.rank0.pt");
    ASSERT_EQ(consolidated.numel(), final_weights.numel());
    EXPECT_TRUE(torch::equal(consolidated, final_weights))
        << "stage " << stage << ": max diff "
        << (consolidated - final_weights).abs().max().item<double>();
    // load_weights takes the folder itself (consolidated on the way) into a module of the
    // worker's parameter names: the fp32 masters too.
    WorkerNetShape shape;
    volt::load_weights(shape, ckpt);
    for (const auto& p : shape.named_parameters()) {
      at::Tensor t;
      weights.read(p.key(), t);
      EXPECT_TRUE(torch::equal(p.value(), t)) << "stage " << stage << " " << p.key();
    }
  }
}

// ------------------------------------------------------------------------------ ZeRO-Inference

struct Evaluated {
  double val_loss = -1, params = -1, in_files = -1, full = -1, pred_diff = -1, load_peak = -1;
  int batches = -1, released = -1;
};

Evaluated evaluated(const std::string& output, int rank) {
  std::smatch m;
  const std::regex re("rank " + std::to_string(rank) +
                      " evaluated val_loss=(\\S+) batches=(\\d+) infer_params=(-?\\d+) "
                      "infer_in_files=(-?\\d+) infer_full=(-?\\d+) released=(\\d) "
                      "pred_diff=(\\S+)");
  EXPECT_TRUE(std::regex_search(output, m, re)) << output;
  if (m.size() < 8) return {};
  Evaluated e;
  e.val_loss = std::stod(m[1]);
  e.batches = std::stoi(m[2]);
  e.params = std::stod(m[3]);
  e.in_files = std::stod(m[4]);
  e.full = std::stod(m[5]);
  e.released = std::stoi(m[6]);
  e.pred_diff = std::stod(m[7]);
  std::smatch peak;
  const std::regex peak_re("rank " + std::to_string(rank) + " evaluated .* load_peak=(-?\\d+)");
  if (std::regex_search(output, peak, peak_re)) e.load_peak = std::stod(peak[1]);
  return e;
}

// validate and predict under stage 3 (no optimizer: ZeRO-Inference) keep each rank's chunks of
// the weights and gather a layer's weights while it runs, as training does: the validation loss
// equals one process's from the same shard folder, each prediction equals what the whole module
// computes, each rank holds half the weights between steps, and the module leaves whole with the
// checkpoint's weights. At one rank the weights partition into NVMe files (in memory there
// would be nothing to save).
TEST(DeepSpeed, Stage3ValidatesAndPredictsWithEachRankHoldingItsChunksOfTheWeights) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  auto train = run_job({"--root", dir / "a", "--out", dir / "a/w", "--devices", "2", "--batch", "8",
                        "--epochs", "1", "--ckpt-every-step", "1", "--zero", "3", "--optimizer",
                        "adam", "--width", "32"});
  ASSERT_EQ(train.code, 0) << train.output;
  const std::string ckpt = dir / "a/ckpt/last.ckpt";
  ASSERT_TRUE(volt::is_zero_checkpoint(ckpt)) << train.output;
  const std::vector<std::string> eval{"--width", "32", "--sync-dist", "1", "--evaluate", ckpt};
  auto one = run_job(cat({"--root", dir / "c", "--out", dir / "c/w", "--devices", "1"}, eval));
  ASSERT_EQ(one.code, 0) << one.output;
  const Evaluated ref = evaluated(one.output, 0);
  EXPECT_EQ(ref.released, 0);  // no engine in one plain process
  auto zero = run_job(
      cat({"--root", dir / "b", "--out", dir / "b/w", "--devices", "2", "--zero", "3"}, eval));
  ASSERT_EQ(zero.code, 0) << zero.output;
  EXPECT_NE(zero.output.find("ZeRO-Inference"), std::string::npos) << zero.output;
  const auto want = load_flat(dir / "c/w.rank0.pt");
  for (int r = 0; r < 2; ++r) {
    const Evaluated e = evaluated(zero.output, r);
    EXPECT_NEAR(e.val_loss, ref.val_loss, 1e-6 * std::abs(ref.val_loss)) << "rank " << r;
    EXPECT_EQ(e.batches, 2) << "rank " << r;  // 64 samples, 16 a batch, half each
    EXPECT_EQ(e.released, 1) << "rank " << r;
    EXPECT_EQ(e.pred_diff, 0.0) << "rank " << r;
    // Each rank's chunks: half of every weight (six fp32 parameters, each rounded up by at
    // most one element).
    EXPECT_GE(2 * e.params, e.full) << "rank " << r;
    EXPECT_LE(2 * e.params, e.full + 6 * 4) << "rank " << r;
    EXPECT_TRUE(torch::equal(load_flat(dir / ("b/w.rank" + std::to_string(r) + ".pt")), want))
        << "rank " << r << ": the module did not leave whole with the checkpoint's weights";
  }
  // One rank, the chunks in files.
  std::filesystem::create_directories(dir / "nvme");
  auto nvme =
      run_job(cat({"--root", dir / "d", "--out", dir / "d/w", "--devices", "1", "--zero", "3",
                   "--nvme-params", "1", "--nvme-optimizer", "0", "--nvme", dir / "nvme"},
                  eval));
  ASSERT_EQ(nvme.code, 0) << nvme.output;
  const Evaluated e = evaluated(nvme.output, 0);
  EXPECT_NEAR(e.val_loss, ref.val_loss, 1e-6 * std::abs(ref.val_loss));
  EXPECT_EQ(e.released, 1);
  EXPECT_EQ(e.params, 0);
  EXPECT_EQ(e.in_files, e.full);
  EXPECT_EQ(e.pred_diff, 0.0);
  EXPECT_TRUE(torch::equal(load_flat(dir / "d/w.rank0.pt"), want));
}

// ZeRO-Inference from a folder of its own world size reads this rank's shard alone: no rank
// materialises the others' weights and optimizer state (consolidation would). A bf16 run with
// fp32 masters: its shard holds the bf16 roundings the bf16 inference weights equal; inference
// in fp32 needs the masters and reads the folder consolidated, saying so.
TEST(DeepSpeed, Stage3InferenceReadsOnlyItsOwnShardOfItsWorldSizesFolder) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const std::vector<std::string> net{"--width", "128", "--depth", "2", "--sync-dist", "1"};
  auto train = run_job(
      cat({"--root", dir / "a", "--out", dir / "a/w", "--devices", "2", "--batch", "8", "--epochs",
           "1", "--ckpt-every-step", "1", "--zero", "3", "--optimizer", "adam", "--bf16-all", "1"},
          net));
  ASSERT_EQ(train.code, 0) << train.output;
  const std::string ckpt = dir / "a/ckpt/last.ckpt";
  ASSERT_TRUE(volt::is_zero_checkpoint(ckpt)) << train.output;
  const double shard = static_cast<double>(std::filesystem::file_size(ckpt + "/rank_0_of_2.ckpt"));
  const std::vector<std::string> eval = cat(net, {"--evaluate", ckpt});
  // The reference: one process, the folder consolidated (the weights are the fp32 masters).
  auto one = run_job(cat({"--root", dir / "c", "--out", dir / "c/w", "--devices", "1"}, eval));
  ASSERT_EQ(one.code, 0) << one.output;
  const at::Tensor masters = load_flat(dir / "c/w.rank0.pt");
  // Two ranks in bf16 (bf16-true: the weights are bf16): each reads its own shard.
  auto bf16 = run_job(cat({"--root", dir / "b", "--out", dir / "b/w", "--devices", "2", "--zero",
                           "3", "--precision", "bf16-true"},
                          eval));
  ASSERT_EQ(bf16.code, 0) << bf16.output;
  EXPECT_EQ(bf16.output.find("consolidated"), std::string::npos) << bf16.output;
  // Two ranks in fp32: the masters, consolidated.
  auto fp32 = run_job(
      cat({"--root", dir / "d", "--out", dir / "d/w", "--devices", "2", "--zero", "3"}, eval));
  ASSERT_EQ(fp32.code, 0) << fp32.output;
  EXPECT_NE(fp32.output.find("reads '" + ckpt +
                             "' consolidated: its weights are BFloat16 "
                             "roundings of fp32 masters"),
            std::string::npos)
      << fp32.output;
  const Evaluated ref = evaluated(one.output, 0);
  for (int r = 0; r < 2; ++r) {
    const std::string rank = std::to_string(r);
    const Evaluated b = evaluated(bf16.output, r), f = evaluated(fp32.output, r);
    EXPECT_EQ(b.released, 1) << "rank " << r;
    EXPECT_EQ(f.released, 1) << "rank " << r;
    EXPECT_EQ(b.pred_diff, 0.0) << "rank " << r;
    // The bf16 weights are the masters' roundings; the fp32 ones the masters themselves.
    EXPECT_TRUE(torch::equal(load_flat(dir / ("b/w.rank" + rank + ".pt")).to(torch::kFloat),
                             masters.to(torch::kBFloat16).to(torch::kFloat)))
        << "rank " << r;
    EXPECT_TRUE(torch::equal(load_flat(dir / ("d/w.rank" + rank + ".pt")), masters))
        << "rank " << r;
    EXPECT_NEAR(f.val_loss, ref.val_loss, 1e-6 * std::abs(ref.val_loss)) << "rank " << r;
    // Memory: this rank's chunks of the weights read from its own shard (the optimizer's part
    // is skipped), against each shard read whole in turn and every weight built in fp32 when
    // consolidating the weights.
    std::printf(
        "[ measured ] rank %d: setup + load peak %.0f bytes from its own shard, %.0f "
        "consolidated (shard file %.0f bytes)\n",
        r, b.load_peak, f.load_peak, shard);
    EXPECT_GT(b.load_peak, 0) << "rank " << r;
    EXPECT_LT(b.load_peak, shard) << "rank " << r;
    EXPECT_GT(f.load_peak, shard) << "rank " << r;
    EXPECT_GT(f.load_peak, 2 * b.load_peak) << "rank " << r;
  }
}

// The tensors of `ar`'s sub-archive `key` ("state_dict"), by name.
std::map<std::string, at::Tensor> tensors_at(torch::serialize::InputArchive& ar,
                                             const std::string& key) {
  torch::serialize::InputArchive sub;
  EXPECT_TRUE(ar.try_read(key, sub)) << key;
  std::map<std::string, at::Tensor> out;
  for (const auto& name : sub.keys()) {
    at::Tensor t;
    if (sub.try_read(name, t)) out[name] = t;
  }
  return out;
}

// Consolidating the weights alone (what validate / test / predict and load_weights read) gives
// the full consolidation's weights (the fp32 masters of a bf16 run, stage 3's chunks joined;
// stage 2's whole weights replaced by their masters) and everything but the optimizers' states,
// reading one shard at a time: its peak tensor bytes are well below the full one's.
TEST(DeepSpeed, ConsolidatingTheWeightsAloneKeepsAllButTheOptimizerStates) {
  VOLT_REQUIRE_GLOO();
  volt::install_counting_cpu_allocator();
  for (const std::string stage : {"3", "2"}) {
    volt_test::TempDir dir;
    auto train =
        run_job({"--root",  dir / "a", "--out",       dir / "a/w", "--devices",         "2",
                 "--batch", "8",       "--epochs",    "1",         "--ckpt-every-step", "1",
                 "--zero",  stage,     "--optimizer", "adam",      "--bf16-all",        "1",
                 "--width", "128",     "--depth",     "2"});
    ASSERT_EQ(train.code, 0) << train.output;
    const std::string ckpt = dir / "a/ckpt/last.ckpt";
    ASSERT_TRUE(volt::is_zero_checkpoint(ckpt)) << train.output;
    const auto peak_of = [&](volt::ZeroContents contents, torch::serialize::InputArchive& out) {
      volt::reset_cpu_memory_peaks();
      const int64_t before = volt::cpu_memory_stats().in_use;
      out = volt::load_consolidated_zero_checkpoint(ckpt, contents);
      return volt::cpu_memory_stats().max_in_use - before;
    };
    torch::serialize::InputArchive full, weights;
    const int64_t full_peak = peak_of(volt::ZeroContents::kEverything, full);
    const int64_t weights_peak = peak_of(volt::ZeroContents::kWeights, weights);
    const auto want = tensors_at(full, "state_dict");
    const auto got = tensors_at(weights, "state_dict");
    ASSERT_EQ(got.size(), want.size()) << "stage " << stage;
    ASSERT_FALSE(want.empty());
    for (const auto& [name, t] : want) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_EQ(got.at(name).scalar_type(), torch::kFloat) << name;  // the masters
      EXPECT_TRUE(torch::equal(got.at(name), t)) << "stage " << stage << " " << name;
    }
    // The optimizer's state is left out; its scheduler count, the loop and callbacks stay.
    torch::serialize::InputArchive opt, none, loop;
    ASSERT_TRUE(full.try_read("optimizers", opt));
    EXPECT_TRUE(opt.try_read("optimizer_0", none));
    ASSERT_TRUE(weights.try_read("optimizers", opt));
    EXPECT_FALSE(opt.try_read("optimizer_0", none)) << "stage " << stage;
    c10::IValue count;
    EXPECT_TRUE(opt.try_read("count", count));
    EXPECT_TRUE(weights.try_read("loop", loop));
    std::printf(
        "[ measured ] stage %s, 2 shards: peak tensor bytes consolidating the weights "
        "alone %lld, everything %lld (%.2fx)\n",
        stage.c_str(), static_cast<long long>(weights_peak), static_cast<long long>(full_peak),
        static_cast<double>(weights_peak) / static_cast<double>(full_peak));
    EXPECT_LT(weights_peak, full_peak * 6 / 10) << "stage " << stage;
  }
}

void expect_four_rank_folder_loads_elsewhere(const std::string& stage) {
  volt_test::TempDir dir;
  // The reference: 4 ranks train 2 epochs uninterrupted. The others stop after epoch 1 (a
  // checkpoint per step) and continue from that folder at other world sizes.
  const std::vector<std::string> zero{"--zero", stage, "--optimizer", "adam"};
  auto full = run_job(cat({"--root", dir / "a", "--out", dir / "a/w", "--devices", "4", "--batch",
                           "4", "--epochs", "2"},
                          zero));
  ASSERT_EQ(full.code, 0) << full.output;
  auto first = run_job(cat({"--root", dir / "b", "--out", dir / "b/w", "--devices", "4", "--batch",
                            "4", "--epochs", "1", "--ckpt-every-step", "1"},
                           zero));
  ASSERT_EQ(first.code, 0) << first.output;
  const std::string ckpt = dir / "b/ckpt/last.ckpt";
  ASSERT_TRUE(volt::is_zero_checkpoint(ckpt)) << first.output;
  // Two ranks with ZeRO: each takes its chunks from the consolidated state.
  auto two = run_job(cat({"--root", dir / "c", "--out", dir / "c/w", "--devices", "2", "--batch",
                          "8", "--epochs", "2", "--resume", ckpt},
                         zero));
  ASSERT_EQ(two.code, 0) << two.output;
  EXPECT_NE(two.output.find("rank 0 starts at step 8"), std::string::npos) << two.output;
  // One plain process (single_device) on the global batch.
  auto one = run_job({"--root", dir / "d", "--out", dir / "d/w", "--devices", "1", "--batch", "16",
                      "--epochs", "2", "--optimizer", "adam", "--resume", ckpt});
  ASSERT_EQ(one.code, 0) << one.output;
  // ZeRO at one rank (stage 3 keeps its parameters whole there): the consolidated state too.
  auto alone = run_job(cat({"--root", dir / "e", "--out", dir / "e/w", "--devices", "1", "--batch",
                            "16", "--epochs", "2", "--resume", ckpt},
                           zero));
  ASSERT_EQ(alone.code, 0) << alone.output;
  EXPECT_NE(alone.output.find("rank 0 starts at step 8"), std::string::npos) << alone.output;
  const auto want = load_flat(dir / "a/w.rank0.pt");
  for (const std::string got : {"c/w.rank0.pt", "c/w.rank1.pt", "d/w.rank0.pt", "e/w.rank0.pt"}) {
    const auto w = load_flat(dir / got);
    EXPECT_TRUE(torch::allclose(w, want, 1e-5, 1e-6))
        << got << " max diff " << (w - want).abs().max().item<double>();
  }
  // The C++ consolidation writes one ordinary checkpoint file.
  volt::consolidate_zero_checkpoint(ckpt, dir / "full.ckpt");
  struct stat st;
  ASSERT_EQ(::stat((dir / "full.ckpt").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST(DeepSpeed, AFourRankShardFolderLoadsAtTwoRanksAndInOneProcess) {
  VOLT_REQUIRE_GLOO();
  expect_four_rank_folder_loads_elsewhere("2");
}

TEST(DeepSpeed, AFourRankStage3FolderLoadsAtTwoRanksAndInOneProcess) {
  VOLT_REQUIRE_GLOO();
  expect_four_rank_folder_loads_elsewhere("3");
}

TEST(DeepSpeed, AnIncompleteShardFolderIsACheckpointErrorNotACrash) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const std::string folder = dir / "half.ckpt";
  ASSERT_EQ(::mkdir(folder.c_str(), 0755), 0);
  std::ofstream(folder + "/rank_0_of_2.ckpt") << "not a checkpoint";
  EXPECT_FALSE(volt::is_zero_checkpoint(folder));
  EXPECT_THROW(volt::consolidate_zero_checkpoint(folder, dir / "out.ckpt"), volt::CheckpointError);
  std::ofstream(folder + "/zero_checkpoint.txt") << "format 1\nworld_size 2\nstage 2\n";
  try {
    volt::consolidate_zero_checkpoint(folder, dir / "out.ckpt");
    FAIL() << "a folder missing rank 1's shard was consolidated";
  } catch (const volt::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("lacks the shard of rank 1"), std::string::npos)
        << e.what();
  }
  std::ofstream(folder + "/zero_checkpoint.txt", std::ios::trunc) << "format 9\nworld_size 0\n";
  EXPECT_THROW(volt::consolidate_zero_checkpoint(folder, dir / "out.ckpt"), volt::CheckpointError);
}

// ------------------------------------------------------------------------------ options

using volt_test::expect_deepspeed_error;
using volt_test::make_deepspeed;

TEST(DeepSpeed, BadOrUnbuiltOptionsAreTypedErrors) {
  VOLT_REQUIRE_GLOO();
  using O = volt::DeepSpeedStrategyOptions;
  expect_deepspeed_error<volt::ConfigError>(O().stage(4), "stage=4 is not a ZeRO stage");
  expect_deepspeed_error<volt::ConfigError>(O().stage(2).offload_parameters(true), "needs stage 3");
  expect_deepspeed_error<volt::ConfigError>(O().stage(3).max_live_parameters(-1), "must be >= 0");
  expect_deepspeed_error<volt::ConfigError>(O().offload_optimizer_device("disk"),
                                            "use \"cpu\" or \"nvme\"");
  // NVMe offload is built: a missing nvme_path is what fails (deepspeed_nvme_test.cpp).
  expect_deepspeed_error<volt::ConfigError>(
      O().offload_optimizer(true).offload_optimizer_device("nvme"),
      "nvme_path='/local_nvme' does not exist");
  expect_deepspeed_error<volt::ConfigError>(O().reduce_bucket_size(0), "must be > 0");
  expect_deepspeed_error<volt::ConfigError>(O().parallel_devices(-1), "parallel_devices=-1");
  EXPECT_NO_THROW(make_deepspeed(O().offload_optimizer(true)));  // host memory already on CPU runs
}

TEST(DeepSpeed, RegisteredNamesBuildTheirStages) {
  VOLT_REQUIRE_GLOO();
  auto& reg = volt::registry();
  volt::StrategyContext ctx{std::make_shared<volt::CpuAccelerator>(),
                            reg.precisions.create("32-true"), 2, 1};
  for (const auto& [name, stage] :
       std::vector<std::pair<std::string, int>>{{"deepspeed", 2},
                                                {"deepspeed_stage_1", 1},
                                                {"deepspeed_stage_2", 2},
                                                {"deepspeed_stage_2_offload", 2},
                                                {"deepspeed_stage_3", 3},
                                                {"deepspeed_stage_3_offload", 3}}) {
    auto s = std::dynamic_pointer_cast<volt::DeepSpeedStrategy>(reg.strategies.create(name, ctx));
    ASSERT_NE(s, nullptr) << name;
    EXPECT_EQ(s->deepspeed_options().stage(), stage) << name;
    const bool offload = name.find("offload") != std::string::npos;
    EXPECT_EQ(s->deepspeed_options().offload_optimizer(), offload) << name;
    EXPECT_EQ(s->deepspeed_options().offload_parameters(), offload && stage == 3) << name;
  }
}

// Precision "16-mixed" under DeepSpeedStrategy gets DeepSpeed's loss scaler (Lightning's
// DeepSpeedStrategy arguments, or the JSON's fp16 section with DeepSpeed's defaults for what it
// leaves out); other precisions keep their own scaler settings.
TEST(DeepSpeed, SixteenBitMixedGetsDeepSpeedsLossScaler) {
  VOLT_REQUIRE_GLOO();
  using O = volt::DeepSpeedStrategyOptions;
  auto accel = std::make_shared<volt::CpuAccelerator>();
  auto scaler_of = [&](const O& o, const std::string& precision = "16-mixed") {
    auto p = volt::registry().precisions.create(precision);
    volt::DeepSpeedStrategy s(o, accel, p, 2);
    auto mixed = std::dynamic_pointer_cast<volt::MixedPrecision>(p);
    EXPECT_NE(mixed, nullptr);
    EXPECT_NE(mixed->scaler(), nullptr);
    return mixed->scaler()->options();
  };
  // The defaults: DeepSpeed's (2^16, window 1000, hysteresis 2, floor 1 that stops the run).
  auto d = scaler_of(O());
  EXPECT_TRUE(d.dynamic());
  EXPECT_DOUBLE_EQ(d.init_scale(), 65536.0);
  EXPECT_DOUBLE_EQ(d.growth_factor(), 2.0);
  EXPECT_DOUBLE_EQ(d.backoff_factor(), 0.5);
  EXPECT_EQ(d.growth_interval(), 1000);
  EXPECT_EQ(d.hysteresis(), 2);
  EXPECT_FALSE(d.consecutive_hysteresis());
  EXPECT_DOUBLE_EQ(d.min_scale(), 1.0);
  EXPECT_TRUE(d.error_at_min_scale());
  // The options (the registered name's parameters are the same, checked below).
  auto o = scaler_of(O().initial_scale_power(10)
                         .loss_scale_window(50)
                         .hysteresis(3)
                         .min_loss_scale(4)
                         .consecutive_hysteresis(true));
  EXPECT_DOUBLE_EQ(o.init_scale(), 1024.0);
  EXPECT_EQ(o.growth_interval(), 50);
  EXPECT_EQ(o.hysteresis(), 3);
  EXPECT_TRUE(o.consecutive_hysteresis());
  EXPECT_DOUBLE_EQ(o.min_scale(), 4.0);
  // A static scale: never moves, inf/NaN steps still skipped.
  auto st = scaler_of(O().loss_scale(128));
  EXPECT_FALSE(st.dynamic());
  EXPECT_DOUBLE_EQ(st.init_scale(), 128.0);
  // The JSON's fp16 section replaces the options, DeepSpeed's defaults filling its gaps.
  auto j = scaler_of(O().hysteresis(5).initial_scale_power(3).config(
      R"({"fp16": {"enabled": true, "initial_scale_power": 8, "min_loss_scale": 2}})"));
  EXPECT_DOUBLE_EQ(j.init_scale(), 256.0);
  EXPECT_EQ(j.hysteresis(), 2);
  EXPECT_EQ(j.growth_interval(), 1000);
  EXPECT_DOUBLE_EQ(j.min_scale(), 2.0);
  // A JSON without an fp16 section leaves the options.
  EXPECT_EQ(
      scaler_of(O().hysteresis(5).config(R"({"zero_optimization": {"stage": 1}})")).hysteresis(),
      5);
  // Another precision with loss scaling keeps its own settings.
  auto bf16 = std::make_shared<volt::MixedPrecision>(
      volt::MixedPrecisionOptions().dtype("bf16").loss_scaling(true).scaler(
          volt::GradScalerOptions().init_scale(8)));
  volt::DeepSpeedStrategy keeps(O(), accel, bf16, 2);
  EXPECT_DOUBLE_EQ(bf16->scaler()->options().init_scale(), 8.0);
  EXPECT_EQ(bf16->scaler()->options().hysteresis(), 1);
  // The registered names take them as parameters.
  auto& reg = volt::registry();
  auto p = reg.precisions.create("16-mixed");
  volt::StrategyContext ctx{accel, p, 2, 1};
  reg.strategies.create("deepspeed", volt::Args("deepspeed", {{"hysteresis", int64_t{7}}}), ctx);
  EXPECT_EQ(std::dynamic_pointer_cast<volt::MixedPrecision>(p)->scaler()->options().hysteresis(),
            7);
  // Out of range: ConfigErrors in DeepSpeed's words.
  using volt_test::expect_deepspeed_error;
  expect_deepspeed_error<volt::ConfigError>(O().initial_scale_power(128), "must be in [0, 127]");
  expect_deepspeed_error<volt::ConfigError>(O().hysteresis(0), "must be >= 1");
  expect_deepspeed_error<volt::ConfigError>(O().loss_scale(-2), "loss_scale=-2 must be >= 0");
  expect_deepspeed_error<volt::ConfigError>(O().min_loss_scale(0), "min_loss_scale=0 must be > 0");
  expect_deepspeed_error<volt::ConfigError>(O().initial_scale_power(2).min_loss_scale(8),
                                            "at most the initial scale 2^2 = 4");
}

TEST(DeepSpeed, LossScalingWithNvmeAndUntestedOptimizersAreRefusedAtSetUp) {
  VOLT_REQUIRE_GLOO();
  auto accel = std::make_shared<volt::CpuAccelerator>();
  volt_test::TempDir dir;
  volt_test::TinyClassifier m;  // never set up: the checks come first
  auto p = torch::zeros({2}, torch::requires_grad());
  std::vector<volt::OptimizerConfig> opts{
      std::make_shared<torch::optim::LBFGS>(std::vector<torch::Tensor>{p})};
  // 16-mixed scales the loss: refused with the optimizer on NVMe (sub-group steps)...
  volt::DeepSpeedStrategy nvme(volt::DeepSpeedStrategyOptions()
                                   .offload_optimizer(true)
                                   .offload_optimizer_device("nvme")
                                   .nvme_path(dir.path),
                               accel, volt::registry().precisions.create("16-mixed"), 2);
  EXPECT_THROW(nvme.setup_optimizers(m, opts), volt::NotAvailable);
  // ...and accepted without it (this strategy was never set up, so the engine then finds no
  // process group: past the precision check).
  volt::DeepSpeedStrategy fp16(volt::DeepSpeedStrategyOptions(), accel,
                               volt::registry().precisions.create("16-mixed"), 2);
  try {
    fp16.setup_optimizers(m, opts);
    FAIL() << "an engine without a process group was built";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs a process group"), std::string::npos) << e.what();
  }
  volt::DeepSpeedStrategy strict(
      volt::DeepSpeedStrategyOptions().zero_allow_untested_optimizer(false), accel,
      volt::registry().precisions.create("32-true"), 2);
  try {
    strict.setup_optimizers(m, opts);
    FAIL() << "LBFGS was accepted";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_allow_untested_optimizer"), std::string::npos);
  }
}

}  // namespace
