#include "volt/io/state.h"

#include <torch/torch.h>

#include <map>

#include "core/detail/fp8_state.h"
#include "core/detail/numbers.h"
#include "core/detail/parameter_names.h"
#include "core/detail/state_key.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/kernels/fused_optimizer.h"

namespace volt {
namespace {

using detail::state_key_for;
using StateKey = detail::OptimizerStateKey;

template <typename State>
std::unique_ptr<torch::optim::OptimizerParamState> make_state() {
  return std::make_unique<State>();
}

std::string shape_str(const at::Tensor& t) {
  auto os = detail::c_stream<std::ostringstream>();
  os << t.sizes();
  return os.str();
}

}  // namespace

// The concrete state type per optimizer: OptimizerParamState is polymorphic but has no factory.
std::unique_ptr<torch::optim::OptimizerParamState> new_optimizer_param_state(
    const torch::optim::Optimizer& opt) {
  using namespace torch::optim;
  if (auto* fused = dynamic_cast<const FusedOptimizer*>(&opt)) return fused->make_param_state();
  if (dynamic_cast<const AdamW*>(&opt)) return make_state<AdamWParamState>();
  if (dynamic_cast<const Adam*>(&opt)) return make_state<AdamParamState>();
  if (dynamic_cast<const SGD*>(&opt)) return make_state<SGDParamState>();
  if (dynamic_cast<const RMSprop*>(&opt)) return make_state<RMSpropParamState>();
  if (dynamic_cast<const Adagrad*>(&opt)) return make_state<AdagradParamState>();
  VOLT_CHECK(false, ConfigError, "[Checkpoint] optimizer type '", typeid(opt).name(),
             "' has no known state layout; use SGD, Adam, AdamW, RMSprop, Adagrad, FusedSGD or "
             "FusedAdamW, or save its state yourself in Module::on_save_checkpoint.");
  return nullptr;
}

void save_module_state(const torch::nn::Module& module, torch::serialize::OutputArchive& archive) {
  for (const auto& item : module.named_parameters(true)) archive.write(item.key(), item.value());
  for (const auto& item : module.named_buffers(true)) {
    archive.write(item.key(), item.value(), /*is_buffer=*/true);
  }
}

void load_module_state(torch::nn::Module& module, torch::serialize::InputArchive& archive,
                       bool strict, const std::vector<std::string>& ignore) {
  std::vector<std::string> keys = archive.keys();
  std::set<std::string> expected(ignore.begin(), ignore.end());
  std::vector<std::string> problems;
  std::string shape_skips;  // the shape mismatches among them (a non-strict load warns of them)
  // Copied only once every entry was checked, so a strict mismatch changes nothing.
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  detail::Fp8StateCrossing fp8(keys, module);
  auto load_one = [&](const std::string& name, const at::Tensor& target, bool is_buffer) {
    expected.insert(name);
    at::Tensor saved;
    if (!archive.try_read(name, saved, is_buffer)) {
      if (!fp8.skip_missing(name))
        problems.push_back("missing '" + name + "' " + shape_str(target));
      return;
    }
    if (!saved.sizes().equals(target.sizes())) {
      problems.push_back("shape of '" + name + "': checkpoint " + shape_str(saved) + " vs model " +
                         shape_str(target));
      shape_skips += (shape_skips.empty() ? "" : "; ") + problems.back();
      return;
    }
    copies.emplace_back(target, std::move(saved));
  };
  for (auto& item : module.named_parameters(true)) load_one(item.key(), item.value(), false);
  for (auto& item : module.named_buffers(true)) load_one(item.key(), item.value(), true);
  for (const auto& k : keys) {
    if (!expected.count(k) && !fp8.skip_unexpected(k)) problems.push_back("unexpected '" + k + "'");
  }
  fp8.log("Checkpoint");
  if (!strict && !shape_skips.empty()) {
    // Not strict loads what matches (missing and unexpected names are what it is for), but an
    // entry whose shape differs is skipped where torch's load_state_dict raises even then: say
    // which, so a changed layer does not train on from its initial weights unnoticed.
    log_warning(
        "Checkpoint",
        "strict=false left entries whose shape differs as the model had them: " + shape_skips);
  }
  if (strict && !problems.empty()) {
    auto os = detail::c_stream<std::ostringstream>();
    os << "[Checkpoint] the checkpoint does not match the model (" << problems.size() << " mismatch"
       << (problems.size() > 1 ? "es" : "") << "): ";
    for (size_t i = 0; i < problems.size(); ++i) os << (i ? "; " : "") << problems[i];
    os << ". Load a checkpoint written by the same model class and hyper-parameters.";
    throw CheckpointError(os.str());
  }
  torch::NoGradGuard no_grad;
  for (auto& [target, saved] : copies) target.copy_(saved);
}

void save_optimizer_state(const torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                          torch::serialize::OutputArchive& archive) {
  auto names = detail::parameter_names_by_impl(module);
  const auto& state = optimizer.state();
  const auto& groups = optimizer.param_groups();
  archive.write("num_groups", c10::IValue(static_cast<int64_t>(groups.size())));
  for (size_t g = 0; g < groups.size(); ++g) {
    torch::serialize::OutputArchive group_ar;
    torch::serialize::OutputArchive options_ar;
    groups[g].options().serialize(options_ar);
    group_ar.write("options", options_ar);
    c10::List<std::string> param_names;
    torch::serialize::OutputArchive states_ar;
    for (const auto& p : groups[g].params()) {
      auto it = names.find(p.unsafeGetTensorImpl());
      VOLT_CHECK(it != names.end(), ConfigError, "[Checkpoint] an optimizer parameter (shape ",
                 p.sizes(),
                 ") is not a parameter of the module; optimize only module.parameters().");
      param_names.push_back(it->second);
      auto st = state.find(state_key_for<StateKey>(p));
      if (st != state.end()) {
        torch::serialize::OutputArchive one;
        st->second->serialize(one);
        states_ar.write(it->second, one);
      }
    }
    group_ar.write("params", c10::IValue(param_names));
    group_ar.write("state", states_ar);
    archive.write("group_" + std::to_string(g), group_ar);
  }
}

void load_optimizer_state(torch::optim::Optimizer& optimizer, const torch::nn::Module& module,
                          torch::serialize::InputArchive& archive) {
  std::map<std::string, at::Tensor> params_by_name;
  for (const auto& item : module.named_parameters(true)) {
    params_by_name.emplace(item.key(), item.value());
  }
  c10::IValue ng;
  VOLT_CHECK(archive.try_read("num_groups", ng), CheckpointError,
             "[Checkpoint] optimizer state has no 'num_groups'; the checkpoint was not written "
             "by volt or is damaged.");
  auto& groups = optimizer.param_groups();
  VOLT_CHECK(ng.toInt() == static_cast<int64_t>(groups.size()), CheckpointError,
             "[Checkpoint] the checkpoint's optimizer has ", ng.toInt(),
             " param groups but configure_optimizers built ", groups.size(),
             "; resume with the same optimizer setup (and with the callbacks that added param "
             "groups during the run, such as BackboneFinetuning).");
  // Everything is read and checked first, then applied: a checkpoint that does not fit leaves
  // the optimizer as it was. As torch's load_state_dict, the loaded state replaces the old
  // one: a parameter without state in the checkpoint (never stepped there) has none after.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  std::vector<std::pair<StateKey, std::unique_ptr<torch::optim::OptimizerParamState>>> loaded;
  for (size_t g = 0; g < groups.size(); ++g) {
    torch::serialize::InputArchive group_ar;
    archive.read("group_" + std::to_string(g), group_ar);
    torch::serialize::InputArchive options_ar;
    group_ar.read("options", options_ar);
    options.push_back(groups[g].options().clone());
    options.back()->serialize(options_ar);
    c10::IValue names_iv;
    group_ar.read("params", names_iv);
    auto names = c10::impl::toTypedList<std::string>(names_iv.toList());
    const auto& params = groups[g].params();
    VOLT_CHECK(names.size() == params.size(), CheckpointError, "[Checkpoint] optimizer group ", g,
               " holds ", names.size(), " parameters in the checkpoint but ", params.size(),
               " now; resume with the same model and optimizer setup.");
    torch::serialize::InputArchive states_ar;
    group_ar.read("state", states_ar);
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string name = names.get(i);
      auto it = params_by_name.find(name);
      VOLT_CHECK(it != params_by_name.end(), CheckpointError,
                 "[Checkpoint] optimizer state refers to parameter '", name,
                 "' which the model does not have; resume with the same model.");
      torch::serialize::InputArchive one;
      if (!states_ar.try_read(name, one)) continue;  // no state yet (never stepped)
      auto st = new_optimizer_param_state(optimizer);
      st->serialize(one);
      loaded.emplace_back(state_key_for<StateKey>(it->second), std::move(st));
    }
  }
  auto& state = optimizer.state();
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].set_options(std::move(options[g]));
    for (const auto& p : groups[g].params()) state.erase(state_key_for<StateKey>(p));
  }
  for (auto& [key, st] : loaded) state[key] = std::move(st);
}

void zero_grad(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (p.grad().defined()) p.mutable_grad().reset();
    }
  }
}

}  // namespace volt
