#pragma once
/// Activation checkpointing (DeepSpeed's `checkpoint(self.l2, l1_out)`, torch.utils.checkpoint):
/// run part of a model without keeping its intermediate activations and recompute them in
/// backward, trading compute for memory.

#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "volt/core/recompute.h"  // in_checkpoint_recompute()

namespace volt {

struct CheckpointOptions {
  /// Replay in recomputation the RNG states (CPU default generator and that of every other
  /// device among the inputs) seen in forward, so dropout draws the same masks. Default: true.
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// DeepSpeed's cpu_checkpointing: keep the checkpointed inputs in host memory (pinned when
  /// they live on CUDA) until recomputation moves them back. A no-op for CPU tensors; the
  /// accelerator path is unverified until issue #14 runs it on a GPU. Default: false.
  TORCH_ARG(bool, cpu_checkpointing) = false;
};

std::ostream& operator<<(std::ostream& os, const CheckpointOptions& options);

/// The options checkpoint calls without explicit options use (process-wide; the DeepSpeed
/// strategy sets cpu_checkpointing here for its run).
CheckpointOptions checkpoint_defaults();
/// Replaces the process-wide defaults; prefer CheckpointDefaultsGuard, which restores them.
void set_checkpoint_defaults(const CheckpointOptions& options);

/// Sets the process-wide checkpoint defaults for its lifetime, then restores the previous ones.
class CheckpointDefaultsGuard {
 public:
  explicit CheckpointDefaultsGuard(const CheckpointOptions& options);
  ~CheckpointDefaultsGuard();
  CheckpointDefaultsGuard(const CheckpointDefaultsGuard&) = delete;
  CheckpointDefaultsGuard& operator=(const CheckpointDefaultsGuard&) = delete;

 private:
  CheckpointOptions previous_;
};

/// What checkpoint runs: tensors in, tensors out. Non-tensor arguments are captured.
using CheckpointFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

namespace detail {
std::vector<at::Tensor> checkpoint_impl(const CheckpointFunction& fn,
                                        const std::vector<at::Tensor>& inputs,
                                        const CheckpointOptions& options);
/// checkpoint_impl for `fn` running `module`: the recomputation leaves the module's buffers as
/// the forward left them (BatchNorm's statistics move once per forward), and a module with no
/// trainable parameter whose inputs need no gradient just runs (nothing to recompute for).
std::vector<at::Tensor> checkpoint_module_impl(std::shared_ptr<const torch::nn::Module> module,
                                               const CheckpointFunction& fn,
                                               const std::vector<at::Tensor>& inputs,
                                               const CheckpointOptions& options);
template <typename R>
std::vector<at::Tensor> to_list(R&& r) {
  using T = std::decay_t<R>;
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return {std::forward<R>(r)};
  } else {
    static_assert(std::is_same_v<T, std::vector<at::Tensor>>,
                  "volt::checkpoint: the callable must return at::Tensor or "
                  "std::vector<at::Tensor>");
    return std::forward<R>(r);
  }
}
template <typename Fn, size_t... I>
std::vector<at::Tensor> invoke_on_list(Fn& fn, const std::vector<at::Tensor>& in,
                                       std::index_sequence<I...>) {
  return to_list(fn(in[I]...));
}
/// Whether M's forward takes the tensors (detected, so a mismatch names no candidate).
template <typename Void, typename M, typename... In>
struct module_forwards : std::false_type {};
template <typename M, typename... In>
struct module_forwards<
    std::void_t<decltype(std::declval<M&>().forward(std::declval<const In&>()...))>, M, In...>
    : std::true_type {};
/// A std::shared_ptr to a module (what register_module returns for a module without a holder).
template <typename F>
struct is_module_pointer : std::false_type {};
template <typename M>
struct is_module_pointer<std::shared_ptr<M>> : std::is_base_of<torch::nn::Module, M> {};
/// The module a holder or a module pointer names; null when the holder is empty.
template <typename M>
std::shared_ptr<M> module_pointer(const std::shared_ptr<M>& module) {
  return module;
}
template <typename M>
std::shared_ptr<M> module_pointer(const torch::nn::ModuleHolder<M>& holder) {
  return holder.is_empty() ? nullptr : holder.ptr();
}
/// What the one- or several-tensor checkpoint calls: a callable taking the tensors, or a module
/// pointer whose forward takes them.
template <typename F, typename... In>
struct checkpoint_callable : std::is_invocable<F&, const In&...> {};
template <typename M, typename... In>
struct checkpoint_callable<std::shared_ptr<M>, In...>
    : std::conjunction<std::is_base_of<torch::nn::Module, M>, module_forwards<void, M, In...>> {};
}  // namespace detail

