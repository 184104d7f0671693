#include "volt/nn/empty_init.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <string>
#include <unordered_set>
#include <utility>

#include "distributed/detail/intercept.h"
#include "nn/detail/empty_init.h"

namespace volt {
namespace {

thread_local int t_depth = 0;
thread_local bool t_was_included = false;

bool is_initializer(const std::string& name) {
  static const std::unordered_set<std::string> names{
      "aten::uniform_",    "aten::normal_", "aten::fill_",        "aten::zero_",
      "aten::bernoulli_",  "aten::random_", "aten::exponential_", "aten::geometric_",
      "aten::log_normal_", "aten::cauchy_"};
  return names.count(name) != 0;
}

// The interceptor: an in-place initializer whose tensor requires a gradient (a parameter) returns
// that tensor untouched, as the op would after writing it.
bool skip_initializer(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/,
                      torch::jit::Stack* stack) {
  if (t_depth == 0 || !is_initializer(op.schema().name())) return false;
  const size_t n = op.schema().arguments().size();
  if (n == 0 || stack->size() < n) return false;
  const c10::IValue& self = (*stack)[stack->size() - n];
  if (!self.isTensor() || !self.toTensor().requires_grad()) return false;
  c10::IValue out = self;
  torch::jit::drop(*stack, n);
  stack->push_back(std::move(out));
  return true;
}

}  // namespace

EmptyInit::EmptyInit() {
  if (t_depth++ > 0) return;
  detail::add_interceptor(&skip_initializer);
  t_was_included = c10::impl::tls_is_dispatch_key_included(detail::kInterceptKey);
  c10::impl::tls_set_dispatch_key_included(detail::kInterceptKey, true);
}

EmptyInit::~EmptyInit() {
  if (--t_depth > 0) return;
  c10::impl::tls_set_dispatch_key_included(detail::kInterceptKey, t_was_included);
}

bool EmptyInit::active() {
  return t_depth > 0;
}

namespace detail {

std::shared_ptr<void> init_module_context(std::shared_ptr<void> inner, bool empty_init) {
  if (!empty_init) return inner;
  struct Both {
    std::shared_ptr<void> inner;  // made by the caller before the guard
    EmptyInit empty;              // released first (members go in reverse order)
  };
  auto both = std::make_shared<Both>();
  both->inner = std::move(inner);
  return both;
}

}  // namespace detail
}  // namespace volt
