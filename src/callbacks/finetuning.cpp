#include "volt/callbacks/finetuning.h"

#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iterator>
#include <limits>
#include <ostream>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "callbacks/detail/batch_norm.h"
#include "core/detail/archive_values.h"
#include "core/detail/numbers.h"
#include "core/detail/parameter_names.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/loop_state.h"
#include "volt/core/module.h"
#include "volt/core/optimizer_config.h"

namespace volt {
namespace {

using detail::batch_norm_of;

int64_t batches_tracked(const detail::BatchNormView& bn) {
  const at::Tensor& t = *bn.num_batches_tracked;
  return t.defined() ? t.item<int64_t>() : 0;
}

void set_batches_tracked(const detail::BatchNormView& bn, int64_t value) {
  at::Tensor& t = *bn.num_batches_tracked;
  if (t.defined()) t.fill_(value);
}

// `m`'s own parameters (not its submodules'), defined ones only.
std::vector<at::Tensor> own_parameters(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters(/*recurse=*/false)) {
    if (p.defined()) out.push_back(p);
  }
  return out;
}

// Every BatchNorm layer under `root` (itself included) by its dotted name.
std::map<std::string, torch::nn::Module*> batch_norms_by_name(torch::nn::Module& root) {
  std::map<std::string, torch::nn::Module*> out;
  root.apply([&](const std::string& name, torch::nn::Module& m) {
    if (batch_norm_of(m)) out.emplace(name, &m);
  });
  return out;
}

c10::IValue strings(const std::vector<std::string>& v) {
  return c10::IValue(c10::List<std::string>(v));
}

std::vector<std::string> read_strings(torch::serialize::InputArchive& ar, const std::string& key) {
  c10::IValue v;
  ar.read(key, v);
  std::vector<std::string> out;
  for (const auto& s : c10::impl::toTypedList<std::string>(v.toList())) out.push_back(s);
  return out;
}

int64_t read_int(torch::serialize::InputArchive& ar, const std::string& key) {
  c10::IValue v;
  ar.read(key, v);
  return v.toInt();
}

// Python's str(round(value, decimals)): the shortest text that reads back as the rounded value.
std::string rounded(double value, int64_t decimals) {
  const double scale = std::pow(10.0, static_cast<double>(decimals));
  const double r = std::isfinite(value * scale) ? std::round(value * scale) / scale : value;
  std::string text;
  for (int digits = 15; digits <= 17; ++digits) {
    auto os = detail::c_stream<std::ostringstream>();
    os << std::setprecision(digits) << r;
    text = os.str();
    if (detail::c_strtod(text.c_str(), nullptr) == r) break;
  }
  return text;
}

// Whether `group` holds `modules`' parameters (the group the unfreeze added).
bool holds_any_of(const torch::optim::OptimizerParamGroup& group, torch::nn::Module& modules) {
  std::unordered_set<const void*> mine;
  for (const auto& p : modules.parameters(true)) mine.insert(p.unsafeGetTensorImpl());
  for (const auto& p : group.params()) {
    if (mine.count(p.unsafeGetTensorImpl())) return true;
  }
  return false;
}

}  // namespace

// ------------------------------------------------------------------------------ BaseFinetuning

std::vector<torch::nn::Module*> BaseFinetuning::flatten_modules(torch::nn::Module& modules) {
  std::vector<torch::nn::Module*> out;
  std::unordered_set<torch::nn::Module*> seen;
  modules.apply([&](torch::nn::Module& m) {
    if (!(m.children().empty() || !own_parameters(m).empty())) return;
    if (seen.insert(&m).second) out.push_back(&m);
  });
  return out;
}

std::vector<at::Tensor> BaseFinetuning::filter_params(torch::nn::Module& modules, bool train_bn,
                                                      bool requires_grad) {
  std::vector<at::Tensor> out;
  std::unordered_set<const void*> seen;  // tied parameters once
  for (torch::nn::Module* m : flatten_modules(modules)) {
    if (!train_bn && batch_norm_of(*m)) continue;
    for (const at::Tensor& p : own_parameters(*m)) {
      if (p.requires_grad() == requires_grad && seen.insert(p.unsafeGetTensorImpl()).second) {
        out.push_back(p);
      }
    }
  }
  return out;
}

