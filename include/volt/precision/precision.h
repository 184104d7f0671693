#pragma once
/// Precision: how forward, backward and the optimizer step treat numeric formats.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "volt/core/batch.h"
#include "volt/core/types.h"

namespace volt {

struct GradScalerOptions;
class Module;

/// Base class of all precision modes. The default implementation is plain fp32 ("32-true");
/// mixed modes override forward_context (autocast), backward (loss scaling) and
/// optimizer_step (unscale, skip on inf). Precision never talks to process groups.
class Precision {
 public:
  virtual ~Precision() = default;
  /// Registry name ("32-true").
  virtual std::string name() const = 0;
  /// The dtype the model's floating-point math runs in: fp32 here (32-true, and fp8's
  /// emulation, whose matmuls run in fp32), bf16 or fp16 for the mixed and half modes. The
  /// Trainer's default thread count depends on it: below fp32 the GEMMs run in oneDNN, which
  /// threads through libtorch's pool, so the Trainer keeps libtorch's count instead of its
  /// fp32 choice (TrainerOptions::num_threads).
  virtual c10::ScalarType compute_dtype() const { return c10::kFloat; }
  /// Called once per run before convert_module with the device the run trains on (mixed modes
  /// pick the autocast device here and check it is supported).
  virtual void setup(c10::Device device) {}
  /// Called when the run ends (also on errors): undoes process-wide changes made in setup.
  virtual void teardown() {}
  /// While the returned object lives, floating tensors made without a dtype (a module's
  /// parameters and buffers as it is built) are made in the dtype convert_module would give them
  /// (Lightning's Precision.tensor_init_context / module_init_context): bf16-true's bfloat16, so
  /// a model built inside never holds an fp32 copy. Null for the modes whose weights stay fp32
  /// (32-true, the mixed modes, fp8). Process-wide, as torch.set_default_dtype.
  virtual std::shared_ptr<void> tensor_init_context() { return nullptr; }
  /// Converts parameters/buffers of `module` as the mode requires (no-op for fp32).
  virtual void convert_module(torch::nn::Module& module) {}
  /// Converts a batch's floating tensors as the mode requires (bf16-true: to bf16).
  virtual Batch convert_input(const Batch& batch) const { return batch; }
  /// RAII scope active around every forward (training/validation/test/predict step).
  virtual std::shared_ptr<void> forward_context() { return nullptr; }
  /// Backpropagates `loss`: mixed modes scale it first, then `module`'s backward hook runs
  /// (Module::backward, as Lightning's Precision.backward calls the LightningModule's);
  /// `loss.backward()` when `module` is null (a precision used outside a Trainer). The backward
  /// runs out of autocast even when called inside a forward context (manual_backward in a
  /// training_step), as automatic optimization's does.
  virtual void backward(const at::Tensor& loss, Module* module);
  /// Makes gradients true-scale (undoes loss scaling); no-op for fp32.
  virtual void unscale_gradients(torch::optim::Optimizer& optimizer) {}
  /// Clips this optimizer's gradients in place. For kNorm returns the total norm as a 0-dim
  /// tensor, on the gradients' device and not read (reading it is a host sync on CUDA; the
  /// built-in precisions never read it, so a CUDA graph can capture the clip); for kValue an
  /// undefined tensor.
  virtual at::Tensor clip_gradients(torch::optim::Optimizer& optimizer, double value,
                                    ClipAlgorithm algorithm);
  /// Runs optimizer.step(); returns false when the step was skipped (e.g. inf gradients).
  virtual bool optimizer_step(torch::optim::Optimizer& optimizer);
  /// Whether optimizer_step() applies dynamic loss scaling (skips steps with inf/NaN gradients
  /// and updates the scale once per call). Default: false.
  virtual bool scales_loss() const { return false; }
  /// Loss scaling with sharded gradients (ZeRO): after unscale_gradients() each rank has
  /// checked only the gradients it holds. `any_rank(found)` returns whether any rank found
  /// inf/NaN; the precision takes that as its own finding, so that every rank skips the step or
  /// none does. Called once per step on every rank. Without loss scaling it calls nothing.
  virtual void agree_on_found_inf(const std::function<bool(bool)>& any_rank) {}
  /// Replaces the loss scaler's settings before the run (a strategy with its own loss-scaling
  /// configuration, such as DeepSpeed's fp16 section, calls it at construction). Without loss
  /// scaling it does nothing.
  virtual void configure_loss_scaler(const GradScalerOptions& options) {}
  virtual void save_state(torch::serialize::OutputArchive& archive) const {}
  virtual void load_state(torch::serialize::InputArchive& archive) {}
  /// State every data-parallel rank must hold alike although each computes it from its own
  /// batch (fp8's amax histories, from which the scales are derived): after each backward a
  /// distributed strategy replaces every tensor with its elementwise max over the ranks, as
  /// Transformer Engine reduces amax over its fp8 group. Default: none.
  virtual std::vector<at::Tensor> rank_max_state() const { return {}; }
};

}  // namespace volt
