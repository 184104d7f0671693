#include "core/detail/out_of_memory.h"

#include <c10/util/Exception.h>

#include <new>
#include <string>

namespace volt {
namespace detail {

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) || dynamic_cast<const c10::OutOfMemoryError*>(&e)) {
    return true;
  }
  const std::string what = e.what();
  const auto has = [&](const char* s) { return what.find(s) != std::string::npos; };
  // Lightning's is_oom_error: CPU allocation failures, any CUDA message saying out of memory
  // ("CUDA out of memory", "CUDA error: out of memory", "CUDA driver error: out of memory"), and
  // cuDNN's NOT_SUPPORTED, which cuDNN raises for a batch too large for its workspace.
  return has("can't allocate memory") || has("not enough memory") ||
         (has("CUDA") && has("out of memory")) || has("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.");
}

}  // namespace detail
}  // namespace volt
