#pragma once
/// Model and optimizer state keyed by parameter *name*, portable across runs and libtorch versions.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <string>
#include <vector>

namespace volt {

/// Writes every named parameter and buffer of `module`.
void save_module_state(const torch::nn::Module& module, torch::serialize::OutputArchive& archive);
/// Loads parameters and buffers in place. With strict=true a missing, unexpected or differently
/// shaped entry throws CheckpointError listing every mismatch (name and both shapes) and leaves
/// the module as it was; with strict=false the entries that match are loaded, and those whose
/// shape differs (torch raises for them even then) are named in a warning. Entries
/// named in `ignore` are neither loaded nor unexpected (records a strategy keeps beside the
/// weights, e.g. a tensor-parallel shard's layout).
void load_module_state(torch::nn::Module& module, torch::serialize::InputArchive& archive,
                       bool strict = true, const std::vector<std::string>& ignore = {});

/// Writes the optimizer's param-group options (lr, betas, ...) and per-parameter state keyed
/// by the parameter's name in `module` (libtorch itself keys it by pointer address).
void save_optimizer_state(const torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                          torch::serialize::OutputArchive& archive);
/// Restores what save_optimizer_state wrote into an optimizer over the same named parameters.
/// Supports SGD, Adam, AdamW, RMSprop, Adagrad and volt's fused optimizers (FusedOptimizer);
/// other types throw ConfigError.
void load_optimizer_state(torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                          torch::serialize::InputArchive& archive);

/// A new, empty per-parameter state object of the type `optimizer` keeps (SGD, Adam, AdamW,
/// RMSprop, Adagrad, FusedSGD, FusedAdamW); ConfigError for other types.
std::unique_ptr<torch::optim::OptimizerParamState> new_optimizer_param_state(
    const torch::optim::Optimizer& optimizer);

/// Resets every gradient of the optimizer's parameters to undefined (set_to_none semantics on
/// every libtorch version).
void zero_grad(torch::optim::Optimizer& optimizer);

}  // namespace volt
