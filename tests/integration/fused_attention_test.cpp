// FusedSDPA inside a real training run: a transformer over Fashion-MNIST image rows trains the
// same with the fused kernel as with the plain composition, and learns.
#include <gtest/gtest.h>

#include <fstream>

#include "models.h"
#include "tiny.h"

namespace {

bool have_data() {
  return std::ifstream(std::string(volt::kFashionMnistDefaultRoot) + "/train-images-idx3-ubyte.gz")
      .good();
}

TEST(FusedAttentionTraining, FusedAndReferenceAttentionTrainIdentically) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist not installed (scripts/setup.sh)";
  volt::FashionMnist data(volt::kFashionMnistDefaultRoot, volt::FashionMnist::Split::kTrain);
  torch::manual_seed(11);
  auto fused = std::make_shared<volt_examples::TransformerNet>(64, 4, 2, true, 0.1);
  auto ref = std::make_shared<volt_examples::TransformerNet>(64, 4, 2, false, 0.1);
  {
    torch::NoGradGuard no_grad;
    auto src = fused->parameters();
    auto dst = ref->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }
  torch::optim::AdamW opt_f(fused->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::optim::AdamW opt_r(ref->parameters(), torch::optim::AdamWOptions(1e-3));
  double first = 0, last = 0;
  for (int step = 0; step < 25; ++step) {
    auto x = data.inputs().slice(0, step * 64, (step + 1) * 64);
    auto y = data.targets().slice(0, step * 64, (step + 1) * 64);
    torch::manual_seed(100 + step);  // the same dropout seeds on both sides
    auto loss_f = torch::cross_entropy_loss(fused->forward(x), y);
    torch::manual_seed(100 + step);
    auto loss_r = torch::cross_entropy_loss(ref->forward(x), y);
    ASSERT_NEAR(loss_f.item<double>(), loss_r.item<double>(), 2e-4) << "step " << step;
    opt_f.zero_grad();
    opt_r.zero_grad();
    loss_f.backward();
    loss_r.backward();
    opt_f.step();
    opt_r.step();
    if (step == 0) first = loss_f.item<double>();
    last = loss_f.item<double>();
  }
  EXPECT_LT(last, first);  // it is learning, not just agreeing
  auto pf = fused->parameters();
  auto pr = ref->parameters();
  for (size_t i = 0; i < pf.size(); ++i) {
    EXPECT_LT((pf[i] - pr[i]).abs().max().item<double>(), 1e-3) << "parameter " << i;
  }
}

TEST(FusedAttentionTraining, TransformerWithFusedAttentionLearnsFashionMnist) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist not installed (scripts/setup.sh)";
  volt_test::TempDir dir;
  volt::seed_everything(42);
  volt_examples::FashionMnistData dm(volt::kFashionMnistDefaultRoot, 64, 1, 42);
  volt_examples::Classifier<volt_examples::TransformerNet> model(
      std::make_shared<volt_examples::TransformerNet>(), 2e-3);
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(1)
                            .limit_train_batches(volt::Limit(int64_t{200}))
                            .limit_val_batches(volt::Limit(int64_t{2}))
                            .limit_test_batches(volt::Limit(int64_t{4})));
  trainer.fit(model, dm);
  auto m = trainer.test(model, dm);
  std::printf("transformer (fused attention) test accuracy after 200 steps: %.2f%%\n",
              m.at("test_acc") * 100);
  EXPECT_GE(m.at("test_acc"), 0.70);
}

}  // namespace
