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
  // float64's GEMMs are OpenBLAS's, as fp32's: volt's choice.
  EXPECT_EQ(during("64-true"), fp32_default > 0 ? fp32_default : 2);
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

// The default follows the precision's compute dtype, not its name: a user's own precision
// objects get the same choice as the built-in ones they compute like.
class RenamedHalf : public volt::HalfPrecision {
 public:
  std::string name() const override { return "team-bf16"; }
};
class PlainFp32 : public volt::Precision {
 public:
  std::string name() const override { return "team-fp32"; }
};

TEST(Threads, TheDefaultFollowsACustomPrecisionsComputeDtype) {
  volt_test::TempDir dir;
  at::set_num_threads(2);
  const auto during = [&](std::shared_ptr<volt::Precision> precision) {
    volt_test::TinyClassifier model;
    auto probe = std::make_shared<ThreadProbe>();
    volt::Trainer trainer(
        volt_test::quiet(dir.path).max_epochs(1).precision(precision).callbacks({probe}));
    trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
    EXPECT_EQ(at::get_num_threads(), 2);
    return probe->during;
  };
  EXPECT_EQ(std::make_shared<RenamedHalf>()->compute_dtype(), c10::kBFloat16);
  EXPECT_EQ(during(std::make_shared<RenamedHalf>()), 2);
  const int64_t fp32_default = volt::default_num_threads();
  EXPECT_EQ(during(std::make_shared<PlainFp32>()), fp32_default > 0 ? fp32_default : 2);
  // fp8's emulation multiplies in fp32 (OpenBLAS): the fp32 choice.
  EXPECT_EQ(volt::Fp8Precision().compute_dtype(), c10::kFloat);
  EXPECT_EQ(volt::MixedPrecision(volt::MixedPrecisionOptions().dtype("fp16")).compute_dtype(),
            c10::kHalf);
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
