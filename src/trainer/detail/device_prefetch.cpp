#include "trainer/detail/device_prefetch.h"

#include <ATen/Tensor.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <atomic>
#include <utility>
#include <vector>

#include "core/detail/batch_tensors.h"

namespace volt {
namespace detail {
namespace {

std::atomic<int64_t> g_taken{0};

}  // namespace

struct DevicePrefetch::Pending {
  // The host tensors, batch_tensors order (held, so that their TensorImpls cannot be reused by
  // other tensors while this copy waits to be taken), and the extras' names.
  std::vector<at::Tensor> host;
  std::vector<std::string> keys;
  Batch device;
  c10::Event copied{c10::DeviceType::CUDA};
};

DevicePrefetch::DevicePrefetch(c10::Device device, std::function<Batch(const Batch&)> to_device)
    : device_(device), to_device_(std::move(to_device)) {
  if (device_.is_cuda()) {
    if (!device_.has_index()) device_ = c10::Device(c10::kCUDA, 0);
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    side_ = impl.getStreamFromGlobalPool(device_);
  }
}

DevicePrefetch::~DevicePrefetch() = default;

bool DevicePrefetch::copy_ahead(const Batch& host) {
  pending_.reset();
  if (!active()) return false;
  for (const at::Tensor& t : batch_tensors(host)) {
    if (t.defined() && (!t.device().is_cpu() || !t.is_pinned())) return false;
  }
  auto p = std::make_unique<Pending>();
  p->host = batch_tensors(host);
  for (const auto& kv : host.extra) p->keys.push_back(kv.first);
  {
    c10::StreamGuard on_side(*side_);
    p->device = to_device_(host);
    p->copied.record(*side_);
  }
  pending_ = std::move(p);
  return true;
}

c10::optional<Batch> DevicePrefetch::take(const Batch& host) {
  if (!pending_) return c10::nullopt;
  const std::vector<at::Tensor> given = batch_tensors(host);
  if (given.size() != pending_->host.size()) return c10::nullopt;
  for (size_t k = 0; k < given.size(); ++k) {
    if (given[k].unsafeGetTensorImpl() != pending_->host[k].unsafeGetTensorImpl()) {
      return c10::nullopt;
    }
  }
  std::vector<std::string> keys;
  for (const auto& kv : host.extra) keys.push_back(kv.first);
  if (keys != pending_->keys) return c10::nullopt;
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  const c10::Stream current = impl.getStream(device_);
  pending_->copied.block(current);
  // Allocated on the side stream, used on this one: the allocator must not hand the memory to
  // the side stream's next copy before this stream is done with it.
  for (const at::Tensor& t : batch_tensors(pending_->device)) {
    if (t.defined() && t.is_cuda()) t.record_stream(current);
  }
  Batch out = std::move(pending_->device);
  pending_.reset();
  ++g_taken;
  return out;
}

int64_t DevicePrefetch::taken_total() {
  return g_taken.load();
}

}  // namespace detail
}  // namespace volt
