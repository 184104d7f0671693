#pragma once
/// FusedAdamW: AdamW (or Adam) whose step is one multi-threaded pass over all parameters.

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <tuple>
#include <vector>

#include "volt/kernels/fused_optimizer.h"

namespace volt {

/// Hyper-parameters of FusedAdamW; the same fields and defaults as torch::optim::AdamWOptions,
/// plus the Adam mode switch and bias correction.
struct FusedAdamWOptions : public torch::optim::OptimizerCloneableOptions<FusedAdamWOptions> {
  FusedAdamWOptions(double lr = 1e-3);  // NOLINT: implicit, as torch::optim::AdamWOptions
  /// Learning rate, >= 0. Default: 1e-3.
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  /// Decay rates of the first and second moment, each in [0, 1). Default: (0.9, 0.999).
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Term added to the denominator, >= 0. Default: 1e-8.
  TORCH_ARG(double, eps) = 1e-8;
  /// Weight decay, >= 0 (decoupled in AdamW mode, an L2 term in Adam mode). Default: 1e-2.
  TORCH_ARG(double, weight_decay) = 1e-2;
  /// Use the maximum of past second moments (AMSGrad). Default: false.
  TORCH_ARG(bool, amsgrad) = false;
  /// true: AdamW (p *= 1 - lr*wd); false: torch::optim::Adam (g += wd*p). Default: true.
  TORCH_ARG(bool, adam_w_mode) = true;
  /// Divide the moments by 1 - beta^step; false uses them as they are. Default: true.
  TORCH_ARG(bool, bias_correction) = true;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
  friend bool operator==(const FusedAdamWOptions& lhs, const FusedAdamWOptions& rhs);
  ~FusedAdamWOptions() override = default;
};

std::ostream& operator<<(std::ostream& os, const FusedAdamWOptions& o);

/// Per-parameter state of FusedAdamW, serialised under the same keys as AdamWParamState.
/// While the optimizer owns it, the tensors are views into the optimizer's flat buffers.
struct FusedAdamWParamState
    : public torch::optim::OptimizerCloneableParamState<FusedAdamWParamState> {
  /// Steps this parameter has taken (it advances only when the parameter has a gradient).
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(at::Tensor, exp_avg);
  TORCH_ARG(at::Tensor, exp_avg_sq);
  /// Defined only with amsgrad.
  TORCH_ARG(at::Tensor, max_exp_avg_sq) = {};

 public:
  /// Reads standalone tensors; the optimizer copies them into its flat buffers on its next step.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes contiguous copies of the views (never the whole flat buffer).
  void serialize(torch::serialize::OutputArchive& archive) const override;
  friend bool operator==(const FusedAdamWParamState& lhs, const FusedAdamWParamState& rhs);
  ~FusedAdamWParamState() override = default;
};

/// AdamW (adam_w_mode=true) or Adam (false) on contiguous float/double/bfloat16 CPU tensors,
/// matching torch::optim::AdamW / Adam step by step (bit for bit on AVX2 CPUs; bfloat16: one
/// rounding per libtorch op, bit for bit where libtorch's vector kernels run, within two ulps in
/// their scalar tails). One step is one at::parallel_for over all parameters; the state lives in
/// one flat buffer per group, dtype and state kind. Parameters without a gradient are skipped and
/// their step count does not advance.
class FusedAdamW : public torch::optim::Optimizer, public FusedOptimizer {
 public:
  /// Validates every group's options; throws ConfigError naming the bad value.
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                      FusedAdamWOptions defaults = {});
  explicit FusedAdamW(std::vector<at::Tensor> params, FusedAdamWOptions defaults = {});
  ~FusedAdamW() override;
  FusedAdamW(FusedAdamW&&) noexcept;

  /// One step. CPU parameters: volt's kernels; CUDA parameters: libtorch's fused multi-tensor
  /// kernels (aten::_fused_adamw_ / _fused_adam_, a few launches for all parameters; state in
  /// per-parameter tensors on the device, step counts also on the device). Throws ValueError
  /// for parameters or gradients that are not dense float tensors of matching shape and dtype
  /// (contiguous float/double/bfloat16 on CPU), NotAvailable for other devices, for CUDA in a build
  /// without libtorch's fused kernels, and for bias_correction=false on CUDA.
  at::Tensor step(LossClosure closure = nullptr) override;
  /// torch::save / torch::load support (state keyed by position, as libtorch does).
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// Copies the step counts of CUDA parameters from the device, where the kernels advance them
  /// (a step replayed from a CUDA graph advances only those), into the states that save() and
  /// state() show. Reads the device (a host sync). The Trainer calls it before checkpoints.
  void sync_steps_from_device();
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
