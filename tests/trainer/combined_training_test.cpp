// Training on a combined loader (Lightning's CombinedLoader / a dict of training loaders): the
// Trainer feeds each combined batch to training_step, and a fit resumed mid-epoch ends as the
// uninterrupted one. The loader itself: tests/data/combined_loader_test.cpp.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "log_capture.h"
#include "save_at.h"
#include "tiny.h"

namespace {

using volt::CombineMode;

// Two data sets of the same task: 5 shuffled batches of 8 and 12 (the second with workers).
volt::DataLoader two_sources(CombineMode mode) {
  return volt::combined_loader({{"small", volt_test::loader(volt_test::blobs(40, 8, 1), 8)},
                                {"large", volt_test::loader(volt_test::blobs(96, 8, 2), 8,
                                                            /*shuffle=*/true, /*workers=*/2)}},
                               mode);
}

/// The sum of the classification losses of the batch's parts (Lightning's multi-source step).
class TwoSources : public volt_test::TinyClassifier {
 public:
  torch::Tensor loss_of(const volt::Batch& b) {
    torch::Tensor loss = torch::zeros({});
    for (const auto& name : b.part_names()) {
      const volt::Batch part = b.part(name);
      loss = loss + torch::cross_entropy_loss(forward(part.input), part.target);
    }
    return loss;
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    ++steps;
    sizes.push_back(b.size());
    auto loss = loss_of(b);
    log("train_loss", loss);
    return loss;
  }
  torch::Tensor predict_step(const volt::Batch& b, int64_t) override {
    return b.part("small").target;
  }
  int64_t steps = 0;
  std::vector<int64_t> sizes;
};

// Two modules with the same initial weights and no dropout (no random numbers to line up).
struct Twins {
  static std::unique_ptr<TwoSources> make() {
    torch::manual_seed(0);
    auto m = std::make_unique<TwoSources>();
    m->drop->options.p(0.0);
    return m;
  }
  std::unique_ptr<TwoSources> first = make(), second = make();
};

TEST(CombinedTraining, FitTrainsOnEveryPartAsAHandWrittenLoop) {
  for (CombineMode mode : {CombineMode::kMaxSizeCycle, CombineMode::kMaxSize}) {
    volt_test::TempDir dir;
    Twins twins;
    TwoSources &fitted = *twins.first, &by_hand = *twins.second;
    const auto train = two_sources(mode);

    volt::Trainer(volt_test::quiet(dir.path).max_epochs(2)).fit(fitted, train);
    EXPECT_EQ(fitted.steps, 2 * 12);  // the larger loader's batches, each epoch
    // With max_size the small loader's parts stop after its 5 batches (5 × 8 samples fewer).
    EXPECT_EQ(fitted.sizes.back(), mode == CombineMode::kMaxSize ? 8 : 16);

    // The same steps written out: SGD(0.1, momentum 0.9) over the same combined batches.
    by_hand.train();
    torch::optim::SGD opt(by_hand.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      volt::Batch b;
      for (auto s = train.stream(epoch); s.next(b);) {
        opt.zero_grad();
        by_hand.loss_of(b).backward();
        opt.step();
      }
    }
    EXPECT_TRUE(torch::equal(fitted.flat_params(), by_hand.flat_params())) << mode;
  }
}

TEST(CombinedTraining, TheTracedStepTakesCombinedBatches) {
  // A combined batch's parts are extra tensors, which the traced step passes as inputs: the fit
  // replays its traces and ends where the eager fit ends, to the fused arithmetic's round-off.
  // With max_size the batches lose the small part when it runs out: a second layout of the
  // batch, traced as well (a trace rebuilds the batch in its layout).
  for (CombineMode mode : {CombineMode::kMaxSizeCycle, CombineMode::kMaxSize}) {
    volt_test::TempDir dir;
    Twins twins;
    TwoSources &eager = *twins.first, &traced = *twins.second;
    volt::Trainer(volt_test::quiet(dir.path).max_epochs(2)).fit(eager, two_sources(mode));
    const auto lines = volt_test::capture_logs([&] {
      volt::Trainer(volt_test::quiet(dir.path).max_epochs(2).trace_training_step(true))
          .fit(traced, two_sources(mode));
    });
    int64_t traces = 0, eagerly = 0;
    for (const auto& l : lines) {
      traces += l.find("trace of 'training_step'") != std::string::npos;
      eagerly += l.find("running training_step eagerly") != std::string::npos;
    }
    EXPECT_EQ(traces, mode == CombineMode::kMaxSize ? 2 : 1) << mode;
    EXPECT_EQ(eagerly, 0) << mode;
    EXPECT_LT((eager.flat_params() - traced.flat_params()).abs().max().item<double>(), 1e-5)
        << mode;
  }
}

TEST(CombinedTraining, AFitResumedMidEpochEndsAsTheUninterruptedOne) {
  // Saved at epoch 1's batch 7: the small loader is in its second pass there, the large
  // loader's workers mid-way; dropout makes the result depend on the restored generator too.
  volt_test::TempDir dir;
  const std::string ckpt = dir / "mid.ckpt";
  torch::manual_seed(0);
  TwoSources whole;
  volt::Trainer(volt_test::quiet(dir.path).max_epochs(2).callbacks(
                    {std::make_shared<volt_test::SaveAt>(1, 7, ckpt)}))
      .fit(whole, two_sources(CombineMode::kMaxSizeCycle));

  torch::manual_seed(99);  // other initial weights: the checkpoint's replace them
  TwoSources resumed;
  volt::Trainer(volt_test::quiet(dir.path).max_epochs(2))
      .fit(resumed, two_sources(CombineMode::kMaxSizeCycle), c10::nullopt, ckpt);
  EXPECT_EQ(resumed.steps, 12 - 8);  // batches 8..11 of epoch 1
  EXPECT_TRUE(torch::equal(whole.flat_params(), resumed.flat_params()));
}

TEST(CombinedTraining, EvaluationAndPredictionTakeACombinedLoader) {
  volt_test::TempDir dir;
  TwoSources m;
  const auto c = two_sources(CombineMode::kMinSize);
  const auto out = volt::Trainer(volt_test::quiet(dir.path)).predict(m, c);
  ASSERT_EQ(out.size(), 5u);  // min_size: the small loader's batches
  std::vector<at::Tensor> small;
  volt::Batch b;
  for (auto s = volt_test::loader(volt_test::blobs(40, 8, 1), 8).stream(0); s.next(b);) {
    small.push_back(b.target);
  }
  EXPECT_TRUE(torch::equal(torch::cat(out), torch::cat(small)));
}

TEST(CombinedTraining, ADatasetsDataModuleCombinesItsNamedTrainingSets) {
  volt_test::TempDir dir;
  TwoSources model;
  volt::DatasetsDataModule data(volt::StageDatasets()
                                    .train("small", volt_test::blobs(40, 8, 1))
                                    .train("large", volt_test::blobs(96, 8, 2))
                                    .val(volt_test::blobs(32, 8, 3))
                                    .val(volt_test::blobs(16, 8, 4)),
                                volt::DataLoaderOptions(8));
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1));
  trainer.fit(model, data);
  EXPECT_EQ(model.steps, 12);  // the larger set's batches
  EXPECT_EQ(model.sizes.front(), 16);
  EXPECT_EQ(trainer.callback_metrics().count("val_acc/dataloader_idx_1"), 1u);
}

}  // namespace
