// Batch::size: the samples that weight epoch-level means, as Lightning's extract_batch_size
// counts them.

#include <torch/torch.h>

#include <gtest/gtest.h>

#include "volt/core/batch.h"

namespace {

TEST(Batch, SizeCountsTheSamplesOfTheFirstTensorThereIs) {
  volt::Batch plain;
  plain.input = torch::zeros({5, 3});
  plain.target = torch::zeros({5});
  EXPECT_EQ(plain.size(), 5);
  // A 0-dim input is one sample (it counted 0: every on_epoch mean of such a run was 0).
  volt::Batch scalar;
  scalar.input = torch::tensor(3.0);
  EXPECT_EQ(scalar.size(), 1);
  // Data held in extra entries only (a custom collate's "input_ids"): the first by name.
  volt::Batch named;
  named.extra["input_ids"] = torch::zeros({4, 7}, torch::kLong);
  named.extra["mask"] = torch::zeros({9, 7});
  EXPECT_EQ(named.size(), 4);
  volt::Batch target_only;
  target_only.target = torch::zeros({6});
  EXPECT_EQ(target_only.size(), 6);
  // A combined batch: its parts' samples, summed.
  volt::Batch combined;
  combined.extra["a/input"] = torch::zeros({2, 3});
  combined.extra["b/input"] = torch::zeros({3, 3});
  EXPECT_EQ(combined.size(), 5);
  EXPECT_EQ(volt::Batch{}.size(), 0);
}

}  // namespace
