// ZeRO-Infinity's optimizer offload to NVMe (DeepSpeedStrategy, offload_optimizer_device
// "nvme"; issue #12) with real processes over loopback (Gloo) and real swap files under a temp
// folder: the weights equal the in-memory ZeRO run bitwise (the same arithmetic, sub-group by
// sub-group) and one process to fp32 round-off; between steps the optimizer state is in the
// files, not in memory; checkpoints resume exactly; a rank killed with a write in flight leaves
// survivors that exit and a checkpoint that loads; options, registry name and JSON keys.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <regex>

#include "deepspeed_testing.h"
#include "processes.h"
#include "requires.h"
#include "tiny.h"
#include "training_jobs.h"
#include "volt/strategies/deepspeed.h"

namespace {

using namespace std::chrono_literals;
using volt_test::expect_ranks_equal_reference;
using volt_test::Job;
using volt_test::load_flat;
using volt_test::run_job;
using volt_test::single_process_reference;

using volt_test::cat;
bool empty_dir(const std::string& p) {
  return std::filesystem::is_directory(p) && std::filesystem::is_empty(p);
}

struct Line {
  double state = -1, nvme = -1, numel = 0;
};

Line zero_line(const std::string& output, int rank) {
  std::smatch m;
  const std::regex re("rank " + std::to_string(rank) +
                      " done .* state=(\\d+) master=\\d+ numel=(\\d+) nvme=(\\d+)");
  EXPECT_TRUE(std::regex_search(output, m, re)) << output;
  if (m.size() < 4) return {};
  return {std::stod(m[1]), std::stod(m[3]), std::stod(m[2])};
}

TEST(DeepSpeedNvme, Stages123AtTwoRanksEqualInMemoryZeroBitwiseWithTheStateInFiles) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const std::string nvme = dir / "nvme";
  std::filesystem::create_directories(nvme);
  struct Case {
    const char* stage;
    const char* optimizer;
    const char* sub_group;
    const char* uring;
  };
  for (const Case& c : {Case{"1", "sgd", "64", "1"}, Case{"2", "fused_adamw", "100", "0"},
                        Case{"3", "adam", "64", "1"}}) {
    const std::vector<std::string> common{"--devices", "2",  "--batch",     "8",
                                          "--epochs",  "1",  "--zero",      c.stage,
                                          "--width",   "16", "--optimizer", c.optimizer};
    const std::string mem = dir / (std::string("mem") + c.stage);
    const std::string off = dir / (std::string("nvme") + c.stage);
    auto in_memory = run_job(cat({"--root", dir.path, "--out", mem}, common));
    ASSERT_EQ(in_memory.code, 0) << in_memory.output;
    auto offloaded = run_job(cat({"--root", dir.path, "--out", off, "--nvme", nvme, "--sub-group",
                                  c.sub_group, "--aio-uring", c.uring},
                                 common));
    ASSERT_EQ(offloaded.code, 0) << offloaded.output;
    for (int r = 0; r < 2; ++r) {
      const std::string suffix = ".rank" + std::to_string(r) + ".pt";
      EXPECT_TRUE(torch::equal(load_flat(mem + suffix), load_flat(off + suffix)))
          << "stage " << c.stage << " rank " << r;
      // Measured before a step (the state of the previous ones exists): none in memory, the
      // file holds all of this rank's state (Adam: 8 Psi / N bytes).
      const Line in_ram = zero_line(in_memory.output, r), swapped = zero_line(offloaded.output, r);
      EXPECT_EQ(swapped.state, 0) << offloaded.output;
      if (std::string(c.optimizer).rfind("fused", 0) == 0) {
        // The fused optimizer's in-memory state is one aligned flat buffer: a little larger.
        EXPECT_LE(swapped.nvme, in_ram.state) << "stage " << c.stage;
        EXPECT_GE(swapped.nvme, 0.85 * in_ram.state) << "stage " << c.stage;
      } else {
        EXPECT_EQ(swapped.nvme, in_ram.state) << "stage " << c.stage;
      }
      EXPECT_EQ(in_ram.nvme, 0);
      if (std::string(c.optimizer) == "adam") {
        EXPECT_NEAR(swapped.nvme, 8 * swapped.numel / 2, 0.05 * 8 * swapped.numel / 2);
      }
      if (r == 0) {
        std::printf(
            "[ measured ] stage %s %s: optimizer state in RAM %.0f bytes (in-memory run "
            "%.0f), in the swap file %.0f\n",
            c.stage, c.optimizer, swapped.state, in_ram.state, swapped.nvme);
      }
    }
    EXPECT_TRUE(empty_dir(nvme)) << "the run's swap folder outlived it";
  }
  // And one process on the global batch (stage 3, Adam), to the usual fp32 tolerance.
  const auto ref =
      single_process_reference(dir.path, 16, 1, 1, false, {"--optimizer", "adam", "--width", "16"});
  expect_ranks_equal_reference(dir / "nvme3", 2, ref);
}

