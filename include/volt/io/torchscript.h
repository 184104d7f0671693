#pragma once
/// to_torchscript: a trained model as a TorchScript file that runs without volt (Lightning's
/// LightningModule.to_torchscript(method="trace")). The file loads with libtorch's
/// `torch::jit::load(path)` in any C++ program and with `torch.jit.load(path)` in Python.
///
///   #include <torch/script.h>   // torch::jit::Module and torch::jit::load (not included here)
///   volt::load_weights(*model, "runs/checkpoints/best.ckpt");         // volt/trainer/checkpoint.h
///   volt::to_torchscript(*model, example_batch.input,
///                        volt::TorchScriptOptions().file_path("model.pt"));  // its predict_step
///   // or any function of tensors over the module:
///   volt::to_torchscript(*net, [&](const std::vector<at::Tensor>& in) {
///     return std::vector<at::Tensor>{net->forward(in[0])}; }, {x});
///
/// What is exported is a trace (the same caveats as torch.jit.trace, see traced_function.h): the
/// ops one call ran, with the module in evaluation mode (restored after) and without gradients.
/// The module's parameters and buffers become the file's (copies: training the module further
/// does not change an exported one; tied weights stay one tensor); submodules keep their names
/// (Python's `m.fc1.weight`). Sizes read into C++ integers are constants of the trace:
/// `x.reshape({x.size(0), -1})` exports a model for that batch size only, where `x.flatten(1)`
/// or `x.reshape({-1, 784})` exports one for any. So after tracing, the exported module is run
/// against the function itself on the example and (`dynamic_batch`, default) on the example
/// with one more row, and a difference, or a failure, is a ValueError naming what to change. A
/// value read on the host while traced (item(), a tensor as a condition) is a ValueError too.
/// volt's fused kernels run their libtorch compositions while traced, so the file holds only
/// libtorch's own ops.
///
/// ONNX (Lightning's to_onnx) is not offered: libtorch's C++ API has no ONNX exporter (it is
/// driven from Python); load this file in Python and call torch.onnx.export on it.

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <functional>
#include <string>
#include <vector>

namespace torch {
namespace jit {
struct Module;
}  // namespace jit
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace volt {

class Module;

/// How to_torchscript traces, checks and writes.
struct TorchScriptOptions {
  /// Where to write the module (atomically: a failed write leaves no file); empty: not
  /// written, only returned.
  TORCH_ARG(std::string, file_path) = "";
  /// The exported method's name.
  TORCH_ARG(std::string, method_name) = "forward";
  /// Run the exported module against the function on the example (and, with dynamic_batch, on
  /// the example with one more row) and refuse a difference.
  TORCH_ARG(bool, check) = true;
  /// The first dimension of the inputs is a batch: check that the export works at another
  /// batch size too. The first dimension of every input whose first size equals the first
  /// input's is the batch; other inputs are passed unchanged. Set false for a model meant for
  /// the example's batch size only.
  TORCH_ARG(bool, dynamic_batch) = true;
  /// Floating outputs may differ by this much (relative and absolute) in the check; other
  /// outputs must be equal. The exported module runs the same kernels, so it is usually 0.
  TORCH_ARG(double, check_tolerance) = 1e-5;
};

/// The function exported: the module's computation on the inputs, returning one or more
/// tensors (one: the method returns a tensor; several: a tuple of them).
using ExportFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// Traces `fn` on `example_inputs` into a TorchScript module holding copies of `module`'s
/// parameters and buffers (every tensor fn reads from the module must be one of them or a
/// constant), checks it (options.check) and writes it (options.file_path). ValueError for what
/// cannot be exported, with the reason; CheckpointError for a write that failed.
torch::jit::Module to_torchscript(torch::nn::Module& module, const ExportFunction& fn,
                                  const std::vector<at::Tensor>& example_inputs,
                                  const TorchScriptOptions& options = {});

/// A volt::Module's predict_step as the method: its input is a batch's `input` (the batch's
/// target and extras are undefined / empty while traced), its output what predict_step returns.
torch::jit::Module to_torchscript(Module& module, const at::Tensor& example_input,
                                  const TorchScriptOptions& options = {});

}  // namespace volt
