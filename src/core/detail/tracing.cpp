#include "core/detail/tracing.h"

#include <torch/csrc/jit/frontend/tracer.h>

namespace volt {
namespace detail {

bool tracing() {
  return torch::jit::tracer::isTracing();
}

}  // namespace detail
}  // namespace volt