std::vector<at::Tensor> BaseFinetuning::filter_on_optimizer(
    const torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params) {
  std::unordered_set<const void*> held;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) held.insert(p.unsafeGetTensorImpl());
  }
  std::vector<at::Tensor> out;
  size_t skipped = 0;
  for (const auto& p : params) {
    if (held.count(p.unsafeGetTensorImpl())) {
      ++skipped;
    } else {
      out.push_back(p);
    }
  }
  if (skipped > 0) {
    log_warning("BaseFinetuning",
                std::to_string(skipped) + " of the " + std::to_string(params.size()) +
                    " parameters to unfreeze are already in a param group of the optimizer and "
                    "were skipped (they train at that group's rate). If configure_optimizers gave "
                    "the optimizer every parameter, give it only those that require a gradient, "
                    "so that the unfrozen ones get a param group of their own.");
  }
  return out;
}

void BaseFinetuning::make_trainable(torch::nn::Module& modules) {
  for (torch::nn::Module* m : flatten_modules(modules)) {
    if (detail::BatchNormView bn = batch_norm_of(*m)) {
      auto it = frozen_bn_.find(m);
      if (it != frozen_bn_.end()) {
        bn.options->momentum(it->second.momentum);
        set_batches_tracked(bn, it->second.num_batches_tracked);
        frozen_bn_.erase(it);
      }
    }
    for (at::Tensor& p : own_parameters(*m)) p.set_requires_grad(true);
  }
}

void BaseFinetuning::freeze_module(torch::nn::Module& module) {
  // libtorch's BatchNorm updates its running statistics whenever it trains, whatever
  // track_running_stats says; momentum 0 keeps them (PyTorch: track_running_stats = False).
  if (detail::BatchNormView bn = batch_norm_of(module)) {
    const FrozenBatchNorm was{bn.options->momentum(), batches_tracked(bn)};
    if (frozen_bn_.emplace(&module, was).second) bn.options->momentum(0.0);
  }
  for (at::Tensor& p : own_parameters(module)) p.set_requires_grad(false);
}

void BaseFinetuning::freeze(torch::nn::Module& modules, bool train_bn) {
  for (torch::nn::Module* m : flatten_modules(modules)) {
    if (train_bn && batch_norm_of(*m)) {
      make_trainable(*m);
    } else {
      freeze_module(*m);
    }
  }
}

void BaseFinetuning::unfreeze_and_add_param_group(torch::nn::Module& modules,
                                                  torch::optim::Optimizer& optimizer,
                                                  c10::optional<double> lr, double initial_denom_lr,
                                                  bool train_bn) {
  VOLT_CHECK(!lr || (*lr >= 0 && std::isfinite(*lr)), ConfigError, "[BaseFinetuning] lr=", *lr,
             " for the unfrozen param group must be >= 0 and finite.");
  VOLT_CHECK(initial_denom_lr > 0 && std::isfinite(initial_denom_lr), ConfigError,
             "[BaseFinetuning] initial_denom_lr=", initial_denom_lr,
             " must be positive and finite; the new group's rate is the first group's divided by "
             "it.");
  VOLT_CHECK(!optimizer.param_groups().empty(), ConfigError,
             "[BaseFinetuning] the optimizer has no param group to take the rate from; give it "
             "the trainable parameters in configure_optimizers.");
  std::unordered_set<const void*> was_frozen;
  for (const auto& p : filter_params(modules, train_bn, /*requires_grad=*/false)) {
    was_frozen.insert(p.unsafeGetTensorImpl());
  }
  std::unordered_set<const void*> held;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) held.insert(p.unsafeGetTensorImpl());
  }
  make_trainable(modules);
  const double params_lr = lr ? *lr : optimizer.param_groups().front().options().get_lr();
  const double denom_lr = lr ? 1.0 : initial_denom_lr;
  // Parameters that trained all along (BatchNorm layers that freeze kept trainable) and that the
  // optimizer holds already are skipped without a word; filter_on_optimizer warns about the
  // others it skips (frozen ones the optimizer held: configure_optimizers took every parameter).
  std::vector<at::Tensor> candidates;
  for (const auto& p : filter_params(modules, train_bn, /*requires_grad=*/true)) {
    const void* impl = p.unsafeGetTensorImpl();
    if (was_frozen.count(impl) || !held.count(impl)) candidates.push_back(p);
  }
  std::vector<at::Tensor> params = filter_on_optimizer(optimizer, candidates);
  if (params.empty()) return;
  optimizer.add_param_group(torch::optim::OptimizerParamGroup(std::move(params)));
  optimizer.param_groups().back().options().set_lr(params_lr / denom_lr);
}

