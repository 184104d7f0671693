#pragma once
// One dispatcher fallback shared by the components that must see ops on tensors they do not
// own the code of (C++ modules have no forward hooks and `forward` is not virtual):
// ZeroEngine (stage 3 gathers a parameter before an op reads it) and TensorParallelEngine
// (a row-parallel Linear all-reduces its output). A boxed fallback on one functionality key sees
// every op while that key is in the thread's included set (autograd carries the set into
// backward). DeferredInit is torchdistx's key; libtorch registers nothing on it, so in a C++
// process this fallback is the only kernel there (registering a second one would fail loudly).

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DispatchKey.h>

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

/// Runs `op` below the intercept key (what an interceptor that declines would get).
void redispatch_below(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                      torch::jit::Stack* stack);

}  // namespace volt::detail
