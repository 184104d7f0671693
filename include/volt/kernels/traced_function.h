#pragma once
/// TracedFunction: the roadmap's tracing JIT, first piece. It records a function of tensors
/// (or a module's forward) with libtorch's tracer, once per input signature, finds the chains
/// of elementwise float32 ops in the recorded graph, compiles each chain into one
/// FusedElementwise loop, and runs the graph: the fused loops where it found chains, every other
/// op as recorded (through libtorch's dispatcher, so autograd, in-place ops and random ops work
/// as they do eagerly).
///
///   auto mlp = std::make_shared<MyMlp>();   // any torch::nn::Module
///   volt::TracedFunction fwd("mlp", mlp, [&](const std::vector<at::Tensor>& in) {
///     return std::vector<at::Tensor>{mlp->forward(in[0])};
///   });
///   at::Tensor y = fwd({x})[0];     // traced on this call, replayed on the next ones
///   y.sum().backward();             // gradients reach mlp's parameters
///   std::cout << fwd.describe({x}); // what got fused
///
/// What a trace is (the same caveats as torch.jit.trace): the ops one call ran. Control flow
/// that depends on tensor values, or sizes read into C++ integers, are fixed at the trace (a
/// value read on the host while tracing, item() or a tensor as a condition, is a ValueError, as
/// is a tensor from an `empty` op read before a recorded op wrote it: a kernel filled it through
/// data pointers; volt's fused kernels run their reference compositions while traced); a new
/// trace is taken for each new input signature (count, dtypes, devices, sizes, requires_grad of
/// the inputs; grad mode; autocast's state; the module's training mode and parameter count), the
/// least recently used beyond `max_traces` dropped. A function whose ops depend on anything else
/// must not be traced. To catch one that does (a branch on a counter or a step index, a number
/// computed on the host, a tensor replaced between calls), the call after each new trace
/// (`check_calls`) and the next call after `recheck()` (which a fit runs at each epoch's start
/// for the functions made with its module: `recheck_module`) run fn under the tracer again, return
/// its own results, and compare what it ran with the trace: other ops, other constants or other
/// values in a constant tensor are a ValueError naming the first difference, and the trace is
/// dropped. A difference that first shows on an unchecked call is not seen.
///
/// Ops whose output size follows the data (nonzero, then index_select by its result) are
/// recorded like any other and replay with the size the data gives. An op that reads a value on
/// the host (masked_select's CPU kernel in libtorch 1.13) cannot be traced: trace the regions
/// before and after it apart and run it between them, as the reference's mark_step around a
/// dynamic op (tests: DynamicOps.*).
///
/// Tensors the function reads that are not inputs: a module's parameters and buffers (with the
/// module constructor) become inputs of the graph, so updates to them are seen; any other tensor
/// is recorded as a constant (the same tensor object, so in-place changes are seen, a
/// replacement is not); one that requires grad is a ValueError (pass it as an input).
///
/// Fused: add/sub/rsub (Tensor or Scalar), mul, div, neg, abs, exp, log, tanh, sigmoid, relu,
/// sqrt, rsqrt, reciprocal, erf, square, pow by 0.5/2/3/-1, maximum, minimum, clamp/clamp_min/
/// clamp_max, leaky_relu, silu, gelu (both approximations), and the reductions over the last
/// dimension: sum / mean / amax (one dimension, keepdim=true), softmax and log_softmax (over
/// rows of at least 128 values, or of at most 31 that are not a multiple of 8 when there are at
/// least 16 rows: elsewhere libtorch's kernels are as fast or faster), and layer_norm (with
/// or without weight and bias; only where no gradient is needed, since under gradients the fused
/// chain only matches libtorch's layer_norm), when every tensor is float32 on the CPU and the
/// op's output has the chain's shape (or, for a value that does not vary along the last
/// dimension, that shape with a last size of 1). Chains of + - * and max/min/relu with alpha 1
/// give libtorch's bits; the transcendental ops (and silu, gelu, rsqrt written as their
/// formulas) are within a few ulp, the reductions within rounding (sums accumulate in double).

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "volt/kernels/fused_elementwise.h"

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace volt {

/// How a TracedFunction records and runs.
struct TraceOptions {
  /// Fuse chains of at least this many elementwise ops (>= 1); shorter ones run as recorded.
  /// Default: 2.
  TORCH_ARG(int64_t, min_fused_ops) = 2;
  /// Traces kept, one per input signature (>= 1); the least recently used beyond this is
  /// dropped. Default: 8.
  TORCH_ARG(int64_t, max_traces) = 8;
  /// Calls after each new trace that run the function under the tracer again (their own
  /// results returned) and must record the same ops and constants as the trace, else
  /// ValueError (>= 0; 0 = none). Default: 1.
  TORCH_ARG(int64_t, check_calls) = 1;
  /// false: run the recorded graph op by op with nothing fused (the reference). Default: true.
  TORCH_ARG(bool, fuse) = true;
  /// How the fused chains run (require_fused, the disk cache, grain size).
  TORCH_ARG(FusedElementwiseOptions, fused_options) = {};
};

std::ostream& operator<<(std::ostream& os, const TraceOptions& options);

/// A traced function of tensors; copies share the traces. Thread-safe to call.
class TracedFunction {
 public:
  using Fn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

  /// `name` (letters, digits, '_') names the function in logs and its fused kernels; `fn` returns
  /// one or more tensors. ValueError on an empty name or function, ConfigError on bad options.
  TracedFunction(std::string name, Fn fn, TraceOptions options = {});
  /// Traces `fn`, which runs `module`: the module's parameters and buffers become inputs of the
  /// graph, and their dtypes, devices and requires_grad and every submodule's training mode
  /// part of the signature.
  TracedFunction(std::string name, std::shared_ptr<torch::nn::Module> module, Fn fn,
                 TraceOptions options = {});
  /// The same for a module that holds its own TracedFunction (a member traced from the
  /// constructor): not owned, so the module must outlive every copy of this object.
  TracedFunction(std::string name, torch::nn::Module& module, Fn fn, TraceOptions options = {});

  /// fn(inputs), from the trace for this signature (traced on first use: that call runs fn
  /// itself under the tracer, as does a checked call). ValueError when a checked call ran
  /// other ops than the trace (see above).
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs) const;

  /// Checks the next call of every kept trace's signature as the one after a trace is checked
  /// (e.g. at an epoch's start, for a function that might branch on the epoch).
  void recheck() const;
  /// recheck() for every live TracedFunction made with `module` or one of its submodules, e.g.
  /// a module's own traced forward; functions made without a module are not reached. The Trainer
  /// calls it at the start of each training epoch after the first, so a function whose ops
  /// depend on the epoch fails at that epoch's first call instead of replaying the old ones.
  static void recheck_module(const torch::nn::Module& module);

  /// The trace for `inputs`' signature (traced if needed, which runs fn once): the counts, each
  /// step (the fused chains with their ops), and the recorded graph. For reading.
  std::string describe(const std::vector<at::Tensor>& inputs) const;

  /// The key of the trace `inputs` run: their signature (count, dtypes, sizes, devices,
  /// requires_grad), grad mode, autocast's state and the module's (its tensors' dtypes, devices
  /// and requires_grad, its submodules' training modes); equal keys share a trace.
  std::string signature(const std::vector<at::Tensor>& inputs) const;

  struct Stats {
    int64_t traces = 0;     ///< traces taken (one per new signature, again after an eviction)
    int64_t hits = 0;       ///< calls that replayed a kept trace
    int64_t checks = 0;     ///< calls that ran fn under the tracer to check a kept trace
    int64_t evictions = 0;  ///< traces dropped beyond max_traces
    int64_t kept = 0;       ///< traces kept now
  };
  Stats stats() const;

  const std::string& name() const;
  const TraceOptions& options() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace volt