/// Runs `fn(inputs)` keeping none of its intermediate activations; backward re-runs it (with
/// the forward's RNG and autocast state) and back-propagates through the recomputed graph, so
/// gradients of the inputs and of every parameter `fn` uses equal an ordinary run's (bitwise on
/// CPU for deterministic ops). Parameters get gradients even when no input requires grad. With
/// grad mode off it just calls `fn`. `fn` must be deterministic apart from its RNG draws and
/// must not modify its inputs in place (an input modified in place before backward makes
/// backward throw libtorch's "modified by an inplace operation" error). Without `options`,
/// checkpoint_defaults() apply.
///   auto outs = volt::checkpoint(fn, std::vector<at::Tensor>{a, b}, options);
template <typename Fn, typename In,
          typename = std::enable_if_t<
              std::conjunction_v<std::is_same<std::decay_t<In>, std::vector<at::Tensor>>,
                                 std::is_constructible<CheckpointFunction, Fn>>>>
std::vector<at::Tensor> checkpoint(Fn&& fn, In&& inputs, const CheckpointOptions& options);
template <typename Fn, typename In,
          typename = std::enable_if_t<
              std::conjunction_v<std::is_same<std::decay_t<In>, std::vector<at::Tensor>>,
                                 std::is_constructible<CheckpointFunction, Fn>>>>
std::vector<at::Tensor> checkpoint(Fn&& fn, In&& inputs);

/// The one- or several-tensor form, e.g. DeepSpeed's `checkpoint(self.l2, l1_out)`:
///   at::Tensor y = volt::checkpoint(l2, h);                    // a module holder
///   at::Tensor s = volt::checkpoint(seq, h);                   // a whole torch::nn::Sequential
///   at::Tensor b = volt::checkpoint(block_impl, h);            // a std::shared_ptr<BlockImpl>
///   at::Tensor z = volt::checkpoint([this, causal](const at::Tensor& a, const at::Tensor& b) {
///     return block(a, b, causal); }, a, b);                      // non-tensors captured
/// `fn` is kept until the backward pass, which runs it again: capture by value (and `this`),
/// never a local by reference ([&]), which is gone when a later backward() recomputes.
/// `fn` takes the tensors and returns at::Tensor (the result is a Tensor) or
/// std::vector<at::Tensor> (the result is that vector). A module holder (any
/// torch::nn::ModuleHolder, Sequential included) or a std::shared_ptr to a module
/// (`std::shared_ptr<BlockImpl>`, for modules without TORCH_MODULE) is called through its
/// forward and known to checkpoint: its buffers do not move again in the recomputation (BatchNorm's
/// running statistics count each forward once), and a frozen module whose inputs need no gradient
/// just runs. A lambda's modules are unknown to checkpoint, as to torch.utils.checkpoint: their
/// buffers move again when backward recomputes.
template <typename Fn, typename... Rest,
          typename = std::enable_if_t<std::conjunction_v<
              std::is_same<std::decay_t<Rest>, at::Tensor>...,
              detail::checkpoint_callable<std::decay_t<Fn>, at::Tensor, Rest...>>>>
auto checkpoint(Fn&& fn, const at::Tensor& x, const Rest&... rest);

/// The same with explicit options: `volt::checkpoint(CheckpointOptions().cpu_checkpointing(true),
/// block, x)`.
template <typename Fn, typename... Rest,
          typename = std::enable_if_t<std::conjunction_v<
              std::is_same<std::decay_t<Rest>, at::Tensor>...,
              detail::checkpoint_callable<std::decay_t<Fn>, at::Tensor, Rest...>>>>
