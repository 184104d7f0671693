#pragma once
/// Settings of graph capture and replay (the reference's make_graphed_callables warm-up,
/// ModuleCacher's max_graphs, wrap_in_hpu_graph's asynchronous and disable_tensor_cache), and
/// the check that inputs can be captured at all.
/// GraphedModule, make_graphed_callable, wrap_in_graph and TrainerOptions::graph_options take
/// them (volt/graphs/graphed_module.h).

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <torch/arg.h>

#include <cstdint>
#include <iosfwd>
#include <string>

namespace volt {

struct GraphOptions {
  /// Eager runs before capture (on a side stream, on CUDA), so that lazy initialisation
  /// (library handles, autograd buffers, optimizer state) happens outside the graph; >= 1.
  /// Default: 3, as torch.cuda.make_graphed_callables.
  TORCH_ARG(int64_t, warmup_iters) = 3;
  /// Graphs kept per cache (ModuleCacher's max_graphs): a new input signature beyond this many
  /// evicts the least recently used graph and its memory; >= 1. Default: 8.
  TORCH_ARG(int64_t, max_graphs) = 8;
  /// Return from a replay once its work is queued (true) or after the device finished it
  /// (false: errors surface at the call, timings are honest). Default: false, as the reference.
  TORCH_ARG(bool, asynchronous) = false;
  /// Copy a replay's outputs out of the graph's static buffers, so no caller keeps graph memory
  /// alive between replays (wrap_in_hpu_graph's disable_tensor_cache). Default: false.
  TORCH_ARG(bool, disable_tensor_cache) = false;

 public:
  /// Throws ConfigError naming the first invalid value.
  void validate() const;
};

std::ostream& operator<<(std::ostream& os, const GraphOptions& o);

/// Why `inputs` cannot be captured into a graph, or "" when they can: every defined input must
/// be a dense (strided) CUDA tensor, all on one device, and at least one must be defined.
/// CPU tensors are named with their index, dtype and shape.
std::string graph_capture_reason(at::ArrayRef<at::Tensor> inputs);

/// Throws NotAvailable "[Graphs] <where>: <reason>; ..." when graph_capture_reason is not empty.
void check_graph_capture(at::ArrayRef<at::Tensor> inputs, const std::string& where);

}  // namespace volt
