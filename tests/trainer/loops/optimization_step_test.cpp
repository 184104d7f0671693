// The optimization step: gradient sync only on the stepping micro-batch, and a step the
// precision skipped advances neither the global step nor the schedulers.
#include <gtest/gtest.h>

#include "lr_at_end.h"
#include "tiny.h"

namespace {

using volt_test::LrAtEnd;
using volt_test::quiet;
using volt_test::TinyClassifier;

// A real single-device strategy that records the sync flag of every backward.
class RecordingStrategy : public volt::SingleDeviceStrategy {
 public:
  RecordingStrategy()
      : volt::SingleDeviceStrategy(c10::Device(c10::kCPU), std::make_shared<volt::CpuAccelerator>(),
                                   std::make_shared<volt::Fp32Precision>()) {}
  void backward(const at::Tensor& loss, volt::Module& module, bool sync_gradients) override {
    syncs.push_back(sync_gradients);
    volt::SingleDeviceStrategy::backward(loss, module, sync_gradients);
  }
  std::vector<bool> syncs;
};

TEST(OptimizationStep, SyncsGradientsOnlyOnTheSteppingMicroBatch) {
  volt_test::TempDir dir;
  TinyClassifier model;
  auto strategy = std::make_shared<RecordingStrategy>();
  // 7 batches per epoch, accumulating 3: steps after batches 3, 6 and the epoch's last (7).
  volt::Trainer trainer(
      quiet(dir.path).max_epochs(1).accumulate_grad_batches(3).strategy(strategy));
  trainer.fit(model, volt_test::loader(volt_test::blobs(112), 16));
  EXPECT_EQ(strategy->syncs, (std::vector<bool>{false, false, true, false, false, true, true}));
  EXPECT_EQ(trainer.state().global_step, 3);
}

// fp32 weights, but optimizer steps listed in `skip` (0-based attempt numbers) are skipped as a
// loss-scaling precision skips steps with inf gradients.
class SkippingPrecision : public volt::Fp32Precision {
 public:
  explicit SkippingPrecision(std::set<int64_t> skip) : skip_(std::move(skip)) {}
  bool optimizer_step(torch::optim::Optimizer& optimizer) override {
    const bool skipped = skip_.count(attempts_++) > 0;
    if (skipped) return false;
    return volt::Fp32Precision::optimizer_step(optimizer);
  }

 private:
  std::set<int64_t> skip_;
  int64_t attempts_ = 0;
};

TEST(OptimizationStep, SkippedStepAdvancesNeitherGlobalStepNorSchedulers) {
  volt_test::TempDir dir;
  TinyClassifier model(8, 0.1);
  model.scheduler_step_size = 1;  // StepLR(step_size=1, gamma=0.5) after every optimizer step
  model.scheduler_interval = volt::Interval::kStep;
  auto precision = std::make_shared<SkippingPrecision>(std::set<int64_t>{1, 2});
  auto lr = std::make_shared<LrAtEnd>();
  volt::Trainer trainer(quiet(dir.path).max_epochs(1).precision(precision).callbacks({lr}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(96), 16));  // 6 batches, 2 skipped
  EXPECT_EQ(trainer.state().total_batches_done, 6);
  EXPECT_EQ(trainer.state().global_step, 4);
  EXPECT_DOUBLE_EQ(lr->lr, 0.1 * 0.5 * 0.5 * 0.5 * 0.5);  // four real steps, four halvings
}

}  // namespace
