#pragma once
// Private: one libtorch op observer, the global at::RecordFunction callback that TorchProfiler
// and HostSyncMonitor each install. The callbacks are plain function pointers without user data,
// so each user publishes its own state through a global pointer of its own.

#include <ATen/record_function.h>

namespace volt {
namespace detail {

/// A global RecordFunction callback on every thread for ops (FUNCTION), autograd nodes
/// (BACKWARD_FUNCTION), user scopes (USER_SCOPE, e.g. RECORD_USER_SCOPE) and TorchScript
/// functions: added disabled at construction, removed at destruction.
class GlobalOpCallback {
 public:
  using Start = std::unique_ptr<at::ObserverContext> (*)(const at::RecordFunction&);
  using End = void (*)(const at::RecordFunction&, at::ObserverContext*);
  /// `needs_inputs`: RecordFunction boxes each op's arguments so `start` can read fn.inputs().
  GlobalOpCallback(Start start, End end, bool needs_inputs);
  ~GlobalOpCallback();
  GlobalOpCallback(const GlobalOpCallback&) = delete;
  GlobalOpCallback& operator=(const GlobalOpCallback&) = delete;
  /// A disabled callback costs the ops nothing but RecordFunction's own check.
  void enable(bool on);

 private:
  at::CallbackHandle handle_;
};

}  // namespace detail
}  // namespace volt
