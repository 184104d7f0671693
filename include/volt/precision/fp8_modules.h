#pragma once
/// fp8 for existing models without editing them: convert_to_fp8 turns every torch::nn::Linear of
/// a model into an fp8 linear (the reference's `replace_layers=True`), Fp8Autocast is the region
/// in which converted layers compute in fp8 (the reference's `fp8_autocast`).

#include <c10/core/DeviceType.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "volt/precision/fp8.h"

namespace volt {

struct Fp8ConvertOptions {
  /// The delayed-scaling recipe of every converted layer. Default: DelayedScalingOptions().
  TORCH_ARG(DelayedScalingOptions, recipe) = DelayedScalingOptions();
  /// Qualified module names (as in named_modules(), e.g. "head" or "blocks.3.proj") that stay
  /// as they are. A name that matches no Linear is a ConfigError. Default: none.
  TORCH_ARG(std::vector<std::string>, skip) = {};
};

std::ostream& operator<<(std::ostream& os, const Fp8ConvertOptions& o);

/// What a conversion did: the layers now computing in fp8, and those left alone with the reason.
struct Fp8ConversionReport {
  std::vector<std::string> converted;
  std::vector<std::pair<std::string, std::string>> kept;  ///< {name, reason}
  /// One line per kept layer plus a count, for logs.
  std::string str() const;
};

/// Converts every torch::nn::Linear inside `model` (a bare Linear is refused) to an fp8 linear with
/// scaling, in place: the layer keeps its fp32 weight and bias, gains the buffers
/// fp8_amax_history, fp8_scale, fp8_grad_amax and fp8_steps (so checkpoints carry the fp8 state
/// and resume is exact), and inside an Fp8Autocast region its forward takes E4M3 operands and
/// E5M2 gradients and returns bf16. Outside such a region it is an ordinary Linear. Layers whose
/// in/out features are not multiples of 16 (the fp8 GEMM's alignment) stay as they are and are
/// listed in the report, as are skipped ones. Converting twice is a no-op for converted layers.
///
/// How: no module is replaced (C++ modules hold their children as typed members, so swapping a
/// child would leave the parent calling the old one). An autocast-key kernel for aten::linear,
/// active in Fp8Autocast regions, recognises converted layers by their weight tensor.
Fp8ConversionReport convert_to_fp8(torch::nn::Module& model, const Fp8ConvertOptions& options = {});

/// Undoes convert_to_fp8 for `model`: its layers compute as plain Linears again (the fp8
/// buffers stay, so a checkpoint written while converted still loads).
void release_fp8(torch::nn::Module& model);

/// Whether the layer whose weight is `weight` is converted (training or inference mode).
bool is_fp8_converted(const at::Tensor& weight);

/// The fp8 region (the reference's `fp8_autocast`): converted layers compute in fp8 and other
/// ops follow bf16 autocast for `device`. `enabled=false` inside a region makes converted layers
/// plain bf16 again (an fp8-free island). Nestable, per thread. CPU only in this build (the
/// emulation); a CUDA device is NotAvailable until the native fp8 path lands (issue #14).
/// Hold it for a whole loop rather than per call: the first region in a process registers a
/// dispatcher kernel, the last one to end deregisters it.
class Fp8Autocast {
 public:
  explicit Fp8Autocast(c10::DeviceType device = c10::kCPU, bool enabled = true);
  ~Fp8Autocast();
  Fp8Autocast(const Fp8Autocast&) = delete;
  Fp8Autocast& operator=(const Fp8Autocast&) = delete;
  /// Whether converted layers compute in fp8 on this thread now.
  static bool is_enabled();

 private:
  bool prev_;
  std::shared_ptr<void> registration_;
  std::shared_ptr<void> autocast_;
};

}  // namespace volt