TEST(DeepSpeedNvme, ParameterChunksInFilesTooEqualInMemoryZeroBitwise) {
  VOLT_REQUIRE_GLOO();
  // ZeRO-Infinity in full (deepspeed_stage_3_offload_nvme): stage 3's parameter chunks and the
  // optimizer state both live in swap files between uses. Same weights, bit for bit, as stage 3
  // in memory; before a step no parameter bytes are in RAM and the file holds 4 Psi / N.
  volt_test::TempDir dir;
  const std::string nvme = dir / "nvme";
  std::filesystem::create_directories(nvme);
  const std::vector<std::string> common{"--devices", "2",      "--batch",     "8",       "--epochs",
                                        "1",         "--zero", "3",           "--width", "16",
                                        "--depth",   "2",      "--optimizer", "adam"};
  auto in_memory = run_job(cat({"--root", dir.path, "--out", dir / "mem"}, common));
  ASSERT_EQ(in_memory.code, 0) << in_memory.output;
  for (const char* optimizer_too : {"0", "1"}) {
    const std::string out = dir / (std::string("files") + optimizer_too);
    std::vector<std::string> args = cat({"--root", dir.path, "--out", out, "--nvme-params", "1",
                                         "--nvme", nvme, "--sub-group", "64"},
                                        common);
    if (optimizer_too[0] == '0') args = cat(args, {"--nvme-optimizer", "0"});
    auto offloaded = run_job(args);
    ASSERT_EQ(offloaded.code, 0) << offloaded.output;
    for (int r = 0; r < 2; ++r) {
      const std::string suffix = ".rank" + std::to_string(r) + ".pt";
      EXPECT_TRUE(torch::equal(load_flat(dir / ("mem" + suffix)), load_flat(out + suffix)))
          << "rank " << r << " optimizer in files " << optimizer_too;
      std::smatch m;
      const std::regex re("rank " + std::to_string(r) +
                          " done .* zero_memory params=(\\d+) .* numel=(\\d+) nvme=(\\d+) "
                          "params_in_files=(\\d+) .* step_chunk_peak=(\\d+) max_chunk=(\\d+)");
      ASSERT_TRUE(std::regex_search(offloaded.output, m, re)) << offloaded.output;
      const double params = std::stod(m[1]), numel = std::stod(m[2]), state = std::stod(m[3]),
                   in_files = std::stod(m[4]), peak = std::stod(m[5]), max_chunk = std::stod(m[6]);
      EXPECT_EQ(params, 0) << "every parameter chunk is in the file before the step";
      EXPECT_NEAR(in_files, 4 * numel / 2, 0.05 * 4 * numel / 2);
      EXPECT_EQ(state > 0, optimizer_too[0] == '1');
      // During the step, with the optimizer state in memory or on NVMe too: the chunks of at
      // most two sub-groups at once (the one stepping, the next one being read or the last one
      // being written), as DeepSpeed swaps parameters with their sub-group. A sub-group holds
      // 64 elements, or one parameter's chunk when that is larger.
      const double shard = in_files / 4;
      EXPECT_GT(peak, 0);
      EXPECT_LE(peak, 2 * std::max(64.0, max_chunk));
      EXPECT_LT(peak, shard);
      if (r == 0) {
        std::printf(
            "[ measured ] parameters in RAM %.0f bytes, in the swap file %.0f (4 Psi/N = "
            "%.0f); optimizer state in files %.0f; during the step at most %.0f of the shard's "
            "%.0f elements in RAM\n",
            params, in_files, 4 * numel / 2, state, peak, shard);
      }
    }
    EXPECT_TRUE(empty_dir(nvme)) << "the run's swap folder outlived it";
  }
}