auto checkpoint(const CheckpointOptions& options, Fn&& fn, const at::Tensor& x,
                const Rest&... rest) {
  constexpr auto kInputs = std::make_index_sequence<1 + sizeof...(Rest)>{};
  if constexpr (torch::detail::is_module_holder<Fn>::value ||
                detail::is_module_pointer<std::decay_t<Fn>>::value) {
    // Through the module's forward: a Sequential holder's operator() cannot name its return
    // type (its forward is a template), the module's own forward defaults to Tensor.
    auto module = detail::module_pointer(fn);  // null: checkpoint_module_impl says so
    auto forward = [module](const auto&... in) { return module->forward(in...); };
    using R = std::decay_t<decltype(forward(x, rest...))>;
    CheckpointFunction f = [forward, kInputs](const std::vector<at::Tensor>& in) {
      return detail::invoke_on_list(forward, in, kInputs);
    };
    auto out = detail::checkpoint_module_impl(module, f, {x, rest...}, options);
    if constexpr (std::is_same_v<R, at::Tensor>) {
      return out.at(0);
    } else {
      return out;
    }
  } else {
    using R =
        std::decay_t<std::invoke_result_t<std::decay_t<Fn>&, const at::Tensor&, const Rest&...>>;
    static_assert(!std::is_void_v<R>,
                  "volt::checkpoint: the callable returns void; it must return at::Tensor or "
                  "std::vector<at::Tensor>");
    auto held = std::make_shared<std::decay_t<Fn>>(std::forward<Fn>(fn));
    CheckpointFunction f = [held, kInputs](const std::vector<at::Tensor>& in) {
      return detail::invoke_on_list(*held, in, kInputs);
    };
    std::vector<at::Tensor> out = detail::checkpoint_impl(f, {x, rest...}, options);
    if constexpr (std::is_same_v<R, at::Tensor>) {
      return out.at(0);
    } else {
      return out;
    }
  }
}

template <typename Fn, typename... Rest, typename>
auto checkpoint(Fn&& fn, const at::Tensor& x, const Rest&... rest) {
  return checkpoint(checkpoint_defaults(), std::forward<Fn>(fn), x, rest...);
}

template <typename Fn, typename In, typename>
std::vector<at::Tensor> checkpoint(Fn&& fn, In&& inputs, const CheckpointOptions& options) {
  return detail::checkpoint_impl(CheckpointFunction(std::forward<Fn>(fn)), inputs, options);
}

template <typename Fn, typename In, typename>
std::vector<at::Tensor> checkpoint(Fn&& fn, In&& inputs) {
  return detail::checkpoint_impl(CheckpointFunction(std::forward<Fn>(fn)), inputs,
                                 checkpoint_defaults());
}

/// torch.utils.checkpoint.checkpoint_sequential: splits `sequential` into `segments` runs of
/// consecutive modules and checkpoints each but the last (its activations are needed at once).
/// segments must be in [1, sequential->size()] (else ConfigError). Each entry must take and
/// return one Tensor. A segment with no trainable parameter whose input needs no gradient (a
/// frozen backbone) just runs: there is nothing to recompute for.
at::Tensor checkpoint_sequential(torch::nn::Sequential& sequential, int64_t segments,
                                 const at::Tensor& input, const CheckpointOptions& options);
at::Tensor checkpoint_sequential(torch::nn::Sequential& sequential, int64_t segments,
                                 const at::Tensor& input);

/// Makes every submodule of `root` whose path (as in named_modules: "blocks.3",
/// "encoder.layers.0") matches one of `patterns` run under checkpoint, without changing
/// parameter names, state dicts or checkpoints. Patterns are paths or globs: `*` matches within
/// one path component, `**` across components ("blocks.*", "encoder.**.mlp"). Returns the
/// paths wrapped by this call; wrapping an already wrapped module does nothing.
///
/// How: C++ modules call their children through typed members and forward() is not virtual, so
/// volt can only interpose where the model calls a child dynamically: the entries of a
/// torch::nn::Sequential. Each matched entry's AnyModule is replaced by a wrapper that calls the
/// original under volt::checkpoint; the original stays registered under its name. Throws
/// ConfigError when a pattern matches nothing or a match is not an entry of a Sequential (then
/// call volt::checkpoint(block, x) in the parent's forward instead). A wrapped entry must take
/// and return one Tensor (else ConfigError when wrapping); a call whose input needs no gradient
/// into an entry with no trainable parameter (frozen) runs it directly. Without `options` the
/// wrapped modules use checkpoint_defaults() at each call.
std::vector<std::string> wrap_activation_checkpointing(torch::nn::Module& root,
                                                       const std::vector<std::string>& patterns,
                                                       const CheckpointOptions& options);
std::vector<std::string> wrap_activation_checkpointing(torch::nn::Module& root,
                                                       const std::vector<std::string>& patterns);

/// Whether `path` matches `pattern` in wrap_activation_checkpointing's glob syntax.
bool module_path_matches(const std::string& pattern, const std::string& path);

/// The paths of `root`'s submodules whose Sequential entry runs under checkpoint now.
std::vector<std::string> checkpointed_modules(torch::nn::Module& root);

}  // namespace volt
