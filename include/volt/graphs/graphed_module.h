#pragma once
/// Graphed callables and modules: the reference's make_graphed_callables, ModuleCacher and
/// wrap_in_hpu_graph, on CUDA graphs (volt/graphs/cuda_graph.h).
///
/// A C++ module has no generic forward, so each of these takes the forward as a function of a
/// list of tensors (the reference's rule too: tensors in, tensors out, no dicts or lists inside)
/// and the module whose parameters and training mode it uses:
///
///   auto fwd = [&](const volt::TensorList& in) { return volt::TensorList{net->forward(in[0])}; };
///   // One input signature, forward and backward graphs (make_graphed_callables):
///   volt::GraphedCallable g = volt::make_graphed_callable(*net, fwd, {sample});
///   at::Tensor loss = loss_fn(g({x})[0], y);  loss.backward();  // replays both graphs
///   // Any signature, a graph per signature, least recently used evicted (ModuleCacher):
///   volt::GraphedModule cached(*net, fwd, volt::GraphOptions().max_graphs(4));
///   // Inference (wrap_in_hpu_graph): forward graphs under no_grad.
///   volt::GraphedModule infer = volt::wrap_in_graph(*net, fwd);
///
/// Outputs of a replay alias the graph's static output buffers and are overwritten by the next
/// replay, unless GraphOptions::disable_tensor_cache copies them out. Forward and backward
/// graphs share one memory pool: replay forward then backward, once each, per step (as the
/// reference). Warm-up runs the forward and autograd::grad (which accumulates nothing into
/// .grad) warmup_iters times; a module with running statistics (BatchNorm) updates them then.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "volt/graphs/graph_cache.h"
#include "volt/graphs/graph_options.h"

namespace volt {

using TensorList = std::vector<at::Tensor>;
using TensorFunction = std::function<TensorList(const TensorList&)>;

namespace detail {
struct GraphedState;
}  // namespace detail

/// A forward graph and, when the capture had anything to differentiate, a backward graph,
/// replayed through autograd: calling it replays the forward; backward through its outputs
/// replays the backward and passes the gradients on (to parameters' .grad as usual).
class GraphedCallable {
 public:
  /// Copies `inputs` into the static inputs (skipped for an input that is the static input),
  /// replays. Inputs must have the captured shapes, dtypes and devices (ValueError otherwise).
  /// When the module's training mode differs from the captured one, runs the function eagerly
  /// (as the reference).
  TensorList operator()(const TensorList& inputs) const;
  /// True when a backward graph was captured.
  bool has_backward() const;
  /// Forward replays so far.
  int64_t replays() const;
  /// The signature the graphs were captured for.
  const GraphKey& key() const;

  explicit GraphedCallable(std::shared_ptr<detail::GraphedState> state);

 private:
  std::shared_ptr<detail::GraphedState> state_;
};

/// Captures `forward` on `sample_args` (CUDA tensors; a sample's requires_grad says whether its
/// gradient is wanted) after options.warmup_iters() warm-up runs on a side stream. With grad
/// mode on and anything requiring grad (a sample or a parameter of `module`), captures the
/// backward too. Throws NotAvailable for CPU tensors or a build without CUDA.
GraphedCallable make_graphed_callable(torch::nn::Module& module, TensorFunction forward,
                                      const TensorList& sample_args,
                                      const GraphOptions& options = {},
                                      const std::string& name = "graphed_callable");

/// A module's forward, graphed per input signature (the reference's ModuleCacher): the first
/// call with a new signature (shapes, dtypes, devices, requires_grad, training mode, grad mode)
/// captures a GraphedCallable, later ones replay it; beyond options.max_graphs() the least
/// recently used is dropped first. Hits, misses and evictions are counted (stats()).
class GraphedModule {
 public:
  GraphedModule(torch::nn::Module& module, TensorFunction forward, GraphOptions options = {},
                std::string name = "GraphedModule");
  GraphedModule(GraphedModule&&) = default;
  GraphedModule& operator=(GraphedModule&&) = default;
  TensorList operator()(const TensorList& inputs);
  const GraphCacheStats& stats() const { return cache_.stats(); }
  size_t size() const { return cache_.size(); }
  const GraphOptions& options() const { return options_; }
  /// Whether calls run under no_grad (wrap_in_graph).
  bool inference() const { return inference_; }
  /// Drops every graph (after parameters were re-allocated, e.g. moved to another device).
  void clear() { cache_.clear(); }

 private:
  friend GraphedModule wrap_in_graph(torch::nn::Module&, TensorFunction, GraphOptions, std::string);
  GraphedModule(torch::nn::Module& module, TensorFunction forward, GraphOptions options,
                std::string name, bool inference);
  TensorList call(const TensorList& inputs);
  torch::nn::Module* module_;
  TensorFunction forward_;
  GraphOptions options_;
  std::string name_;
  bool inference_ = false;
  GraphCache<GraphedCallable> cache_;
};

/// Inference graphs (the reference's wrap_in_hpu_graph): a GraphedModule whose calls run under
/// no_grad and capture forward graphs only. options.asynchronous(false) waits for the replay
/// to finish before returning; disable_tensor_cache(true) returns copies of the outputs.
GraphedModule wrap_in_graph(torch::nn::Module& module, TensorFunction forward,
                            GraphOptions options = {}, std::string name = "wrap_in_graph");

}  // namespace volt