TEST(DeepSpeedNvme, Bf16MastersSwapWithTheirStateAndEqualInMemoryMastersBitwise) {
  VOLT_REQUIRE_GLOO();
  // bf16-mixed with master weights (BF16Optimizer) and the optimizer on NVMe: the fp32 masters
  // swap with their Adam state, sub-group by sub-group, as DeepSpeed's swapper does. Same fp32
  // weights, bit for bit, as the masters in memory; before a step no master bytes are in RAM and
  // the file holds the masters and the moments (4 + 8 = 12 bytes per element of this rank).
  volt_test::TempDir dir;
  const std::string nvme = dir / "nvme";
  std::filesystem::create_directories(nvme);
  for (const char* stage : {"2", "3"}) {
    const std::vector<std::string> common{
        "--devices", "2",       "--batch", "8",           "--epochs", "1",           "--zero",
        stage,       "--width", "16",      "--optimizer", "adam",     "--precision", "bf16-mixed"};
    const std::string mem = dir / (std::string("mem") + stage);
    const std::string off = dir / (std::string("nvme") + stage);
    auto in_memory = run_job(cat({"--root", dir.path, "--out", mem}, common));
    ASSERT_EQ(in_memory.code, 0) << in_memory.output;
    auto offloaded = run_job(
        cat({"--root", dir.path, "--out", off, "--nvme", nvme, "--sub-group", "64"}, common));
    ASSERT_EQ(offloaded.code, 0) << offloaded.output;
    for (int r = 0; r < 2; ++r) {
      const std::string suffix = ".rank" + std::to_string(r) + ".pt";
      EXPECT_TRUE(torch::equal(load_flat(mem + suffix), load_flat(off + suffix)))
          << "stage " << stage << " rank " << r;
      const std::regex re("rank " + std::to_string(r) +
                          " done .* state=(\\d+) master=(\\d+) numel=(\\d+) nvme=(\\d+)");
      std::smatch a, b;
      ASSERT_TRUE(std::regex_search(in_memory.output, a, re)) << in_memory.output;
      ASSERT_TRUE(std::regex_search(offloaded.output, b, re)) << offloaded.output;
      const double mem_state = std::stod(a[1]), mem_master = std::stod(a[2]);
      const double numel = std::stod(b[3]), state = std::stod(b[1]), master = std::stod(b[2]),
                   in_files = std::stod(b[4]);
      EXPECT_NEAR(mem_master, 4 * numel / 2, 0.05 * 4 * numel / 2) << "stage " << stage;
      EXPECT_EQ(state, 0) << offloaded.output;
      EXPECT_EQ(master, 0) << "stage " << stage << ": the masters are in the file";
      EXPECT_EQ(in_files, mem_state + mem_master) << "stage " << stage;
      EXPECT_NEAR(in_files, 12 * numel / 2, 0.05 * 12 * numel / 2) << "stage " << stage;
      if (r == 0) {
        std::printf(
            "[ measured ] stage %s bf16 masters: in RAM %.0f bytes (in-memory run %.0f), in the "
            "swap file with their state %.0f (12 Psi/N = %.0f)\n",
            stage, master, mem_master, in_files, 12 * numel / 2);
      }
    }
    EXPECT_TRUE(empty_dir(nvme)) << "the run's swap folder outlived it";
  }
  // Stage 3 with the bf16 parameter chunks in a file too: each sub-group's chunks come in (with
  // their masters and state when the optimizer is on NVMe too, deepspeed_stage_3_offload_nvme;
  // with the masters in memory otherwise), the stepped masters are rounded into them, and they
  // go back out; the same weights bit for bit.
  // Two hidden layers, so that the shard spans more than two sub-groups.
  const std::vector<std::string> deep{
      "--devices", "2",  "--batch", "8", "--epochs",    "1",    "--zero",      "3",
      "--width",   "16", "--depth", "2", "--optimizer", "adam", "--precision", "bf16-mixed"};
  const std::string deep_mem = dir / "deep_mem";
  auto in_memory = run_job(cat({"--root", dir.path, "--out", deep_mem}, deep));
  ASSERT_EQ(in_memory.code, 0) << in_memory.output;
  for (const char* optimizer_too : {"1", "0"}) {
    SCOPED_TRACE(std::string("optimizer on NVMe too: ") + optimizer_too);
    const std::string out = dir / (std::string("params3_") + optimizer_too);
    auto offloaded = run_job(cat({"--root", dir.path, "--out", out, "--nvme", nvme, "--sub-group",
                                  "64", "--nvme-params", "1", "--nvme-optimizer", optimizer_too},
                                 deep));
    ASSERT_EQ(offloaded.code, 0) << offloaded.output;
    for (int r = 0; r < 2; ++r) {
      const std::string suffix = ".rank" + std::to_string(r) + ".pt";
      EXPECT_TRUE(torch::equal(load_flat(deep_mem + suffix), load_flat(out + suffix)))
          << "rank " << r;
      std::smatch m;
      const std::regex re("rank " + std::to_string(r) +
                          " done .* master=(\\d+) .* params_in_files=(\\d+) .* "
                          "step_chunk_peak=(\\d+)");
      ASSERT_TRUE(std::regex_search(offloaded.output, m, re)) << offloaded.output;
      const double master = std::stod(m[1]), shard = std::stod(m[2]) / 2;  // bf16 chunks
      EXPECT_EQ(master > 0, optimizer_too[0] == '0') << "the masters are where their state is";
      EXPECT_GT(std::stod(m[3]), 0);
      EXPECT_LT(std::stod(m[3]), shard);
    }
    EXPECT_TRUE(empty_dir(nvme)) << "the run's swap folder outlived it";
  }
}

