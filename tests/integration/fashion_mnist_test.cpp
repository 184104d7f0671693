// Acceptance on real data: the MLP demo model reaches >= 87% test accuracy on Fashion-MNIST.
#include <gtest/gtest.h>

#include <fstream>

#include "models.h"
#include "tiny.h"

namespace {

TEST(FashionMnistAcceptance, MlpReaches87Percent) {
  if (!std::ifstream(std::string(volt::kFashionMnistDefaultRoot) + "/train-images-idx3-ubyte.gz").good()) {
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

}  // namespace
