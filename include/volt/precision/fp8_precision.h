#pragma once
/// Fp8Precision ("fp8"): the reference's HPUPrecisionPlugin(precision="fp8") for training
/// (Linear layers in fp8 with delayed scaling, the rest bf16-mixed) and for two-step fp8
/// inference (measure, then quantize in another process).

#include <torch/arg.h>

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "volt/precision/fp8_inference.h"
#include "volt/precision/fp8_modules.h"
#include "volt/precision/mixed.h"

namespace volt {

struct Fp8PrecisionOptions {
  /// Convert the model's Linear layers at setup (the reference's replace_layers=True; false means
  /// the model brings its own fp8 layers, e.g. Fp8Linear, or calls convert_modules itself).
  /// Default: true.
  TORCH_ARG(bool, replace_layers) = true;
  /// The delayed-scaling recipe. Default: DelayedScalingOptions().
  TORCH_ARG(DelayedScalingOptions, recipe) = DelayedScalingOptions();
  /// Linear layers (qualified names) kept out of fp8, e.g. the classifier head. Default: none.
  TORCH_ARG(std::vector<std::string>, skip) = {};
  /// fp8 inference instead of training: convert for measurement (quant=false) or quantization
  /// (quant=true). Default: false.
  TORCH_ARG(bool, inference) = false;
  TORCH_ARG(bool, quant) = false;
  /// The quantization config file; empty = the QUANT_CONFIG environment variable, else defaults
  /// (QuantConfig()). Its mode must agree with `quant`. Default: "".
  TORCH_ARG(std::string, quant_config) = "";
  /// The autocast settings of everything that is not an fp8 layer. Default: bf16.
  TORCH_ARG(MixedPrecisionOptions, mixed) = MixedPrecisionOptions();
};

std::ostream& operator<<(std::ostream& os, const Fp8PrecisionOptions& o);

/// Every forward runs in an Fp8Autocast region: converted Linear layers compute in fp8 (output
/// bf16), other ops follow bf16 autocast (MixedPrecision with `mixed`, including its CPU policy
/// and op lists); weights, gradients and optimizer state stay fp32. Checkpoints carry the fp8
/// scaling state (buffers on each converted layer), so resume is exact. In inference mode the
/// measurements are written when the run (predict) ends. CPU only in this build.
class Fp8Precision : public Precision {
 public:
  explicit Fp8Precision(Fp8PrecisionOptions options = {});
  ~Fp8Precision() override;
  const Fp8PrecisionOptions& options() const { return options_; }

  /// The reference's convert_modules: training conversion (inference=false), measurement
  /// observers (inference=true, quant=false) or quantization (inference=true, quant=true).
  Fp8ConversionReport convert_modules(torch::nn::Module& model, bool inference = false,
                                      bool quant = false);
  /// The quantization config in effect (option, QUANT_CONFIG or defaults) for `quant`.
  QuantConfig quant_config(bool quant) const;

  std::string name() const override { return "fp8"; }
  void setup(c10::Device device) override;
  void teardown() override;
  void convert_module(torch::nn::Module& module) override;
  std::shared_ptr<void> forward_context() override;
  void backward(const at::Tensor& loss, Module* module) override;
  void unscale_gradients(torch::optim::Optimizer& optimizer) override;
  bool optimizer_step(torch::optim::Optimizer& optimizer) override;
  bool scales_loss() const override { return mixed_.scales_loss(); }
  void agree_on_found_inf(const std::function<bool(bool)>& any_rank) override;
  void configure_loss_scaler(const GradScalerOptions& options) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive) override;
  /// The amax histories and gradient amax of the model's fp8 layers (training), so that every
  /// rank derives the same scales from the amax over all ranks' batches.
  std::vector<at::Tensor> rank_max_state() const override;

 private:
  Fp8PrecisionOptions options_;
  MixedPrecision mixed_;
  c10::DeviceType device_ = c10::kCPU;
  bool converted_ = false;
  torch::nn::Module* model_ = nullptr;  // the module convert_module saw (until teardown)
  torch::nn::Module* measuring_ = nullptr;
  c10::optional<QuantConfig> measure_config_;
  std::shared_ptr<void> kernel_;
};

}  // namespace volt