TEST(DeepSpeedNvme, AKilledRunResumesBitIdenticallyFromItsCheckpoint) {
  VOLT_REQUIRE_GLOO();
  // Parameter chunks and optimizer state both on NVMe (and, bf16-mixed, the fp32 masters with
  // the state), and bf16-mixed with only the parameter chunks there (masters and state in
  // memory): saving reads them in, loading writes them out again.
  const std::pair<const char*, const char*> cases[] = {
      {"32-true", "1"}, {"bf16-mixed", "1"}, {"bf16-mixed", "0"}};
  for (const auto& [precision, optimizer_too] : cases) {
    SCOPED_TRACE(std::string(precision) + ", optimizer on NVMe: " + optimizer_too);
    volt_test::TempDir dir;
    std::filesystem::create_directories(dir / "nvme");
    const std::vector<std::string> common{"--devices",
                                          "2",
                                          "--batch",
                                          "8",
                                          "--epochs",
                                          "2",
                                          "--dropout",
                                          "1",
                                          "--accum",
                                          "3",
                                          "--zero",
                                          "3",
                                          "--optimizer",
                                          "adam",
                                          "--ckpt-every-batch",
                                          "1",
                                          "--nvme",
                                          dir / "nvme",
                                          "--sub-group",
                                          "100",
                                          "--nvme-params",
                                          "1",
                                          "--precision",
                                          precision,
                                          "--nvme-optimizer",
                                          optimizer_too};
    volt_test::run_full_then_killed(dir.path, common);
    if (::testing::Test::HasFatalFailure()) return;
    auto resumed = run_job(
        cat({"--root", dir / "b", "--out", dir / "b/w", "--resume", dir / "b/every_batch.ckpt"},
            common));
    ASSERT_EQ(resumed.code, 0) << resumed.output;
    for (int r = 0; r < 2; ++r) {
      const std::string suffix = ".rank" + std::to_string(r) + ".pt";
      EXPECT_TRUE(
          torch::equal(load_flat(dir / ("a/w" + suffix)), load_flat(dir / ("b/w" + suffix))))
          << "rank " << r;
    }
  }
}

