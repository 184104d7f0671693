#pragma once
// One dispatcher fallback shared by the components that must see ops on tensors they do not
// own the code of (C++ modules have no forward hooks and `forward` is not virtual):
// ZeroEngine (stage 3 gathers a parameter before an op reads it), TensorParallelEngine
// (a row-parallel Linear all-reduces its output), SyncBatchNorm and EmptyInit (src/nn: an
// initializer writing a parameter is skipped while a guard lives on the thread). A boxed fallback
// on one functionality key sees every op while that key is in the thread's included set (autograd
// carries the set into backward). DeferredInit is torchdistx's key; libtorch registers nothing on
// it, so in a C++ process this fallback is the only kernel there (registering a second one would
// fail loudly).

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Optional.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace volt::detail {

constexpr c10::DispatchKey kInterceptKey = c10::DispatchKey::DeferredInit;

/// Sees every op while kInterceptKey is included. Returns true when it ran the op itself (its
/// results replace the arguments on the stack); false lets the next interceptor, then the op
/// below the key, run.
using Interceptor = bool (*)(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                             torch::jit::Stack* stack);

/// Registers `fn` once (later calls with the same fn are no-ops); interceptors run in the order
/// they were added and live as long as the process.
void add_interceptor(Interceptor fn);

/// What the interceptors read of the thread besides their registries: whether the intercept key
/// is included, and this rank in the tensor-parallel group of the Scope on the thread (-1: none;
/// SplitRegionRng reads it). Captured where a forward runs and replayed where it runs again
/// (activation checkpointing's recomputation in backward, where neither is set any more), so
/// the recomputed forward is the forward: row-parallel sums, ZeRO-3 gathers, split-region masks.
struct InterceptState {
  bool included = false;
  int64_t split_rank = -1;
  static InterceptState current();
};

/// This thread's tensor-parallel rank for SplitRegionRng (-1: no split Scope); set by
/// TensorParallelEngine::Scope and InterceptReplay, each restoring the previous value.
int64_t split_rank();
void set_split_rank(int64_t rank);

/// Sets `state` on this thread while it lives (the key included if it was; the split rank),
/// then puts back what was there.
class InterceptReplay {
 public:
  explicit InterceptReplay(const InterceptState& state);
  ~InterceptReplay();
  InterceptReplay(const InterceptReplay&) = delete;
  InterceptReplay& operator=(const InterceptReplay&) = delete;

 private:
  c10::optional<c10::impl::IncludeDispatchKeyGuard> include_;
  int64_t previous_rank_;
};

/// Runs `op` below the intercept key (what an interceptor that declines would get).
void redispatch_below(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                      torch::jit::Stack* stack);

/// The storage of `t` (views share it), or nullptr for an undefined or storage-less tensor.
inline const c10::StorageImpl* storage_of(const at::Tensor& t) {
  return t.defined() && t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
}

/// Bytes of each distinct storage among `tensors`.
inline int64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const c10::StorageImpl*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    const c10::StorageImpl* s = storage_of(t);
    if (s != nullptr && seen.insert(s).second) bytes += static_cast<int64_t>(s->nbytes());
  }
  return bytes;
}

/// What an interceptor knows about the tensors it acts on, by storage (so views of them are
/// found too); thread-safe, with a lock-free emptiness check for the fast path of every op.
template <typename T>
class StorageMap {
 public:
  void set(const c10::StorageImpl* s, T value) {
    std::lock_guard<std::mutex> lock(m_);
    map_[s] = std::move(value);
    size_.store(map_.size(), std::memory_order_release);
  }
  /// Removes the entries `drop` selects; returns how many remain.
  size_t erase_if(const std::function<bool(const T&)>& drop) {
    std::lock_guard<std::mutex> lock(m_);
    for (auto it = map_.begin(); it != map_.end();) it = drop(it->second) ? map_.erase(it) : ++it;
    size_.store(map_.size(), std::memory_order_release);
    return map_.size();
  }
  c10::optional<T> find(const at::Tensor& t) const {
    if (empty()) return c10::nullopt;
    const c10::StorageImpl* s = storage_of(t);
    if (s == nullptr) return c10::nullopt;
    std::lock_guard<std::mutex> lock(m_);
    auto it = map_.find(s);
    return it == map_.end() ? c10::nullopt : c10::optional<T>(it->second);
  }
  bool empty() const { return size_.load(std::memory_order_acquire) == 0; }

 private:
  mutable std::mutex m_;
  std::unordered_map<const c10::StorageImpl*, T> map_;
  std::atomic<size_t> size_{0};
};

}  // namespace volt::detail