void BaseFinetuning::setup(RunContext& run, Module& module, Stage stage) {
  VOLT_CHECK(stage != Stage::kFit || run.strategy_name() != "deepspeed", ConfigError, "[",
             state_key(),
             "] does not work with the deepspeed strategy: ZeRO partitions the trainable "
             "parameters and their optimizer state once, when fit starts, so layers unfrozen "
             "later could not train (Lightning refuses it too); use strategy \"ddp\" or one "
             "process.");
  root_ = &module;
  // Layers this callback froze in another module (a callback reused for a new model) are
  // forgotten, so that a layer of this one at a reused address is frozen afresh.
  std::unordered_set<torch::nn::Module*> here;
  for (const auto& named : batch_norms_by_name(module)) here.insert(named.second);
  for (auto it = frozen_bn_.begin(); it != frozen_bn_.end();) {
    it = here.count(it->first) ? std::next(it) : frozen_bn_.erase(it);
  }
  if (stage == Stage::kFit) {  // a new fit; a resume loads the state after this
    finetuned_epoch_ = -1;
    groups_.clear();
    loaded_.reset();
  }
  freeze_before_training(module);
}

void BaseFinetuning::on_train_epoch_start(RunContext& run, Module& module) {
  const int64_t epoch = run.state().epoch;
  // A fit resumed inside an epoch starts that epoch again: its finetuning already happened.
  if (epoch > finetuned_epoch_) {
    for (auto& config : run.optimizer_configs()) {
      finetune_function(module, epoch, *config.optimizer());
    }
    finetuned_epoch_ = epoch;
  }
  record_groups(run, module);
}

void BaseFinetuning::record_groups(RunContext& run, Module& module) {
  const auto names = detail::parameter_names_by_impl(module);
  groups_.clear();
  for (auto& config : run.optimizer_configs()) {
    std::vector<std::vector<std::string>> groups;
    for (const auto& group : config.optimizer()->param_groups()) {
      std::vector<std::string> one;
      for (const auto& p : group.params()) {
        auto it = names.find(p.unsafeGetTensorImpl());
        one.push_back(it == names.end() ? std::string() : it->second);
      }
      groups.push_back(std::move(one));
    }
    groups_.push_back(std::move(groups));
  }
}

void BaseFinetuning::save_state(torch::serialize::OutputArchive& archive) const {
  archive.write("finetuned_epoch", c10::IValue(finetuned_epoch_));
  std::vector<std::string> frozen;
  std::vector<std::string> bn_names;
  std::vector<double> bn_momenta;
  std::vector<int64_t> bn_batches;
  if (root_ != nullptr) {
    for (const auto& p : root_->named_parameters(true)) {
      if (p.value().defined() && !p.value().requires_grad()) frozen.push_back(p.key());
    }
    for (const auto& [name, m] : batch_norms_by_name(*root_)) {
      auto it = frozen_bn_.find(m);
      if (it == frozen_bn_.end()) continue;
      bn_names.push_back(name);
      const auto& momentum = it->second.momentum;
      bn_momenta.push_back(momentum ? *momentum : std::numeric_limits<double>::quiet_NaN());
      bn_batches.push_back(it->second.num_batches_tracked);
    }
  }
  archive.write("frozen_params", strings(frozen));
  archive.write("frozen_batch_norms", strings(bn_names));
  archive.write("frozen_batch_norm_momenta", detail::double_list(bn_momenta));
  archive.write("frozen_batch_norm_batches", c10::IValue(c10::List<int64_t>(bn_batches)));
  archive.write("optimizers", c10::IValue(static_cast<int64_t>(groups_.size())));
  for (size_t i = 0; i < groups_.size(); ++i) {
    const std::string key = "optimizer_" + std::to_string(i);
    archive.write(key + "_groups", c10::IValue(static_cast<int64_t>(groups_[i].size())));
    for (size_t g = 0; g < groups_[i].size(); ++g) {
      archive.write(key + "_group_" + std::to_string(g), strings(groups_[i][g]));
    }
  }
}