TEST(DeepSpeedNvme, ARankKilledWithAWriteInFlightLeavesSurvivorsThatExitAndACheckpointThatLoads) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  std::filesystem::create_directories(dir / "nvme");
  const std::vector<std::string> common{
      "--devices", "2",          "--batch",     "8",    "--epochs",          "1",
      "--zero",    "2",          "--optimizer", "adam", "--ckpt-every-step", "1",
      "--nvme",    dir / "nvme", "--sub-group", "64"};
  auto full = run_job(cat({"--root", dir / "a", "--out", dir / "a/w"}, common));
  ASSERT_EQ(full.code, 0) << full.output;
  // Local rank 1 dies right after submitting its 20th write request (its 4th step's swap-out).
  const auto start = std::chrono::steady_clock::now();
  volt_test::Process killed(
      volt_test::kTrainingWorker,
      cat({"--root", dir / "b", "--out", dir / "b/w", "--timeout", "20"}, common),
      {{"VOLT_TEST_KILL_AFTER_NVME_WRITES", "1:20"}});
  const int code = killed.exit_code(60s);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(code, 1) << killed.output();
  EXPECT_NE(killed.output().find("killed with a write in flight"), std::string::npos)
      << killed.output();
  EXPECT_LT(seconds, 50) << "the survivor hung";
  const std::string ckpt = dir / "b/ckpt/last.ckpt";
  ASSERT_TRUE(volt::is_zero_checkpoint(ckpt)) << killed.output();
  // The killed rank could not remove its swap folder; a folder another live run holds (its
  // owner.lock locked, here by this test) must survive the next run's sweep.
  size_t leftovers = 0;
  for (const auto& run : std::filesystem::directory_iterator(dir / "nvme")) {
    if (run.path().filename().string().rfind("volt-nvme-", 0) == 0) ++leftovers;
  }
  EXPECT_EQ(leftovers, 1u) << "the killed rank's folder stays behind until the next run";
  const std::string live = dir / "nvme/volt-nvme-1-1/rank0";
  std::filesystem::create_directories(live);
  const int live_fd = ::open((live + "/owner.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(live_fd, 0);
  ASSERT_EQ(::flock(live_fd, LOCK_EX | LOCK_NB), 0);
  // The last checkpoint resumes (NVMe offload again) to the uninterrupted run's weights.
  auto resumed =
      run_job(cat({"--root", dir / "b", "--out", dir / "b/w", "--resume", ckpt}, common));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  std::vector<std::string> left;
  for (const auto& run : std::filesystem::directory_iterator(dir / "nvme")) {
    left.push_back(run.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"volt-nvme-1-1"}))
      << "the dead run's folder is swept, the live one stays";
  ::close(live_fd);
  for (int r = 0; r < 2; ++r) {
    const std::string suffix = ".rank" + std::to_string(r) + ".pt";
    EXPECT_TRUE(torch::equal(load_flat(dir / ("a/w" + suffix)), load_flat(dir / ("b/w" + suffix))))
        << "rank " << r;
  }
}

