#include "profiler/detail/op_callback.h"

namespace volt {
namespace detail {

GlobalOpCallback::GlobalOpCallback(Start start, End end, bool needs_inputs) {
  handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(start, end)
          .needsInputs(needs_inputs)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                   at::RecordScope::USER_SCOPE, at::RecordScope::TORCHSCRIPT_FUNCTION}));
  at::disableCallback(handle_);
}

GlobalOpCallback::~GlobalOpCallback() {
  at::removeCallback(handle_);
}

void GlobalOpCallback::enable(bool on) {
  if (on) {
    at::reenableCallback(handle_);
  } else {
    at::disableCallback(handle_);
  }
}

}  // namespace detail
}  // namespace volt
