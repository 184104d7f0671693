#pragma once
// Private: the buffers convert_to_fp8 adds to each Linear it converts for fp8 training (its
// delayed-scaling state: amax history, scales, gradient amax, step count). They are the
// precision's state, not weights, so a model's weights load across fp8 and plain runs: an
// fp8-trained checkpoint into a plain model (export, predict in fp32) and a plain checkpoint into
// a model converted to fp8 (fp8 fine-tuning or inference, the scaling starting fresh).

#include <torch/nn/module.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "volt/core/log.h"

namespace volt {
namespace detail {

inline constexpr const char* kFp8AmaxHistory = "fp8_amax_history";
inline constexpr const char* kFp8Scale = "fp8_scale";
inline constexpr const char* kFp8GradAmax = "fp8_grad_amax";
inline constexpr const char* kFp8Steps = "fp8_steps";

/// Whether a state-dict key ("net.fc0.fp8_scale") names one of those buffers.
inline bool is_fp8_scaling_state(const std::string& key) {
  const size_t dot = key.rfind('.');
  const std::string last = dot == std::string::npos ? key : key.substr(dot + 1);
  return last == kFp8AmaxHistory || last == kFp8Scale || last == kFp8GradAmax || last == kFp8Steps;
}

/// Decides which of a strict load's mismatches are only fp8 scaling state crossing between an
/// fp8 and a plain run: the file's state when the model has none (dropped), the model's when the
/// file has none (kept fresh). A file and a model that both have some must match as any state.
class Fp8StateCrossing {
 public:
  /// `file_keys`: the state-dict keys the file holds; `model`: the module it loads into.
  Fp8StateCrossing(const std::vector<std::string>& file_keys, const torch::nn::Module& model) {
    file_has_fp8_ = std::any_of(file_keys.begin(), file_keys.end(), is_fp8_scaling_state);
    for (const auto& b : model.named_buffers(/*recurse=*/true)) {
      model_has_fp8_ = model_has_fp8_ || is_fp8_scaling_state(b.key());
    }
  }
  /// `name` is in the model, not in the file: true to leave it as it is.
  bool skip_missing(const std::string& name) {
    if (file_has_fp8_ || !is_fp8_scaling_state(name)) return false;
    ++fresh_;
    return true;
  }
  /// `name` is in the file, not in the model: true to ignore it.
  bool skip_unexpected(const std::string& name) {
    if (model_has_fp8_ || !is_fp8_scaling_state(name)) return false;
    ++dropped_;
    return true;
  }
  /// One line saying what crossed (nothing when nothing did); `tag` names the loader.
  void log(const std::string& tag) const {
    if (dropped_ > 0) {
      log_info(tag, "the file holds fp8 scaling state (" + std::to_string(dropped_) +
                        " buffers) that this model, not converted to fp8, does not use: its "
                        "weights load without it.");
    }
    if (fresh_ > 0) {
      log_info(tag,
               "the file holds no fp8 scaling state: the model's fp8 layers start theirs "
               "fresh (" +
                   std::to_string(fresh_) + " buffers), as an fp8 run does.");
    }
  }

 private:
  bool file_has_fp8_ = false, model_has_fp8_ = false;
  int64_t fresh_ = 0, dropped_ = 0;
};

}  // namespace detail
}  // namespace volt