TEST(DeepSpeedNvme, AJsonConfiguredRunWithSchedulerAndClippingEqualsItsInMemoryTwinBitwise) {
  VOLT_REQUIRE_GLOO();
  // The JSON's optimizer (FusedAdamW), WarmupDecayLR stepped after every optimizer step and
  // gradient clipping by norm, stage 3, the optimizer state and the parameter chunks on NVMe:
  // swapping sub-group by sub-group changes none of it.
  volt_test::TempDir dir;
  std::filesystem::create_directories(dir / "nvme");
  const std::string body = R"("train_micro_batch_size_per_gpu": 8, "gradient_clipping": 0.05,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.001,
        "warmup_max_lr": 0.01, "warmup_num_steps": 3, "total_num_steps": 8}},)";
  const std::string mem = "{" + body + R"("zero_optimization": {"stage": 3}})";
  const std::string nvme = "{" + body + R"("zero_optimization": {"stage": 3,
      "sub_group_size": 50, "offload_param": {"device": "nvme"},
      "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                           dir / "nvme" + R"("}}, "aio": {"block_size": 128, "queue_depth": 4}})";
  const std::vector<std::string> common{"--devices",   "2",    "--batch", "8", "--epochs", "1",
                                        "--optimizer", "none", "--width", "16"};
  auto a = run_job(cat({"--root", dir.path, "--out", dir / "mem", "--ds-config", mem}, common));
  ASSERT_EQ(a.code, 0) << a.output;
  auto b =
      run_job(cat({"--root", dir.path, "--out", dir / "nvme_run", "--ds-config", nvme}, common));
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_NE(b.output.find("optimizer state swaps to"), std::string::npos) << b.output;
  for (int r = 0; r < 2; ++r) {
    const std::string suffix = ".rank" + std::to_string(r) + ".pt";
    EXPECT_TRUE(
        torch::equal(load_flat(dir / ("mem" + suffix)), load_flat(dir / ("nvme_run" + suffix))))
        << "rank " << r;
    // The JSON-built optimizer's state is in the file, not in RAM (0 before each step).
    const Line swapped = zero_line(b.output, r);
    EXPECT_EQ(swapped.state, 0) << b.output;
    EXPECT_NEAR(swapped.nvme, 8 * swapped.numel / 2, 0.05 * 8 * swapped.numel / 2);
    EXPECT_NE(b.output.find("params_in_files=" +
                            std::to_string(4 * static_cast<int64_t>(swapped.numel) / 2)),
              std::string::npos)
        << b.output;
  }
  EXPECT_NE(b.output.find("parameter chunks swap to"), std::string::npos) << b.output;
  EXPECT_TRUE(empty_dir(dir / "nvme"));
}

// ------------------------------------------------------------------------------ options

using volt_test::expect_deepspeed_error;
using volt_test::make_deepspeed;

TEST(DeepSpeedNvme, BadNvmePathsAndAioOptionsAreConfigErrorsNamingThePath) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  using O = volt::DeepSpeedStrategyOptions;
  const O nvme = O().offload_optimizer(true).offload_optimizer_device("nvme");
  expect_deepspeed_error<volt::ConfigError>(O(nvme).nvme_path(dir / "missing"),
                                            "nvme_path='" + dir / "missing" + "' does not exist");
  std::ofstream(dir / "file") << "x";
  expect_deepspeed_error<volt::ConfigError>(O(nvme).nvme_path(dir / "file"), "is not a folder");
  expect_deepspeed_error<volt::ConfigError>(O(nvme).nvme_path(dir.path).sub_group_size(0),
                                            "sub_group_size=0");
  expect_deepspeed_error<volt::ConfigError>(O(nvme).nvme_path(dir.path).aio_queue_depth(0),
                                            "aio_queue_depth=0");
  // Without NVMe offload the sizes mean nothing yet, but a negative one is still refused (it
  // would fail only once offload is switched on), as is a negative head count for tensor
  // parallelism that is off.
  expect_deepspeed_error<volt::ConfigError>(O().sub_group_size(-7), "sub_group_size=-7");
  expect_deepspeed_error<volt::ConfigError>(O().aio_block_size(0), "aio_block_size=0");
  // One block is one request: 2^32 bytes truncated to 0-byte reads ("the file ends first").
  expect_deepspeed_error<volt::ConfigError>(O().aio_block_size(int64_t{1} << 32),
                                            "aio_block_size=4294967296");
  expect_deepspeed_error<volt::ConfigError>(O().aio_queue_depth(5000), "aio_queue_depth=5000");
  expect_deepspeed_error<volt::ConfigError>(
      O().tensor_parallel(volt::TensorParallelOptions().num_heads(-7)),
      "tensor_parallel.num_heads=-7");
  expect_deepspeed_error<volt::ConfigError>(O().offload_parameters_device("disk"),
                                            "use \"cpu\" or \"nvme\"");
  const O params = O().offload_parameters(true).offload_parameters_device("nvme");
  expect_deepspeed_error<volt::ConfigError>(O(params).stage(2).nvme_path(dir.path),
                                            "needs stage 3");
  expect_deepspeed_error<volt::ConfigError>(O(params).stage(3).nvme_path(dir / "missing"),
                                            "nvme_path='" + dir / "missing" + "' does not exist");
  EXPECT_NO_THROW(make_deepspeed(O(params).stage(3).nvme_path(dir.path)));
  if (::geteuid() != 0) {  // root writes anywhere
    ASSERT_EQ(::mkdir((dir / "ro").c_str(), 0500), 0);
    expect_deepspeed_error<volt::ConfigError>(O(nvme).nvme_path(dir / "ro"), "is not writable");
  }
  EXPECT_NO_THROW(make_deepspeed(O(nvme).nvme_path(dir.path)));
}

