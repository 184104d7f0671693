#pragma once
// Stand-in for libtorch's torch/csrc/distributed/autograd/context/context.h, which Debian's
// libtorch-dev 1.13 does not ship although c10d/reducer.hpp includes it. reducer.hpp needs only
// these two names: DistAutogradContext::GradCallback (checked by a static_assert against the
// Reducer's own std::function type) and ContextPtr (a shared_ptr member of Reducer::RpcContext,
// whose layout does not depend on the pointee). CMake puts this folder on the include path only
// when the real header is missing (the 2.11 wheel ships it).

#include <ATen/Tensor.h>

#include <functional>
#include <memory>

namespace torch {
namespace distributed {
namespace autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};

using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace autograd
}  // namespace distributed
}  // namespace torch
