#pragma once
/// MixedPrecision: autocast mixed precision ("bf16-mixed", "16-mixed"): fp32 weights, gradients
/// and optimizer state; forward ops run in bf16/fp16 by autocast's policy and the user's op lists.

#include <torch/arg.h>

#include <c10/util/Optional.h>

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "volt/precision/grad_scaler.h"
#include "volt/precision/precision.h"

namespace volt {

class AutocastOpLists;

struct MixedPrecisionOptions {
  /// "bf16" or "fp16": the dtype autocast lowers to. Default: "bf16".
  TORCH_ARG(std::string, dtype) = "bf16";
  /// Operators forced to the lower dtype (the reference's LOWER_LIST), e.g. {"mm", "add.Tensor"}.
  /// Default: none.
  TORCH_ARG(std::vector<std::string>, lower_ops) = {};
  /// Operators forced to fp32 (the reference's FP32_LIST). Default: none.
  TORCH_ARG(std::vector<std::string>, fp32_ops) = {};
  /// On CPU, measure once per process whether this CPU runs bf16 matmuls and convolutions
  /// faster than fp32 (a ~50 ms probe at setup) and keep the families that lose in fp32, with
  /// one warning giving the figure, and linears below the size where bf16 starts to win in fp32
  /// (a size rule on aten::linear); the user's op lists win over both. Default: true.
  TORCH_ARG(bool, cpu_policy) = true;
  /// The size rule of the CPU policy: linears with fewer multiply-adds (rows x in x out) than
  /// this stay fp32. Unset = measured by the CPU probe; 0 = off (every linear follows autocast);
  /// set it for numerics that do not depend on a timing (e.g. the same on every rank and run);
  /// when set it also replaces the probe's all-or-nothing matmul decision (convolutions still
  /// follow the probe). Only with cpu_policy on a CPU. Default: unset.
  TORCH_ARG(c10::optional<int64_t>, linear_min_macs) = c10::nullopt;
  /// Also read the files named by the LOWER_LIST and FP32_LIST environment variables (once,
  /// when the precision is constructed). Default: true.
  TORCH_ARG(bool, read_env_lists) = true;
  /// Dynamic loss scaling; unset = on for fp16, off for bf16. Default: unset.
  TORCH_ARG(c10::optional<bool>, loss_scaling) = c10::nullopt;
  /// The loss scaler's settings (used when loss scaling is on). Default: GradScalerOptions().
  TORCH_ARG(GradScalerOptions, scaler) = GradScalerOptions();
};
std::ostream& operator<<(std::ostream& os, const MixedPrecisionOptions& o);

/// The reference's precision plugin: wraps every forward (training, validation, test, predict
/// step) in an AutocastGuard for the run's device, installs the op lists for the run, and with
/// loss scaling scales the loss, unscales gradients before clipping and skips steps whose
/// gradients are inf/NaN (schedulers and global_step do not advance). Independent of the
/// strategy: DDP and sharded strategies use it unchanged. Validated at construction
/// (ConfigError); the device is checked at setup (NotAvailable, e.g. fp16 on CPU with 1.13).
class MixedPrecision : public Precision {
 public:
  explicit MixedPrecision(MixedPrecisionOptions options = {});
  ~MixedPrecision() override;
  const MixedPrecisionOptions& options() const { return options_; }

  std::string name() const override;
  /// The autocast dtype: bf16 or fp16.
  c10::ScalarType compute_dtype() const override { return dtype_; }
  void setup(c10::Device device) override;
  void teardown() override;
  std::shared_ptr<void> forward_context() override;
  void backward(const at::Tensor& loss, Module* module) override;
  void unscale_gradients(torch::optim::Optimizer& optimizer) override;
  bool optimizer_step(torch::optim::Optimizer& optimizer) override;
  bool scales_loss() const override { return scaler_ != nullptr; }
  void agree_on_found_inf(const std::function<bool(bool)>& any_rank) override;
  void configure_loss_scaler(const GradScalerOptions& options) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive) override;

  /// How much faster this CPU runs bf16 than fp32 (fp32 time / bf16 time; < 1 means slower).
  struct CpuProbe {
    double matmul_speedup = 0;
    double conv_speedup = 0;
    /// Linears with fewer multiply-adds than this run slower in bf16 here (fixed costs of the
    /// casts and of oneDNN outweigh the faster multiply); 0 = bf16 wins at every size probed.
    int64_t matmul_min_macs = 0;
  };
  /// Measures it (forward+backward of a Linear and a Conv2d, best of 5, and of Linears from
  /// 64x768x768 down to 64x128x128 multiply-adds for the size threshold) once per machine: the
  /// figures are cached in $VOLT_CACHE_DIR (default ~/.cache/volt), one file per CPU model,
  /// thread count and libtorch version, written under a file lock, so every rank of a job and a
  /// resumed job decide the same ops; later calls in the process return the same figures.
  static const CpuProbe& cpu_probe();
  /// The ops cpu_policy keeps in fp32 for these figures: libtorch's CPU autocast matmul family
  /// when matmul_speedup < 1, its convolution family when conv_speedup < 1.
  static std::vector<std::string> cpu_fp32_ops(const CpuProbe& probe);

  /// The loss scaler, or nullptr when loss scaling is off.
  const GradScaler* scaler() const { return scaler_.get(); }
  /// The op lists installed for the current run (nullptr outside a run or when both are empty).
  const AutocastOpLists* op_lists() const { return op_lists_.get(); }

 private:
  MixedPrecisionOptions options_;
  c10::ScalarType dtype_;
  std::vector<std::string> lower_ops_, fp32_ops_;
  c10::DeviceType device_ = c10::kCPU;
  std::unique_ptr<GradScaler> scaler_;
  std::unique_ptr<AutocastOpLists> op_lists_;
  std::shared_ptr<void> size_rule_;
};

}  // namespace volt