void BaseFinetuning::load_state(torch::serialize::InputArchive& archive) {
  Saved s;
  s.finetuned_epoch = read_int(archive, "finetuned_epoch");
  s.frozen_params = read_strings(archive, "frozen_params");
  const std::vector<std::string> bn_names = read_strings(archive, "frozen_batch_norms");
  c10::IValue momenta_iv;
  archive.read("frozen_batch_norm_momenta", momenta_iv);
  const auto momenta = momenta_iv.toDoubleList();
  c10::IValue batches_iv;
  archive.read("frozen_batch_norm_batches", batches_iv);
  const auto batches = batches_iv.toIntList();
  VOLT_CHECK(momenta.size() == bn_names.size() && batches.size() == bn_names.size(),
             CheckpointError, "[BaseFinetuning] the checkpoint lists ", bn_names.size(),
             " frozen BatchNorm layers but ", momenta.size(), " momenta and ", batches.size(),
             " batch counts; it is damaged.");
  for (size_t i = 0; i < bn_names.size(); ++i) {
    const double m = momenta.get(i);
    s.frozen_bn[bn_names[i]] = {std::isnan(m) ? c10::nullopt : c10::optional<double>(m),
                                batches.get(i)};
  }
  const int64_t optimizers = read_int(archive, "optimizers");
  for (int64_t i = 0; i < optimizers; ++i) {
    const std::string key = "optimizer_" + std::to_string(i);
    const int64_t groups = read_int(archive, key + "_groups");
    std::vector<std::vector<std::string>> one;
    for (int64_t g = 0; g < groups; ++g) {
      one.push_back(read_strings(archive, key + "_group_" + std::to_string(g)));
    }
    s.groups.push_back(std::move(one));
  }
  finetuned_epoch_ = s.finetuned_epoch;
  loaded_ = std::move(s);
}

void BaseFinetuning::on_load_optimizer_states(RunContext& run, Module& module) {
  if (!loaded_) return;
  Saved s = std::move(*loaded_);
  loaded_.reset();
  // Which parameters train and which BatchNorm layers are frozen, as when the checkpoint was
  // written (setup froze what freeze_before_training freezes at the start of a fit).
  const std::set<std::string> frozen(s.frozen_params.begin(), s.frozen_params.end());
  for (auto& p : module.named_parameters(true)) {
    if (p.value().defined()) p.value().set_requires_grad(frozen.count(p.key()) == 0);
  }
  for (const auto& [name, m] : batch_norms_by_name(module)) {
    const detail::BatchNormView bn = batch_norm_of(*m);
    auto want = s.frozen_bn.find(name);
    auto is = frozen_bn_.find(m);
    if (want != s.frozen_bn.end()) {
      frozen_bn_[m] = want->second;  // what the layer had before it was first frozen
      bn.options->momentum(0.0);
    } else if (is != frozen_bn_.end()) {
      // Frozen by this fit's setup but trainable in the checkpoint: its restored state stands.
      bn.options->momentum(is->second.momentum);
      frozen_bn_.erase(is);
    }
  }
  // The param groups added during the run being resumed, in their order, so that the
  // optimizers' saved states (read next, with each group's options) fit.
  auto& configs = run.optimizer_configs();
  if (s.groups.empty()) return;
  VOLT_CHECK(s.groups.size() == configs.size(), CheckpointError,
             "[BaseFinetuning] the checkpoint "
             "was written with ",
             s.groups.size(), " optimizers but configure_optimizers returned ", configs.size(),
             "; resume with the same configure_optimizers.");
  std::map<std::string, at::Tensor> by_name;
  for (const auto& p : module.named_parameters(true)) by_name.emplace(p.key(), p.value());
  const auto names = detail::parameter_names_by_impl(module);
  for (size_t i = 0; i < configs.size(); ++i) {
    torch::optim::Optimizer& opt = *configs[i].optimizer();
    const auto& saved = s.groups[i];
    const size_t have = opt.param_groups().size();
    VOLT_CHECK(have <= saved.size(), CheckpointError, "[BaseFinetuning] optimizer ", i, " has ",
               have, " param groups but had ", saved.size(),
               " when the checkpoint was written; resume with the same configure_optimizers.");
    for (size_t g = 0; g < have; ++g) {
      std::vector<std::string> now;
      for (const auto& p : opt.param_groups()[g].params()) {
        auto it = names.find(p.unsafeGetTensorImpl());
        now.push_back(it == names.end() ? std::string() : it->second);
      }
      VOLT_CHECK(now == saved[g], CheckpointError, "[BaseFinetuning] param group ", g,
                 " of optimizer ", i,
                 " holds other parameters than when the checkpoint was "
                 "written; resume with the same configure_optimizers.");
    }
    for (size_t g = have; g < saved.size(); ++g) {
      std::vector<at::Tensor> params;
      for (const std::string& name : saved[g]) {
        auto it = by_name.find(name);
        VOLT_CHECK(it != by_name.end(), CheckpointError,
                   "[BaseFinetuning] the checkpoint's "
                   "param group ",
                   g, " of optimizer ", i, " holds '", name,
                   "', which the module does not have; resume with the same model.");
        params.push_back(it->second);
      }
      opt.add_param_group(torch::optim::OptimizerParamGroup(std::move(params)));
    }
  }
  groups_ = std::move(s.groups);
}

