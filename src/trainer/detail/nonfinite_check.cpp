#include "trainer/detail/nonfinite_check.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include "profiler/detail/host_syncs.h"
#include "volt/core/check.h"

namespace volt {
namespace detail {

void NonfiniteLossCheck::record(const at::Tensor& loss, Where where) {
  const at::Tensor l = loss.detach().reshape({});
  const at::Tensor bad = at::isfinite(l).logical_not();
  const int64_t index = static_cast<int64_t>(pending_.size());
  if (index == 0) {
    first_bad_ = at::full({}, -1, l.options().dtype(at::kLong));
    bad_loss_ = l.clone();
  }
  // Device-side: the first bad record wins; nothing here waits for the device.
  const at::Tensor take = bad.logical_and(first_bad_.lt(0));
  first_bad_.masked_fill_(take, index);
  bad_loss_ = at::where(take, l, bad_loss_);
  pending_.push_back(where);
  if (pending() >= every_) check();
}

void NonfiniteLossCheck::check() {
  if (pending_.empty()) return;
  int64_t first = -1;
  double value = 0;
  {
    // Named, so HostSyncMonitor and traces tell volt's own host read from the user's.
    RECORD_USER_SCOPE(kNonfiniteLossScope);
    first = first_bad_.item<int64_t>();
    if (first >= 0) value = bad_loss_.item<double>();
    ++reads_;
  }
  const std::vector<Where> seen = std::move(pending_);
  reset();
  if (first < 0) return;
  const Where& w = seen.at(static_cast<size_t>(first));
  const Where& now = seen.back();
  throw ValueError(str_cat("[Trainer] the training loss is ", value, " at global step ",
                           w.global_step, " (epoch ", w.epoch, ", batch ", w.batch_idx, ")",
                           seen.size() > 1
                               ? " (found at global step " + std::to_string(now.global_step) +
                                     ": the check reads the device every log_every_n_steps steps)"
                               : std::string(),
                           "; lower the learning rate, enable gradient clipping, check the data, "
                           "or set detect_nonfinite_loss(false) to continue anyway."));
}

void NonfiniteLossCheck::reset() {
  pending_.clear();
  first_bad_ = at::Tensor();
  bad_loss_ = at::Tensor();
}

}  // namespace detail
}  // namespace volt
