#include "distributed/detail/intercept.h"

#include <torch/library.h>

#include <array>
#include <atomic>
#include <mutex>

#include "volt/core/check.h"

namespace volt::detail {
namespace {

// A fixed table read without a lock on every op: slots are written once, before `count` is
// raised past them.
constexpr size_t kMaxInterceptors = 8;  // four today
std::array<std::atomic<Interceptor>, kMaxInterceptors> g_table{};
std::atomic<size_t> g_count{0};

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const size_t n = g_count.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    if (g_table[i].load(std::memory_order_relaxed)(op, keys, stack)) return;
  }
  redispatch_below(op, keys, stack);
}

thread_local int64_t t_split_rank = -1;

}  // namespace

InterceptState InterceptState::current() {
  return {c10::impl::tls_is_dispatch_key_included(kInterceptKey), t_split_rank};
}

int64_t split_rank() {
  return t_split_rank;
}

void set_split_rank(int64_t rank) {
  t_split_rank = rank;
}

InterceptReplay::InterceptReplay(const InterceptState& state) : previous_rank_(t_split_rank) {
  if (state.included) include_.emplace(kInterceptKey);
  t_split_rank = state.split_rank;
}

InterceptReplay::~InterceptReplay() {
  t_split_rank = previous_rank_;
}

void redispatch_below(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                      torch::jit::Stack* stack) {
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kInterceptKey),
                     stack);
}

void add_interceptor(Interceptor fn) {
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  static std::once_flag once;
  std::call_once(once, [] {
    // Lives as long as the process: the fallback must outlive every tensor it acts on.
    static auto* lib =
        new torch::Library(torch::Library::IMPL, "_", kInterceptKey, __FILE__, __LINE__);
    lib->fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
  });
  const size_t n = g_count.load(std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    if (g_table[i].load(std::memory_order_relaxed) == fn) return;
  }
  VOLT_ASSERT(n < kMaxInterceptors, "[intercept] more than ", kMaxInterceptors,
              " interceptors registered");
  g_table[n].store(fn, std::memory_order_relaxed);
  g_count.store(n + 1, std::memory_order_release);
}

}  // namespace volt::detail