// -------------------------------------------------------------------------- BackboneFinetuning

std::ostream& operator<<(std::ostream& os, const BackboneFinetuningOptions& o) {
  os << "BackboneFinetuningOptions(unfreeze_backbone_at_epoch=" << o.unfreeze_backbone_at_epoch()
     << ", lambda_func=" << (o.lambda_func() ? "<function>" : "none")
     << ", backbone_initial_ratio_lr=" << o.backbone_initial_ratio_lr() << ", backbone_initial_lr=";
  if (o.backbone_initial_lr()) {
    os << *o.backbone_initial_lr();
  } else {
    os << "none";
  }
  return os << ", should_align=" << (o.should_align() ? "true" : "false")
            << ", initial_denom_lr=" << o.initial_denom_lr()
            << ", train_bn=" << (o.train_bn() ? "true" : "false")
            << ", verbose=" << (o.verbose() ? "true" : "false") << ", rounding=" << o.rounding()
            << ", backbone=\"" << o.backbone() << "\")";
}

BackboneFinetuning::BackboneFinetuning(BackboneFinetuningOptions options)
    : options_(std::move(options)) {
  const auto& o = options_;
  constexpr const char* kTag = "[BackboneFinetuning] ";
  VOLT_CHECK(o.unfreeze_backbone_at_epoch() >= 0, ConfigError, kTag,
             "unfreeze_backbone_at_epoch=", o.unfreeze_backbone_at_epoch(),
             " must be >= 0 (epochs count from 0).");
  VOLT_CHECK(static_cast<bool>(o.lambda_func()), ConfigError, kTag,
             "lambda_func is empty; pass a function of the epoch that returns the factor for the "
             "backbone's rate (Lightning's multiplicative: 2).");
  // Zero rates are allowed, as Lightning's: a backbone unfrozen at rate 0 stays still.
  VOLT_CHECK(o.backbone_initial_ratio_lr() >= 0 && std::isfinite(o.backbone_initial_ratio_lr()),
             ConfigError, kTag, "backbone_initial_ratio_lr=", o.backbone_initial_ratio_lr(),
             " must be >= 0 and finite.");
  VOLT_CHECK(!o.backbone_initial_lr() ||
                 (*o.backbone_initial_lr() >= 0 && std::isfinite(*o.backbone_initial_lr())),
             ConfigError, kTag, "backbone_initial_lr=", *o.backbone_initial_lr(),
             " must be >= 0 and finite.");
  VOLT_CHECK(o.initial_denom_lr() > 0 && std::isfinite(o.initial_denom_lr()), ConfigError, kTag,
             "initial_denom_lr=", o.initial_denom_lr(), " must be positive and finite.");
  VOLT_CHECK(o.rounding() >= 0 && o.rounding() <= 17, ConfigError, kTag, "rounding=", o.rounding(),
             " must be between 0 and 17 decimals.");
  VOLT_CHECK(!o.backbone().empty(), ConfigError, kTag,
             "backbone is empty; name the submodule to freeze (default \"backbone\").");
}

