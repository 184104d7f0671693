#pragma once
// Checks a raw ConfigNode tree against the schema (TrainerOptions fields and the registered
// components' Params), fills defaults and returns typed values; and writes them back as YAML.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config_tree.h"
#include "volt/core/registry.h"
#include "volt/trainer/trainer_options.h"

namespace volt {
namespace detail {

struct ComponentConfig {
  std::string class_path;
  Args args;
  const Params* params = nullptr;  // the registered entry's parameters (emit order)
};

struct ResolvedConfig {
  std::optional<int64_t> seed_everything;
  std::optional<std::string> ckpt_path;
  /// Lightning's Trainer.validate / test(verbose=...): print the results (default true).
  bool verbose = true;
  Params trainer_params;  // the schema `trainer` was checked against (emit order)
  Args trainer;
  std::vector<ComponentConfig> callbacks;
  std::vector<ComponentConfig> loggers;
  std::optional<ComponentConfig> profiler;
  /// trainer.checkpoint_io (TorchCheckpointIO, AsyncCheckpointIO); null = the strategy's own.
  std::optional<ComponentConfig> checkpoint_io;
  /// trainer.strategy given as {class_path, init_args} (a plain name stays in `trainer`).
  std::optional<ComponentConfig> strategy;
  /// trainer.precision given as a component (class_path + init_args), e.g. bf16-mixed with op
  /// lists.
  std::optional<ComponentConfig> precision;
  ComponentConfig model;
  /// Null under `data: null`: the model's own loaders (Module::train_dataloader() and the
  /// others), as LightningCLI without a data module.
  std::optional<ComponentConfig> data;
  /// LightningCLI's automatic optimizer and LR scheduler (null: the module's
  /// configure_optimizers()).
  std::optional<ComponentConfig> optimizer;
  std::optional<ComponentConfig> lr_scheduler;
};

// A class_path as Lightning's configs write it, as registered here: an import path
// ("lightning.pytorch.callbacks.ModelCheckpoint", "my_project.models.Net") by its last part when
// that is registered, and Lightning's class names of the strategies and profilers volt
// registers under other names (DDPStrategy is "ddp"; a profiler string "simple" is
// SimpleProfiler).
template <typename R>
std::string lightning_class_name(const R& reg, const std::string& written) {
  if (reg.contains(written)) return written;
  std::string name = written;
  if (const auto dot = written.rfind('.'); dot != std::string::npos && dot + 1 < written.size()) {
    name = written.substr(dot + 1);
  }
  static const std::map<std::string, std::map<std::string, std::string>> kAliases = {
      {"strategy",
       {{"DDPStrategy", "ddp"},
        {"DeepSpeedStrategy", "deepspeed"},
        {"SingleDeviceStrategy", "single_device"},
        {"ModelParallelStrategy", "model_parallel"}}},
      {"profiler",
       {{"simple", "SimpleProfiler"},
        {"pytorch", "TorchProfiler"},
        {"PyTorchProfiler", "TorchProfiler"}}},
  };
  if (const auto kind = kAliases.find(reg.kind()); kind != kAliases.end()) {
    if (const auto it = kind->second.find(name); it != kind->second.end()) name = it->second;
  }
  return reg.contains(name) ? name : written;
}

/// The TrainerOptions fields the CLI exposes (all but callbacks/loggers/seed, which the config
/// gives as trainer.callbacks, trainer.loggers and seed_everything), defaults from TrainerOptions()
/// and accelerator/strategy/precision choices from `reg`.
Params trainer_params(const Registry& reg);

/// TrainerOptions from Args checked against trainer_params (callbacks and loggers left empty).
TrainerOptions trainer_options(const Args& trainer);

/// Every key, type, required value and registered name checked; ConfigError otherwise, naming
/// the dotted key, where it was set, and the fix.
ResolvedConfig resolve(const ConfigNode& root, const Registry& reg);

/// The resolved config as YAML that --config loads back to the same values.
std::string to_yaml(const ResolvedConfig& config);

/// One value as YAML flow text ("0.001", "[256, 128]", "\"{epoch}\"", "null").
std::string yaml_value(const ParamValue& value);

}  // namespace detail
}  // namespace volt
