// fp8 inference on real data, the reference's two-process flow through the volt binary: train the
// Fashion-MNIST MLP, measure over part of the data in one process (predict), quantize in another
// (test) and compare its accuracy with bf16-mixed; then the ways the second step can be misused.
#include <gtest/gtest.h>

#include <volt/volt.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>

#include "build_paths.h"
#include "processes.h"
#include "tiny.h"

namespace {

using namespace std::chrono_literals;

struct Run {
  int code;
  std::string out;
};

Run volt_cli(const std::vector<std::string>& args,
             const std::map<std::string, std::string>& env = {}) {
  volt_test::Process p(volt_test::cli_binary(), args, env);
  const int code = p.exit_code(600s);
  return {code, p.output()};
}

double metric(const std::string& out, const std::string& name) {
  std::smatch m;
  const std::regex re(name + R"(\s*[:=]?\s*([0-9.]+))");
  if (!std::regex_search(out, m, re)) return -1;
  return std::stod(m[1]);
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

}  // namespace

TEST(Fp8InferenceCli, MeasureThenQuantizeInAnotherProcessKeepsAccuracyWithinOnePointOfBf16) {
  if (!std::ifstream(std::string(volt::kFashionMnistDefaultRoot) + "/train-images-idx3-ubyte.gz")
           .good()) {
    GTEST_SKIP() << "dataset-fashion-mnist not installed (scripts/setup.sh)";
  }
  volt_test::TempDir dir;
  const std::vector<std::string> common = {
      "--config", volt_test::source_dir() + "/configs/fashion_mnist_mlp.yaml",
      "--trainer.default_root_dir=" + dir.path, "--trainer.enable_progress_bar=false",
      "--trainer.accelerator=cpu"};  // the CPU emulation of fp8 (a CUDA build would pick cuda)
  auto with = [&](const char* cmd, std::vector<std::string> extra) {
    std::vector<std::string> a{cmd};
    a.insert(a.end(), common.begin(), common.end());
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  // 1. Train (1 epoch, ~85% accuracy) and keep the weights.
  auto fit = volt_cli(with("fit", {"--trainer.max_epochs=1", "--trainer.limit_val_batches=2"}));
  ASSERT_EQ(fit.code, 0) << fit.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(fit.out, m, std::regex(R"(last checkpoint: (\S+))"))) << fit.out;
  const std::string ckpt = m[1];

  // 2. The bf16 baseline.
  auto bf16 = volt_cli(with("test", {"--ckpt_path=" + ckpt, "--trainer.precision=bf16-mixed"}));
  ASSERT_EQ(bf16.code, 0) << bf16.out;
  const double acc16 = metric(bf16.out, "test_acc");

  // 3. Measure over 20 batches of the predict data (config from the option).
  write(dir / "measure.json",
        R"({"method": "HOOKS", "mode": "MEASURE", "observer": "maxabs", "dump_stats_path": ")" +
            (dir / "stats") + R"("})");
  auto measure = volt_cli(
      with("predict", {"--ckpt_path=" + ckpt, "--trainer.precision=fp8",
                       "--trainer.precision.init_args.inference=true",
                       "--trainer.precision.init_args.quant_config=" + (dir / "measure.json"),
                       "--trainer.limit_predict_batches=20"}));
  ASSERT_EQ(measure.code, 0) << measure.out;
  ASSERT_TRUE(std::ifstream(dir / "stats.json").good()) << measure.out;

  // 4. Quantize in a new process (config from QUANT_CONFIG) and test.
  write(dir / "quant.json", R"({"mode": "QUANTIZE", "scale_method": "maxabs_hw",
      "dump_stats_path": ")" + (dir / "stats") +
                                R"("})");
  const std::vector<std::string> quant_args = {"--ckpt_path=" + ckpt, "--trainer.precision=fp8",
                                               "--trainer.precision.init_args.inference=true",
                                               "--trainer.precision.init_args.quant=true"};
  auto quant = volt_cli(with("test", quant_args), {{"QUANT_CONFIG", dir / "quant.json"}});
  ASSERT_EQ(quant.code, 0) << quant.out;
  const double acc8 = metric(quant.out, "test_acc");
  std::printf(
      "[ measured ] Fashion-MNIST MLP test accuracy: bf16-mixed %.2f%%, fp8 quantized "
      "(emulated E4M3) %.2f%%\n",
      acc16 * 100, acc8 * 100);
  EXPECT_GT(acc16, 0.80);
  EXPECT_NEAR(acc8, acc16, 0.01);
  EXPECT_NE(quant.out.find("3 Linear layers in fp8"), std::string::npos) << quant.out;

  // 5. Misuse. Measurements from another model (a different hidden size): a clear error.
  auto other = volt_cli(
      with("test", {"--model.init_args.hidden=[128]", "--trainer.precision=fp8",
                    "--trainer.precision.init_args.inference=true",
                    "--trainer.precision.init_args.quant=true", "--trainer.limit_test_batches=1"}),
      {{"QUANT_CONFIG", dir / "quant.json"}});
  // A ConfigError raised by the run: bad config all the same, exit 2 (1 before session 34).
  EXPECT_EQ(other.code, 2) << other.out;
  EXPECT_NE(other.out.find("which this model does not have: it was measured on another model"),
            std::string::npos)
      << other.out;
  // A malformed config: exit 2 before anything runs.
  write(dir / "bad.json", R"({"mode": "QUANTIZE", "dump_stats_path": )");
  auto bad = volt_cli(with("test", quant_args), {{"QUANT_CONFIG", dir / "bad.json"}});
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("bad.json\": malformed JSON"), std::string::npos) << bad.out;
  // Mode and quant disagree: exit 2.
  auto disagree = volt_cli(with("test", quant_args), {{"QUANT_CONFIG", dir / "measure.json"}});
  EXPECT_EQ(disagree.code, 2) << disagree.out;
  EXPECT_NE(disagree.out.find("has mode MEASURE but quant=true asks for QUANTIZE"),
            std::string::npos)
      << disagree.out;
}
