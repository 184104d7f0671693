#include "trainer/detail/nonfinite_check.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>

#include "core/detail/host_syncs.h"
#include "volt/core/check.h"

namespace volt {
namespace detail {

void NonfiniteLossCheck::record(const at::Tensor& loss, Where where) {
  const at::Tensor l = loss.detach().reshape({});
  if (!losses_.defined() || losses_.device() != l.device() ||
      losses_.scalar_type() != l.scalar_type()) {
    check();  // what a buffer of another device or dtype holds
    losses_ = at::empty({kMaxPending}, l.options());
  }
  losses_.select(0, pending()).copy_(l);  // on the device; nothing here waits for it
  pending_.push_back(where);
  if (pending() >= std::min(every_, kMaxPending)) check();
}

void NonfiniteLossCheck::check() {
  if (pending_.empty()) return;
  int64_t first = -1;
  double value = 0;
  {
    // Named, so HostSyncMonitor and traces tell volt's own host read from the user's.
    RECORD_USER_SCOPE(kNonfiniteLossScope);
    const at::Tensor bad = at::isfinite(losses_.narrow(0, 0, pending())).logical_not();
    if (bad.any().item<bool>()) {  // the one read of a clean interval
      first = bad.to(at::kInt).argmax().item<int64_t>();
      value = losses_[first].item<double>();
    }
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
}

}  // namespace detail
}  // namespace volt
