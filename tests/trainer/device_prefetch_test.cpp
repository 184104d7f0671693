// DataLoaderOptions::prefetch_to_device: on a CUDA run with pinned batches, fit fetches batch
// i+1 as soon as step i is enqueued and copies it to the device on a side stream. The fit trains
// exactly as without it (same batches in the same order, same kernels), every batch after an
// epoch's first comes from a copy ahead, the transfer hooks see each host batch in its turn, and
// a batch a hook replaces is copied as usual. The CUDA tests skip without a GPU; on a CPU run
// nothing is copied ahead (tested everywhere).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <volt/volt.h>

#include <memory>
#include <vector>

#include "requires.h"
#include "tiny.h"
#include "trainer/detail/device_prefetch.h"

namespace {

using volt::detail::DevicePrefetch;

// Records what the batch hooks and the steps see; `replace` makes on_before_batch_transfer hand
// on new tensors (twice the inputs), which no copy ahead can have.
class Watched : public volt_test::TinyClassifier {
 public:
  explicit Watched(bool replace = false) : replace_(replace) {}
  volt::Batch on_before_batch_transfer(volt::Batch batch) override {
    EXPECT_TRUE(batch.input.device().is_cpu());
    before.push_back(batch.input[0][0].item<float>());
    if (replace_) batch.input = batch.input * 2;
    return batch;
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    steps.push_back(b.input[0][0].item<float>());
    devices.push_back(b.input.device().type());
    return TinyClassifier::training_step(b, i);
  }
  std::vector<float> before, steps;
  std::vector<c10::DeviceType> devices;

 private:
  bool replace_;
};

struct Fitted {
  torch::Tensor params;
  int64_t taken = 0;  // batches that came from a copy ahead
};

Fitted fit(Watched& m, const std::string& accelerator, bool pin, bool prefetch = true) {
  volt_test::TempDir dir;
  auto data = volt_test::blobs(160);  // 10 batches of 16 an epoch
  volt::DataLoader dl(
      data, volt::DataLoaderOptions(16).shuffle(true).seed(3).pin_memory(pin).prefetch_to_device(
                prefetch));
  const int64_t before = DevicePrefetch::taken_total();
  volt::Trainer t(volt_test::quiet(dir.path).accelerator(accelerator).max_epochs(2));
  t.fit(m, dl);
  return {m.flat_params(), DevicePrefetch::taken_total() - before};
}

}  // namespace

TEST(DevicePrefetch, ACpuRunCopiesNothingAhead) {
  torch::manual_seed(0);
  Watched a;
  const Fitted f = fit(a, "cpu", /*pin=*/true);
  EXPECT_EQ(f.taken, 0);
  EXPECT_EQ(a.steps.size(), 20u);
  EXPECT_EQ(a.before, a.steps);
}

TEST(DevicePrefetchCuda, PinnedBatchesAreCopiedAheadAndTrainExactlyAsWithout) {
  VOLT_REQUIRE_CUDA();
  torch::manual_seed(0);
  Watched pageable;
  torch::manual_seed(0);
  Watched pinned;
  torch::manual_seed(0);
  Watched ahead;
  const Fitted a = fit(pageable, "cuda", false);
  const Fitted b = fit(pinned, "cuda", true, /*prefetch=*/false);
  const Fitted c = fit(ahead, "cuda", true);
  EXPECT_EQ(a.taken, 0);
  EXPECT_EQ(b.taken, 0);
  EXPECT_EQ(c.taken, 18);  // 2 epochs of 10 batches, each epoch's first copied in its turn
  EXPECT_TRUE(torch::equal(a.params, b.params));
  EXPECT_TRUE(torch::equal(a.params, c.params)) << (a.params - c.params).abs().max().item<double>();
  // Each step trained on the batch its hooks saw, in the loader's order.
  EXPECT_EQ(ahead.steps.size(), 20u);
  EXPECT_EQ(ahead.before, ahead.steps);
  EXPECT_EQ(ahead.steps, pageable.steps);
  for (auto d : ahead.devices) EXPECT_EQ(d, c10::DeviceType::CUDA);
}

TEST(DevicePrefetchCuda, ABatchTheHooksReplaceIsCopiedInItsTurn) {
  VOLT_REQUIRE_CUDA();
  torch::manual_seed(0);
  Watched pageable(/*replace=*/true);
  torch::manual_seed(0);
  Watched ahead(/*replace=*/true);
  const Fitted a = fit(pageable, "cuda", false);
  const Fitted c = fit(ahead, "cuda", true);
  EXPECT_EQ(c.taken, 0);  // the copies ahead were of the loader's tensors, not the hook's
  EXPECT_TRUE(torch::equal(a.params, c.params));
  ASSERT_EQ(ahead.steps.size(), 20u);
  for (size_t i = 0; i < ahead.steps.size(); ++i) EXPECT_EQ(ahead.steps[i], 2 * ahead.before[i]);
}
