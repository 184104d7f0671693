// Thread settings are scoped to a Trainer entry point and restored after it.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <memory>
#include <string>

#include "tiny.h"

namespace {

class ThreadProbe : public volt::Callback {
 public:
  std::string state_key() const override { return "ThreadProbe"; }
  void on_train_start(volt::RunContext&, volt::Module&) override { during = at::get_num_threads(); }
  int during = -1;
};

TEST(Threads, TrainerSetsThreadsOnlyForTheRunAndRestoresThem) {
  volt_test::TempDir dir;
  at::set_num_threads(2);
  volt_test::TinyClassifier model;
  auto probe = std::make_shared<ThreadProbe>();
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1).num_threads(1).callbacks({probe}));
  EXPECT_EQ(at::get_num_threads(), 2);  // constructing a Trainer changes nothing
  trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(probe->during, 1);
  EXPECT_EQ(at::get_num_threads(), 2);
}

// The default (num_threads 0): volt's fp32 choice under 32-true, libtorch's own count under
// bf16-mixed and bf16-true, whose GEMMs run in oneDNN, not OpenBLAS (on the 2-CPU machine the
// fp32 choice of 1 thread halved a bf16-mixed GPT-2 fit).
TEST(Threads, TheDefaultKeepsLibtorchsCountUnderBf16Precisions) {
  volt_test::TempDir dir;
  at::set_num_threads(2);
  const auto during = [&](const std::string& precision) {
    volt_test::TinyClassifier model;
    auto probe = std::make_shared<ThreadProbe>();
    volt::Trainer trainer(
        volt_test::quiet(dir.path).max_epochs(1).precision(precision).callbacks({probe}));
    trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
    EXPECT_EQ(at::get_num_threads(), 2) << precision;
    return probe->during;
  };
  const int64_t fp32_default = volt::default_num_threads();
  EXPECT_EQ(during("32-true"), fp32_default > 0 ? fp32_default : 2);
  EXPECT_EQ(during("bf16-mixed"), 2);
  EXPECT_EQ(during("bf16-true"), 2);
  // An explicit count wins under any precision.
  volt_test::TinyClassifier model;
  auto probe = std::make_shared<ThreadProbe>();
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(1)
                            .precision("bf16-mixed")
                            .num_threads(1)
                            .callbacks({probe}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
  EXPECT_EQ(probe->during, 1);
}

TEST(Threads, RestoredWhenTheRunFails) {
  volt_test::TempDir dir;
  at::set_num_threads(2);
  volt_test::TinyClassifier model;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1).num_threads(1));
  EXPECT_THROW(trainer.test(model, volt_test::loader(volt_test::blobs(32)), "/nonexistent.ckpt"),
               volt::CheckpointError);
  EXPECT_EQ(at::get_num_threads(), 2);
}

TEST(Threads, ScopeRestoresThePreviousCount) {
  at::set_num_threads(2);
  {
    volt::IntraOpThreads scope(1);
    EXPECT_EQ(scope.count(), 1);
    EXPECT_EQ(at::get_num_threads(), 1);
  }
  EXPECT_EQ(at::get_num_threads(), 2);
}

}  // namespace
