#include "volt/nn/empty_init.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "distributed/detail/intercept.h"
#include "nn/detail/empty_init.h"
#include "volt/core/log.h"

namespace volt {
namespace {

// Each thread's count of live guards, shared with the guards it made: a guard destroyed on
// another thread (a shared_ptr from init_module released elsewhere) still ends its own thread's
// skipping. Atomic for that case alone.
thread_local std::shared_ptr<std::atomic<int>> t_depth = std::make_shared<std::atomic<int>>(0);
thread_local bool t_was_included = false;

// The thread and counter of each live guard (guards have no members: the header stays as it is).
struct Made {
  std::thread::id thread;
  std::shared_ptr<std::atomic<int>> depth;
};
std::mutex g_mutex;
std::unordered_map<const EmptyInit*, Made>& made() {
  static auto* m = new std::unordered_map<const EmptyInit*, Made>();  // never destroyed
  return *m;
}

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
  if (t_depth->load() == 0 || !is_initializer(op.schema().name())) return false;
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
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    made().emplace(this, Made{std::this_thread::get_id(), t_depth});
  }
  if (t_depth->fetch_add(1) > 0) return;
  detail::add_interceptor(&skip_initializer);
  t_was_included = c10::impl::tls_is_dispatch_key_included(detail::kInterceptKey);
  c10::impl::tls_set_dispatch_key_included(detail::kInterceptKey, true);
}

EmptyInit::~EmptyInit() {
  Made m;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = made().find(this);
    m = std::move(it->second);
    made().erase(it);
  }
  if (m.thread != std::this_thread::get_id()) {
    // This thread's dispatch state is not the guard's to change; its own thread's count drops
    // (its intercept key stays on, passing every op through once the count is zero).
    m.depth->fetch_sub(1);
    log_warning("EmptyInit",
                "a guard was destroyed on another thread than the one that made it; the "
                "initializers on its thread run again from now. Destroy the guard (or release "
                "init_module()'s context) on the thread that built the model.");
    return;
  }
  if (t_depth->fetch_sub(1) > 1) return;
  c10::impl::tls_set_dispatch_key_included(detail::kInterceptKey, t_was_included);
}

bool EmptyInit::active() {
  return t_depth->load() > 0;
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