TEST(DeepSpeedNvme, TheRegisteredNameAndTheJsonKeysReachTheOptions) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  auto& reg = volt::registry();
  volt::StrategyContext ctx{std::make_shared<volt::CpuAccelerator>(),
                            reg.precisions.create("32-true"), 2, 1};
  const auto& entry = reg.strategies.at("deepspeed_stage_3_offload_nvme");
  std::map<std::string, volt::ParamValue> v;
  for (const auto& spec : entry.params.specs()) v[spec.name] = spec.default_value;
  // The default nvme_path (/local_nvme) does not exist here: a ConfigError naming it.
  try {
    entry.make(volt::Args("strategy deepspeed_stage_3_offload_nvme", v), ctx);
    FAIL() << "a missing nvme_path was accepted";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nvme_path='/local_nvme'"), std::string::npos) << e.what();
  }
  v["nvme_path"] = dir.path;
  v["sub_group_size"] = int64_t{1000};
  auto s = std::dynamic_pointer_cast<volt::DeepSpeedStrategy>(
      entry.make(volt::Args("strategy deepspeed_stage_3_offload_nvme", v), ctx));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->deepspeed_options().stage(), 3);
  EXPECT_TRUE(s->deepspeed_options().offload_optimizer());
  EXPECT_EQ(s->deepspeed_options().offload_optimizer_device(), "nvme");
  EXPECT_EQ(s->deepspeed_options().nvme_path(), dir.path);
  EXPECT_EQ(s->deepspeed_options().sub_group_size(), 1000);
  EXPECT_TRUE(s->deepspeed_options().offload_parameters());
  EXPECT_EQ(s->deepspeed_options().offload_parameters_device(), "nvme");

  const std::string json = R"({"train_micro_batch_size_per_gpu": 8,
    "zero_optimization": {"stage": 3, "sub_group_size": 5000,
      "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                           dir.path + R"(", "pin_memory": true, "buffer_count": 4}},
    "aio": {"block_size": 262144, "queue_depth": 16, "thread_count": 1, "single_submit": false,
            "overlap_events": true}})";
  auto j = make_deepspeed(volt::DeepSpeedStrategyOptions().config(json));
  const auto& o = j->deepspeed_options();
  EXPECT_EQ(o.offload_optimizer_device(), "nvme");
  EXPECT_TRUE(o.offload_optimizer());
  EXPECT_EQ(o.nvme_path(), dir.path);
  EXPECT_EQ(o.sub_group_size(), 5000);
  EXPECT_EQ(o.aio_block_size(), 262144);
  EXPECT_EQ(o.aio_queue_depth(), 16);
  const auto& ignored = j->config()->ignored;
  for (const char* k : {"aio.thread_count", "aio.single_submit", "aio.overlap_events"}) {
    EXPECT_NE(std::find(ignored.begin(), ignored.end(), k), ignored.end()) << k;
  }
  try {
    volt::parse_deepspeed_config(R"({"aio": {"queue_dept": 4}})", "inline JSON");
    FAIL() << "a misspelt aio key was accepted";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("queue_depth"), std::string::npos) << e.what();
  }
  EXPECT_THROW(volt::parse_deepspeed_config(R"({"aio": {"block_size": 0}})", "inline JSON"),
               volt::ConfigError);
  // offload_param to nvme from JSON (its nvme_path is checked like the optimizer's).
  EXPECT_THROW(make_deepspeed(volt::DeepSpeedStrategyOptions().config(
                   R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
                       "nvme_path": ")" +
                   dir / "missing" + R"("}}})")),
               volt::ConfigError);
  auto p = make_deepspeed(volt::DeepSpeedStrategyOptions().config(
      R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": ")" +
      dir.path + R"("}}})"));
  EXPECT_TRUE(p->deepspeed_options().offload_parameters());
  EXPECT_EQ(p->deepspeed_options().offload_parameters_device(), "nvme");
  EXPECT_EQ(p->deepspeed_options().nvme_path(), dir.path);
}

