#pragma once
// Private: HostReadWatch, shared by TracedFunction and the TorchScript export. While a tracer
// records, a value read on the host (item(), a tensor as a condition, equal) becomes a C++
// number the trace keeps as a constant, and any branch it decided stays decided: both refuse it.

#include <ATen/record_function.h>

#include <cstring>
#include <string>

namespace volt {
namespace detail {

/// While alive, remembers the first op on this thread that reads a tensor's value on the host.
/// One per thread at a time.
class HostReadWatch {
 public:
  HostReadWatch() {
    first().clear();
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(&start).scopes({at::RecordScope::FUNCTION}));
  }
  ~HostReadWatch() { at::removeCallback(handle_); }
  HostReadWatch(const HostReadWatch&) = delete;
  HostReadWatch& operator=(const HostReadWatch&) = delete;

  /// The op's name (e.g. "aten::_local_scalar_dense"); empty when there was none.
  const std::string& op() const { return first(); }

 private:
  static std::string& first() {
    static thread_local std::string op;
    return op;
  }
  static std::unique_ptr<at::ObserverContext> start(const at::RecordFunction& fn) {
    if (!first().empty()) return nullptr;
    const char* op = fn.name();
    if (std::strcmp(op, "aten::_local_scalar_dense") == 0 ||
        std::strcmp(op, "aten::is_nonzero") == 0 || std::strcmp(op, "aten::equal") == 0) {
      first() = op;
    }
    return nullptr;
  }
  at::CallbackHandle handle_;
};

}  // namespace detail
}  // namespace volt
