#pragma once
// The registry behind convert_to_fp8 and fp8 inference: which Linear layers are fp8 (keyed by
// their weight's storage), in which mode, and the aten::linear autocast kernel that runs them.

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fp8_core.h"

namespace volt::detail {

enum class Fp8Mode { kTrain, kMeasure, kQuantize };
/// The ops a Linear layer reaches the dispatcher through.
enum class Fp8GemmOp { kLinear = 0, kAddmm = 1, kMatmul = 2 };

struct Fp8Layer {
  std::weak_ptr<torch::nn::Module> module;
  std::string name;
  Fp8Mode mode = Fp8Mode::kTrain;
  Fp8DelayedState delayed;        ///< kTrain
  at::Tensor stats;               ///< kMeasure: [3] running max-abs of input, weight, output
  std::atomic<int64_t> calls{0};  ///< kMeasure: forwards observed
  at::Tensor scales;              ///< kQuantize: [2] input, weight
};

/// Makes `layer` the fp8 identity of the Linear whose weight is `weight` (replacing any). Found
/// again through the weight's storage (and offset), which views of it share and which keeps
/// its identity when ZeRO gives it new memory; so convert after moving the model to its device.
void attach_fp8(const at::Tensor& weight, std::shared_ptr<Fp8Layer> layer);
/// Forgets the Linear whose weight is `weight`.
void detach_fp8(const at::Tensor& weight);
/// The layer for `weight` (or a view of it at the same offset), or nullptr.
std::shared_ptr<Fp8Layer> find_fp8(const at::Tensor& weight);

/// Keeps the kernels for aten::linear, addmm and matmul registered on `device`'s autocast key
/// while held.
std::shared_ptr<void> acquire_fp8_kernel(c10::DeviceType device);
/// The dtype non-fp8 calls of `op` get inside fp8 regions; nullopt = autocast's dtype under the
/// CPU size rule (the built-in policy when no rule is installed). Set by Fp8Precision from the
/// run's op lists, which its kernels sit on top of.
void set_fp8_fallback_dtype(Fp8GemmOp op, c10::optional<c10::ScalarType> dtype);

/// Every torch::nn::Linear below `model`, with its qualified name.
std::vector<std::pair<std::string, std::shared_ptr<torch::nn::LinearImpl>>> linear_layers(
    torch::nn::Module& model);
/// linear_layers(model), or a ConfigError naming `component` when `model` is a Linear itself
/// (a conversion would find no layer inside it and do nothing).
std::vector<std::pair<std::string, std::shared_ptr<torch::nn::LinearImpl>>> convertible_linears(
    torch::nn::Module& model, const char* component);
/// Throws ConfigError "[component] <list> names "x", which is not a Linear of this model; its
/// Linear layers are: ..." for the first of `names` that is none of `linears`.
void check_linear_names(
    const std::vector<std::string>& names,
    const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::LinearImpl>>>& linears,
    const char* component, const char* list);
/// `module`'s buffer `name`, registered from `init` when absent.
at::Tensor ensure_buffer(torch::nn::Module& module, const std::string& name,
                         const at::Tensor& init);

}  // namespace volt::detail
