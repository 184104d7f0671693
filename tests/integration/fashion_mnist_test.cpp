// Acceptance on real data: the MLP demo model reaches >= 87% test accuracy on Fashion-MNIST.
#include <gtest/gtest.h>

#include <fstream>

#include "models.h"
#include "tiny.h"

namespace {

TEST(FashionMnistAcceptance, MlpReaches87Percent) {
  if (!std::ifstream(std::string(volt::kFashionMnistDefaultRoot) + "/train-images-idx3-ubyte.gz")
           .good()) {
    GTEST_SKIP() << "dataset-fashion-mnist not installed (scripts/setup.sh)";
  }
  volt_test::TempDir dir;
  volt_examples::FashionMnistData dm(volt::kFashionMnistDefaultRoot, 64, 1, 42);
  volt_examples::Classifier<volt_examples::MlpNet> model(
      std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{256, 128}), 1e-3, 4);
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(6).enable_checkpointing(true));
  trainer.fit(model, dm);
  auto m = trainer.test(model, dm);
  std::printf("MLP test accuracy after 6 epochs: %.2f%%\n", m.at("test_acc") * 100);
  EXPECT_GE(m.at("test_acc"), 0.87);
}

TEST(FashionMnistAcceptance, Bf16MixedLossCurveTracksFp32) {
  if (!std::ifstream(std::string(volt::kFashionMnistDefaultRoot) + "/train-images-idx3-ubyte.gz")
           .good()) {
    GTEST_SKIP() << "dataset-fashion-mnist not installed (scripts/setup.sh)";
  }
  // Same seed, data order and initial weights; the only difference is bf16 autocast. Stated
  // tolerance: each epoch's validation loss within 0.03 of fp32, test accuracy within 1 point.
  // The CPU policy is off: it keeps the GEMMs in fp32 where its probe finds bf16 slower (every
  // size at one thread on this machine), and the fit would then be fp32's, bit for bit.
  auto run = [](const volt::Spec<volt::Precision>& precision, std::vector<double>& val_losses) {
    volt_test::TempDir dir;
    volt_examples::FashionMnistData dm(volt::kFashionMnistDefaultRoot, 64, 1, 42);
    torch::manual_seed(5);
    volt_examples::Classifier<volt_examples::MlpNet> model(
        std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{256, 128}), 1e-3);
    auto mem = std::make_shared<volt_test::MemoryLogger>();
    volt::Trainer trainer(
        volt_test::quiet(dir.path).max_epochs(2).precision(precision).loggers({mem}));
    trainer.fit(model, dm);
    for (const auto& r : mem->with("val_loss")) val_losses.push_back(r.second.at("val_loss"));
    return trainer.test(model, dm).at("test_acc");
  };
  std::vector<double> l32, l16;
  const double a32 = run("32-true", l32);
  const double a16 = run(std::make_shared<volt::MixedPrecision>(
                             volt::MixedPrecisionOptions().cpu_policy(false).read_env_lists(false)),
                         l16);
  ASSERT_EQ(l32.size(), 2u);
  ASSERT_EQ(l16.size(), 2u);
  EXPECT_NE(l16, l32);  // bf16 computed something: the comparison is not fp32 with itself
  for (size_t e = 0; e < l32.size(); ++e) {
    std::printf("epoch %zu val_loss: fp32 %.4f, bf16-mixed %.4f\n", e, l32[e], l16[e]);
    EXPECT_NEAR(l16[e], l32[e], 0.03);
  }
  std::printf("test accuracy: fp32 %.2f%%, bf16-mixed %.2f%%\n", a32 * 100, a16 * 100);
  EXPECT_NEAR(a16, a32, 0.01);
  EXPECT_GE(a16, 0.84);
}

}  // namespace
