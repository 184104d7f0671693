#pragma once
/// fp8 inference in two steps and two processes, as the reference's quantization toolkit does:
/// measure per-layer statistics over part of a data set, then quantize from them.
///
///   // process 1: measure
///   auto cfg = volt::QuantConfig().mode(volt::QuantConfig::kMeasure).dump_stats_path("m.json");
///   volt::prepare_fp8_measurement(model, cfg);
///   { volt::Fp8Autocast fp8; for (auto& x : some_batches) model.forward(x); }
///   volt::save_fp8_measurements(model, cfg);
///   // process 2: quantize (a new process; the measuring one is refused)
///   volt::quantize_fp8(model, cfg.mode(volt::QuantConfig::kQuantize));
///   { volt::Fp8Autocast fp8; auto y = model.forward(x); }  // Linear layers in fp8, bf16 out
///
/// With the Trainer, Fp8Precision(Fp8PrecisionOptions().inference(true).quant(false|true)) does
/// the same around trainer.predict.

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "volt/precision/fp8_modules.h"

namespace volt {

/// The configuration file of both steps (the reference's QUANT_CONFIG JSON):
///   {"mode": "MEASURE" | "QUANTIZE", "observer": "maxabs",
///    "scale_method": "maxabs_hw" | "maxabs_pow2" | "unit_scale",
///    "dump_stats_path": "measurements.json",
///    "allowlist": {"names": [...], "types": [...]}, "blocklist": {"names": [...], "types": [...]}}
/// "method": "HOOKS" is accepted and ignored; any other key is a ConfigError.
struct QuantConfig {
  enum Mode { kMeasure, kQuantize };
  /// Which step this is. Default: kMeasure.
  TORCH_ARG(Mode, mode) = kMeasure;
  /// Statistic recorded per tensor: "maxabs" (the only one). Default: "maxabs".
  TORCH_ARG(std::string, observer) = "maxabs";
  /// How a scale follows from a max-abs m: "maxabs_hw" = 448 / m (the E4M3 range used fully),
  /// "maxabs_pow2" = the largest power of two <= 448 / m (exact rescaling), "unit_scale" = 1.
  /// Default: "maxabs_hw".
  TORCH_ARG(std::string, scale_method) = "maxabs_hw";
  /// The measurements file (JSON; ".json" is appended when the path lacks it). Default:
  /// "fp8_measurements.json".
  TORCH_ARG(std::string, dump_stats_path) = "fp8_measurements.json";
  /// Only these layers (qualified names) / module types ("Linear"); empty = all. Default: empty.
  TORCH_ARG(std::vector<std::string>, allowlist_names) = {};
  TORCH_ARG(std::vector<std::string>, allowlist_types) = {};
  /// Never these layers / types. Default: empty.
  TORCH_ARG(std::vector<std::string>, blocklist_names) = {};
  TORCH_ARG(std::vector<std::string>, blocklist_types) = {};

 public:  // TORCH_ARG leaves the section private
  /// Parses the JSON text (`origin` names it in errors); malformed JSON, an unknown key or a bad
  /// value is a ConfigError.
  static QuantConfig parse(const std::string& json, const std::string& origin);
  /// Reads and parses a file (missing or unreadable: ConfigError).
  static QuantConfig from_file(const std::string& path);
  /// The measurements file path actually used (dump_stats_path with ".json").
  std::string measurements_file() const;
};

/// Step 1: installs max-abs observers on the selected Linear layers of `model`. Inside an
/// Fp8Autocast region they compute as bf16 autocast does and record the max-abs of their input,
/// weight and output. Marks this process as a measuring one.
Fp8ConversionReport prepare_fp8_measurement(torch::nn::Module& model, const QuantConfig& config);

/// Writes the observed statistics to config.measurements_file() (atomically) and returns how
/// many layers it holds. No forward observed: ConfigError.
int64_t save_fp8_measurements(torch::nn::Module& model, const QuantConfig& config);

/// Step 2 (a process that did not measure): reads config.measurements_file(), computes each
/// selected layer's input and weight scales by config.scale_method and makes those layers
/// compute with E4M3 operands under these fixed scales inside Fp8Autocast regions (bf16 out).
/// A missing or malformed file, a layer the file does not hold, a shape that differs, or a file
/// naming layers this model lacks (measured on another model) is a ConfigError.
Fp8ConversionReport quantize_fp8(torch::nn::Module& model, const QuantConfig& config);

}  // namespace volt