// One process fits with stage 3's parameter chunks in an NVMe file, then validates and predicts.
// Those entry points set up no optimizer and keep the weights in a file too (ZeRO-Inference:
// nothing of them in memory between batches), the validation loss is fit's last one bit for
// bit, the predictions are the whole module's, and no swap file is left.
TEST(DeepSpeedNvme, AfterFitValidateAndPredictKeepTheWeightsInTheirFile) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const std::string nvme = dir / "nvme";
  std::filesystem::create_directories(nvme);
  auto strategy =
      std::make_shared<volt::DeepSpeedStrategy>(volt::DeepSpeedStrategyOptions()
                                                    .stage(3)
                                                    .offload_parameters(true)
                                                    .offload_parameters_device("nvme")
                                                    .nvme_path(nvme)
                                                    .param_persistence_threshold(0),
                                                volt::registry().accelerators.create("cpu"),
                                                volt::registry().precisions.create("32-true"), 1);
  // At each evaluation batch's end: the inference engine's bytes, and whether fc1 is released.
  struct Probe : volt::Callback {
    explicit Probe(volt::DeepSpeedStrategy* s) : strategy(s) {}
    std::string state_key() const override { return "Probe"; }
    void read(volt::Module& module) {
      const volt::ZeroEngine* e = strategy->inference_engine(module);
      if (e == nullptr) return;
      ++batches;
      in_memory = std::max(in_memory, e->memory().parameters);
      in_files = e->memory().parameters_in_files;
      auto& net = dynamic_cast<volt_test::TinyClassifier&>(module);
      released = released && net.fc1->weight.storage().nbytes() == 0;
    }
    void on_validation_batch_end(volt::RunContext&, volt::Module& m, const volt::Batch&,
                                 int64_t) override {
      read(m);
    }
    void on_predict_batch_end(volt::RunContext&, volt::Module& m, const at::Tensor&,
                              const volt::Batch&, int64_t) override {
      read(m);
    }
    volt::DeepSpeedStrategy* strategy;
    int64_t batches = 0, in_memory = 0, in_files = 0;
    bool released = true;
  };
  auto probe = std::make_shared<Probe>(strategy.get());
  volt_test::TinyClassifier model;
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(2)
                            .strategy(volt::Spec<volt::Strategy>(strategy))
                            .callbacks({probe}));
  const auto val_data = volt_test::blobs(48, 8, 5);
  const auto val = volt_test::loader(val_data, 16, /*shuffle=*/false);
  trainer.fit(model, volt_test::loader(volt_test::blobs(64)), val);
  const double fit_val_loss = trainer.callback_metrics().at("val_loss");
  EXPECT_EQ(probe->batches, 0);  // fit's validation runs on the training engine
  const volt::Metrics metrics = trainer.validate(model, val);
  EXPECT_EQ(metrics.at("val_loss"), fit_val_loss);
  EXPECT_EQ(probe->batches, 3);
  const auto predictions = trainer.predict(model, val);
  EXPECT_EQ(probe->batches, 6);
  EXPECT_EQ(probe->in_memory, 0);
  const int64_t weights = (8 * 16 + 16 + 16 * 2 + 2) * static_cast<int64_t>(sizeof(float));
  EXPECT_EQ(probe->in_files, weights);
  EXPECT_TRUE(probe->released);
  // The module is whole again: its own forward gives the predictions.
  model.eval();
  torch::NoGradGuard no_grad;
  ASSERT_EQ(predictions.size(), 3u);
  EXPECT_TRUE(torch::equal(torch::cat(predictions), model.forward(val_data->inputs()).argmax(1)));
  EXPECT_TRUE(empty_dir(nvme));
}

}  // namespace