torch::nn::Module& BackboneFinetuning::backbone_of(Module& module) const {
  torch::nn::Module* found = nullptr;
  module.apply([&](const std::string& name, torch::nn::Module& m) {
    if (found == nullptr && name == options_.backbone()) found = &m;
  });
  if (found != nullptr) return *found;
  auto children = detail::c_stream<std::ostringstream>();
  for (const auto& c : module.named_children())
    children << (children.tellp() ? ", " : "") << c.key();
  throw ConfigError("[BackboneFinetuning] the module has no submodule '" + options_.backbone() +
                    "' (its submodules: " + (children.str().empty() ? "none" : children.str()) +
                    "); register the part to freeze as \"backbone\" (register_module) or name it "
                    "with BackboneFinetuningOptions().backbone(\"path.to.it\").");
}

void BackboneFinetuning::setup(RunContext& run, Module& module, Stage stage) {
  if (stage == Stage::kFit) previous_backbone_lr_.reset();
  BaseFinetuning::setup(run, module, stage);
}

void BackboneFinetuning::freeze_before_training(Module& module) {
  freeze(backbone_of(module), options_.train_bn());
}

void BackboneFinetuning::finetune_function(Module& module, int64_t epoch,
                                           torch::optim::Optimizer& optimizer) {
  const auto& o = options_;
  VOLT_CHECK(!optimizer.param_groups().empty(), ConfigError,
             "[BackboneFinetuning] the optimizer has no param group; give it the head's "
             "parameters in configure_optimizers.");
  const double current_lr = optimizer.param_groups().front().options().get_lr();
  double backbone_lr = 0;
  const int64_t at = o.unfreeze_backbone_at_epoch();
  // Lightning unfreezes at exactly unfreeze_backbone_at_epoch (every optimizer: each gets the
  // backbone's group); a fit that starts later without this callback's state (added to a
  // resumed run) unfreezes at its first epoch instead of never.
  if (epoch < at) return;
  if (epoch == at || !previous_backbone_lr_) {
    backbone_lr = o.backbone_initial_lr() ? *o.backbone_initial_lr()
                                          : current_lr * o.backbone_initial_ratio_lr();
    unfreeze_and_add_param_group(backbone_of(module), optimizer, backbone_lr, o.initial_denom_lr(),
                                 o.train_bn());
  } else {
    // As Lightning's, once per call: with several optimizers the rate advances once for each.
    backbone_lr = o.lambda_func()(epoch + 1) * *previous_backbone_lr_;
    VOLT_CHECK(backbone_lr >= 0 && std::isfinite(backbone_lr), ValueError,
               "[BackboneFinetuning] lambda_func(", epoch + 1, ") made the backbone's rate ",
               backbone_lr, "; return a finite factor >= 0.");
    if (o.should_align() && backbone_lr > current_lr) backbone_lr = current_lr;
    // Lightning sets the last group's rate; when the unfreeze added no group (the optimizer held
    // the backbone already) that is the head's, which is left alone here.
    auto& groups = optimizer.param_groups();
    if (groups.size() > 1 && holds_any_of(groups.back(), backbone_of(module))) {
      groups.back().options().set_lr(backbone_lr);
    }
  }
  previous_backbone_lr_ = backbone_lr;
  if (o.verbose()) {
    log_info("BackboneFinetuning", "Current lr: " + rounded(current_lr, o.rounding()) +
                                       ", Backbone lr: " + rounded(backbone_lr, o.rounding()));
  }
}

void BackboneFinetuning::save_state(torch::serialize::OutputArchive& archive) const {
  BaseFinetuning::save_state(archive);
  archive.write("previous_backbone_lr",
                c10::IValue(previous_backbone_lr_ ? *previous_backbone_lr_
                                                  : std::numeric_limits<double>::quiet_NaN()));
}

void BackboneFinetuning::load_state(torch::serialize::InputArchive& archive) {
  BaseFinetuning::load_state(archive);
  c10::IValue v;
  archive.read("previous_backbone_lr", v);
  const double lr = v.toDouble();
  previous_backbone_lr_ = std::isnan(lr) ? c10::nullopt : c10::optional<double>(lr);
}

}  // namespace volt
