#pragma once
// Models and data for the tuner tests (scale_batch_size, BatchSizeFinder): a classifier whose
// steps' memory grows with the batch, and a DataModule whose batch size can be set.

#include <torch/torch.h>

#include <volt/volt.h>

#include <memory>
#include <stdexcept>
#include <vector>

#include "tiny.h"

namespace volt_test {

constexpr int64_t kScratchPerSample = 65536;  // float32: 256 KiB per sample
constexpr int64_t kMiB = 1 << 20;

/// TinyClassifier whose steps also hold a scratch activation of 256 KiB per sample, so that a
/// step's memory grows with the batch; `fail_from`: sizes from there on throw `how`.
class Hungry : public TinyClassifier {
 public:
  enum class How { kNone, kHugeAllocation, kLogicError };
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    sizes.push_back(b.input.size(0));
    return TinyClassifier::training_step(b, i) + scratch(b.input.size(0));
  }
  void validation_step(const volt::Batch& b, int64_t i) override {
    sizes.push_back(b.input.size(0));
    log("scratch", scratch(b.input.size(0)));
    TinyClassifier::validation_step(b, i);
  }
  torch::Tensor scratch(int64_t batch) {
    if (fail_from > 0 && batch >= fail_from) {
      if (how == How::kHugeAllocation) {
        // 1 PiB: more than any x86-64 or arm64 address space, so the allocator really fails.
        return torch::empty({int64_t{1} << 48}).sum();
      }
      if (how == How::kLogicError) throw std::logic_error("a bug in training_step");
    }
    return torch::ones({batch, kScratchPerSample}).mean() * 0;
  }
  std::vector<int64_t> sizes;
  int64_t fail_from = 0;
  How how = How::kNone;
};

/// A DataModule whose batch size can be set, as scale_batch_size needs.
class SizedData : public volt::DataModule {
 public:
  SizedData(int64_t n, int64_t batch_size) : ds_(blobs(n)), bs_(batch_size) {}
  volt::DataLoader train_dataloader() override {
    return volt::DataLoader(ds_, volt::DataLoaderOptions(bs_).shuffle(true).seed(3));
  }
  c10::optional<volt::DataLoader> val_dataloader() override {
    return volt::DataLoader(ds_, volt::DataLoaderOptions(bs_));
  }
  c10::optional<int64_t> batch_size() const override { return bs_; }
  void set_batch_size(int64_t b) override { bs_ = b; }

 private:
  std::shared_ptr<volt::TensorDataset> ds_;
  int64_t bs_;
};

}  // namespace volt_test
