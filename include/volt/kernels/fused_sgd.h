#pragma once
/// FusedSGD: SGD with momentum whose step is one multi-threaded pass over all parameters.

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <iosfwd>
#include <memory>
#include <vector>

#include "volt/kernels/fused_optimizer.h"

namespace volt {

/// Hyper-parameters of FusedSGD; the same fields and defaults as torch::optim::SGDOptions.
struct FusedSGDOptions : public torch::optim::OptimizerCloneableOptions<FusedSGDOptions> {
  FusedSGDOptions(double lr);  // NOLINT: implicit, as torch::optim::SGDOptions
  /// Learning rate, >= 0 (required).
  TORCH_ARG(double, lr);
  /// Momentum factor, >= 0. Default: 0 (no momentum buffer).
  TORCH_ARG(double, momentum) = 0;
  /// Dampening of the momentum update. Default: 0.
  TORCH_ARG(double, dampening) = 0;
  /// L2 penalty added to the gradient, >= 0. Default: 0.
  TORCH_ARG(double, weight_decay) = 0;
  /// Nesterov momentum; needs momentum > 0 and dampening == 0. Default: false.
  TORCH_ARG(bool, nesterov) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
  friend bool operator==(const FusedSGDOptions& lhs, const FusedSGDOptions& rhs);
  ~FusedSGDOptions() override = default;
};

std::ostream& operator<<(std::ostream& os, const FusedSGDOptions& o);

/// Per-parameter state of FusedSGD, serialised under the same key as SGDParamState. While the
/// optimizer owns it, momentum_buffer is a view into the optimizer's flat buffer.
struct FusedSGDParamState : public torch::optim::OptimizerCloneableParamState<FusedSGDParamState> {
  TORCH_ARG(at::Tensor, momentum_buffer);

 public:
  /// Reads a standalone tensor; the optimizer copies it into its flat buffer on its next step.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes a contiguous copy of the view (never the whole flat buffer).
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const FusedSGDParamState& lhs, const FusedSGDParamState& rhs);
  ~FusedSGDParamState() override = default;
};

/// SGD (momentum, dampening, Nesterov, weight decay) on contiguous float/double/bfloat16 CPU
/// tensors, matching torch::optim::SGD step by step (bit for bit on AVX2 CPUs; bfloat16: as
/// FusedAdamW's). One step is one at::parallel_for over all parameters; momentum buffers live in
/// one flat buffer per group and dtype. Parameters without a gradient are skipped.
class FusedSGD : public torch::optim::Optimizer, public FusedOptimizer {
 public:
  /// Validates every group's options; throws ConfigError naming the bad value.
  explicit FusedSGD(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                    FusedSGDOptions defaults);
  explicit FusedSGD(std::vector<at::Tensor> params, FusedSGDOptions defaults);
  ~FusedSGD() override;
  FusedSGD(FusedSGD&&) noexcept;

  /// One step. CPU parameters: volt's kernels; CUDA parameters: libtorch's fused multi-tensor
  /// kernel (aten::_fused_sgd_, a few launches for all parameters). Throws ValueError for
  /// parameters or gradients that are not dense float tensors of matching shape and dtype
  /// (contiguous float/double/bfloat16 on CPU), NotAvailable for other devices and for CUDA in a
  /// build without libtorch's fused kernels.
  at::Tensor step(LossClosure closure = nullptr) override;
  /// torch::save / torch::load support (state keyed by position, as libtorch does).
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// Writes each param group's current lr (after a scheduler or the user changed it) to the
  /// float32 scalar on the device that the CUDA kernels read: one fill per changed group, no
  /// sync. step() does it itself, outside CUDA graph capture; call it before replaying a step
  /// captured in a graph (the Trainer's graph_training_step does), so the replay uses today's
  /// lr without capturing again. Throws NotAvailable while a graph captures. No-op before the
  /// first CUDA step and for CPU parameters.
  void sync_lrs_to_device();
  std::unique_ptr<torch::optim::OptimizerParamState> make_param_state() const override;

 private:
  void step_cuda();  // the CUDA parameters collected by step()
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace volt
