#pragma once
// Private: the next training batch copied to a CUDA device on a side stream while the current
// step runs (DataLoaderOptions::pin_memory with prefetch_to_device). The fit loop fetches batch
// i+1 right after step i is enqueued and starts its copy here; when batch i+1's turn comes, its
// transfer (Run::batch_to_device, under the default transfer_batch_to_device) takes the copy:
// the compute stream waits for it on the device, not the host. A batch the hooks replaced before
// the transfer (other tensors) finds no copy and is copied as usual; the unused copy is dropped
// by the next copy_ahead.

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "volt/core/batch.h"

namespace volt {
namespace detail {

class DevicePrefetch {
 public:
  /// `to_device` is the strategy's batch_to_device (its casts too); the copies run on a side
  /// stream of `device`, which must be a CUDA device for active() to be true.
  DevicePrefetch(c10::Device device, std::function<Batch(const Batch&)> to_device);
  ~DevicePrefetch();
  DevicePrefetch(const DevicePrefetch&) = delete;
  DevicePrefetch& operator=(const DevicePrefetch&) = delete;

  /// True on a CUDA device (a side stream exists).
  bool active() const { return side_.has_value(); }
  /// Starts copying `host` (pinned host tensors; false and nothing started otherwise) to the
  /// device on the side stream. Replaces a copy not taken.
  bool copy_ahead(const Batch& host);
  /// The device batch copy_ahead made from these very tensors (the current stream then waits for
  /// the copy, and the copy's memory is marked used there), or nullopt.
  c10::optional<Batch> take(const Batch& host);
  /// Batches taken from a copy ahead in this process (all DevicePrefetch objects), for tests.
  static int64_t taken_total();

 private:
  struct Pending;
  c10::Device device_;
  std::function<Batch(const Batch&)> to_device_;
  c10::optional<c10::Stream> side_;
  std::unique_ptr<Pending> pending_;
};

}  // namespace detail
}  // namespace volt
