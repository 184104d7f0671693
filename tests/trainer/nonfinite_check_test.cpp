// NonfiniteLossCheck (the Trainer's detect_nonfinite_loss) on real loss tensors: it reads the
// host once per interval, names the first bad loss of the interval, caps the records between
// reads, and checks what it holds before taking losses of another dtype.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>

#include "trainer/detail/nonfinite_check.h"
#include "volt/core/errors.h"

namespace {

using volt::detail::NonfiniteLossCheck;

std::string record_error(NonfiniteLossCheck& check, const torch::Tensor& loss, int64_t step) {
  try {
    check.record(loss, {step, 0, step});
  } catch (const volt::ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(NonfiniteLossCheck, ReadsOncePerIntervalAndNamesTheFirstBadLossInIt) {
  NonfiniteLossCheck check(4);
  for (int64_t s = 0; s < 8; ++s) EXPECT_EQ(record_error(check, torch::tensor(0.5f * s), s), "");
  EXPECT_EQ(check.reads(), 2);
  EXPECT_EQ(check.pending(), 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(record_error(check, torch::tensor(1.0f), 8), "");
  EXPECT_EQ(record_error(check, torch::tensor(inf), 9), "");  // not read yet
  EXPECT_EQ(record_error(check, torch::tensor(nan), 10), "");
  const std::string msg = record_error(check, torch::tensor(2.0f), 11);
  EXPECT_NE(msg.find("the training loss is inf at global step 9 (epoch 0, batch 9) (found at "
                     "global step 11"),
            std::string::npos)
      << msg;
  EXPECT_EQ(check.reads(), 3);
  EXPECT_EQ(check.pending(), 0);  // the interval is consumed: the next one starts clean
  EXPECT_EQ(record_error(check, torch::tensor(1.0f), 12), "");
  EXPECT_NO_THROW(check.check());
}

TEST(NonfiniteLossCheck, EveryOneIsAPlainPerStepCheck) {
  NonfiniteLossCheck check(1);
  EXPECT_EQ(record_error(check, torch::tensor(1.0), 0), "");
  const std::string msg =
      record_error(check, torch::tensor(std::numeric_limits<double>::quiet_NaN()), 1);
  EXPECT_NE(msg.find("is nan at global step 1 (epoch 0, batch 1);"), std::string::npos) << msg;
  EXPECT_EQ(check.reads(), 2);
}

TEST(NonfiniteLossCheck, CapsTheRecordsBetweenReadsAndFollowsTheLossDtype) {
  NonfiniteLossCheck check(1000000);
  for (int64_t s = 0; s < NonfiniteLossCheck::kMaxPending; ++s) {
    check.record(torch::tensor(1.0f, torch::requires_grad()) * 2, {s, 0, s});
  }
  EXPECT_EQ(check.reads(), 1);
  // A bf16 loss after float ones: the float ones are checked first, then bf16 is buffered.
  check.record(torch::tensor(1.0f), {0, 0, 0});
  check.record(torch::tensor(3.0f).to(torch::kBFloat16), {1, 0, 1});
  EXPECT_EQ(check.reads(), 2);
  EXPECT_EQ(check.pending(), 1);
  check.record(torch::tensor(std::numeric_limits<float>::infinity()).to(torch::kBFloat16),
               {2, 0, 2});
  try {
    check.check();
    FAIL() << "an infinite bf16 loss passed";
  } catch (const volt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("inf at global step 2"), std::string::npos) << e.what();
  }
}

}  // namespace
