// ModelPruning: torch.nn.utils.prune's four methods (each applied, as a PruningContainer does, to
// the entries or channels still unpruned) and Lightning's callback around them.
#include "volt/callbacks/model_pruning.h"

#include <c10/util/StringUtil.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <iomanip>
#include <ostream>
#include <set>
#include <unordered_set>

#include "core/detail/numbers.h"
#include "volt/core/check.h"
#include "volt/core/errors.h"
#include "volt/core/log.h"
#include "volt/core/module.h"

namespace volt {
namespace {

constexpr const char* kTag = "[ModelPruning] ";
const std::set<std::string> kMethods = {"l1_unstructured", "random_unstructured", "ln_structured",
                                        "random_structured"};

bool structured(const std::string& fn) {
  return fn == "ln_structured" || fn == "random_structured";
}

// PyTorch's _compute_nparams_toprune: a count as it is, a fraction rounded half to even (Python's
// round; nearbyint under the default rounding mode).
int64_t to_prune(const PruningAmount& a, int64_t size, const std::string& what) {
  if (a.is_count) {
    const auto n = static_cast<int64_t>(a.value);
    VOLT_CHECK(n <= size, ValueError, kTag, "amount=", n, " is more than the ", size, " unpruned ",
               what, " left; prune fewer (or a fraction).");
    return n;
  }
  return static_cast<int64_t>(std::nearbyint(a.value * static_cast<double>(size)));
}

// One unstructured pruning of the entries of `t` whose mask is 1 (PruningContainer's
// "unstructured" slice): the smallest |t|, or random ones. Returns the new mask.
at::Tensor prune_unstructured(const at::Tensor& t, const at::Tensor& mask, const PruningAmount& a,
                              bool random) {
  const at::Tensor slc = mask == 1;
  const at::Tensor sub = t.masked_select(slc);
  const int64_t n = to_prune(a, sub.numel(), "parameters");
  at::Tensor sub_mask = mask.masked_select(slc);
  if (n != 0) {
    const at::Tensor idx = random
                               ? std::get<1>(at::topk(torch::rand_like(sub), n))
                               : std::get<1>(at::topk(sub.abs(), n, /*dim=*/-1, /*largest=*/false));
    sub_mask.index_fill_(0, idx, 0);
  }
  at::Tensor out = mask.clone();
  out.masked_scatter_(slc, sub_mask);
  return out;
}

// One structured pruning along `dim` of the channels not fully pruned yet (PruningContainer's
// "structured" slice): the channels of smallest `norm`, or random ones (norm unset).
at::Tensor prune_structured(const at::Tensor& t, const at::Tensor& mask, const PruningAmount& a,
                            int64_t dim, c10::optional<double> norm) {
  const int64_t nd = t.dim();
  const int64_t d = dim < 0 ? dim + nd : dim;
  std::vector<int64_t> others;
  for (int64_t i = 0; i < nd; ++i) {
    if (i != d) others.push_back(i);
  }
  const at::Tensor kept = (mask.sum(others) != 0).nonzero().view(-1);
  const at::Tensor sub_t = t.index_select(d, kept);
  const at::Tensor sub_m = mask.index_select(d, kept);
  const int64_t size = sub_t.size(d);
  const int64_t n = to_prune(a, size, "channels");
  at::Tensor partial = sub_m;
  if (n != 0) {
    at::Tensor channels;  // 1 for the channels kept, along d
    if (norm) {
      const at::Tensor norms = at::norm(sub_t, *norm, others);
      const at::Tensor keep = std::get<1>(at::topk(norms, size - n, -1, /*largest=*/true));
      channels = torch::zeros({size}, t.options()).index_fill_(0, keep, 1);
    } else {
      const at::Tensor prob = torch::rand({size});
      const at::Tensor threshold = std::get<0>(at::kthvalue(prob, n));
      channels = (prob > threshold).to(t.scalar_type());
    }
    std::vector<int64_t> shape(nd, 1);
    shape[d] = size;
    partial = channels.view(shape).expand_as(sub_t).contiguous() * sub_m;
  }
  at::Tensor out = mask.clone();
  out.index_copy_(d, kept, partial);
  return out;
}

torch::nn::Module* find_layer(torch::nn::Module& root, const std::string& path) {
  if (path.empty()) return &root;
  // include_self=false: a module made on the stack cannot hand itself out as a shared_ptr.
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (item.key() == path) return item.value().get();
  }
  return nullptr;
}

bool is_container(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::SequentialImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::ModuleListImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::ModuleDictImpl*>(&m) != nullptr;
}

// The layer's own reset_parameters() for the libtorch layers that have one, or an empty function
// (Lightning resamples any layer with reset_parameters and copies the original values into the
// others).
template <typename Layer>
bool bind_reset(torch::nn::Module& layer, std::function<void()>* out) {
  auto* l = dynamic_cast<Layer*>(&layer);
  if (l != nullptr) *out = [l] { l->reset_parameters(); };
  return l != nullptr;
}

std::function<void()> parameter_reset(torch::nn::Module& layer) {
  namespace nn = torch::nn;
  std::function<void()> reset;
  (void)(bind_reset<nn::LinearImpl>(layer, &reset) || bind_reset<nn::BilinearImpl>(layer, &reset) ||
         bind_reset<nn::Conv1dImpl>(layer, &reset) || bind_reset<nn::Conv2dImpl>(layer, &reset) ||
         bind_reset<nn::Conv3dImpl>(layer, &reset) ||
         bind_reset<nn::ConvTranspose1dImpl>(layer, &reset) ||
         bind_reset<nn::ConvTranspose2dImpl>(layer, &reset) ||
         bind_reset<nn::ConvTranspose3dImpl>(layer, &reset) ||
         bind_reset<nn::EmbeddingImpl>(layer, &reset) ||
         bind_reset<nn::LayerNormImpl>(layer, &reset) ||
         bind_reset<nn::GroupNormImpl>(layer, &reset) ||
         bind_reset<nn::BatchNorm1dImpl>(layer, &reset) ||
         bind_reset<nn::BatchNorm2dImpl>(layer, &reset) ||
         bind_reset<nn::BatchNorm3dImpl>(layer, &reset) ||
         bind_reset<nn::InstanceNorm1dImpl>(layer, &reset) ||
         bind_reset<nn::InstanceNorm2dImpl>(layer, &reset) ||
         bind_reset<nn::InstanceNorm3dImpl>(layer, &reset));
  return reset;
}

// New values from the layer's own initialisation (Lightning resamples with reset_parameters on a
// copy; here the live layer is reset and its values put back, drawing the same random numbers).
// Its buffers are put back too: a norm layer's reset also clears its running statistics.
// Empty for a layer without a known reset.
std::map<std::string, at::Tensor> resampled(torch::nn::Module& layer) {
  const std::function<void()> reset = parameter_reset(layer);
  if (!reset) return {};
  std::map<std::string, at::Tensor> held, held_buffers, fresh;
  for (const auto& p : layer.named_parameters(false)) held[p.key()] = p.value().detach().clone();
  for (const auto& b : layer.named_buffers(false)) {
    held_buffers[b.key()] = b.value().detach().clone();
  }
  reset();
  torch::NoGradGuard no_grad;
  for (auto& p : layer.named_parameters(false)) {
    fresh[p.key()] = p.value().detach().clone();
    p.value().copy_(held.at(p.key()));
  }
  for (auto& b : layer.named_buffers(false)) b.value().copy_(held_buffers.at(b.key()));
  return fresh;
}

// Re-checks an amount not built through fraction()/count() (set by hand, or from amount_fn).
void check_amount(const PruningAmount& a) {
  if (a.is_count) {
    PruningAmount::count(static_cast<int64_t>(a.value));
  } else {
    PruningAmount::fraction(a.value);
  }
}

std::string text_of(const PruningAmount& a) {
  auto os = detail::c_stream<std::ostringstream>();
  os << a;
  return os.str();
}

std::string percent(int64_t part, int64_t whole) {
  auto os = detail::c_stream<std::ostringstream>();
  os << std::fixed << std::setprecision(2) << 100.0 * static_cast<double>(part) / whole << "%";
  return os.str();
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const PruningAmount& a) {
  if (a.is_count) return os << static_cast<int64_t>(a.value);
  return os << a.value;
}

PruningAmount PruningAmount::fraction(double value) {
  VOLT_CHECK(std::isfinite(value) && value >= 0.0 && value <= 1.0, ConfigError, kTag,
             "amount fraction ", value,
             " is not in [0, 1]; give a fraction of the unpruned parameters or a count.");
  PruningAmount a;
  a.value = value;
  return a;
}

PruningAmount PruningAmount::count(int64_t value) {
  VOLT_CHECK(value >= 0, ConfigError, kTag, "amount count ", value,
             " is negative; give how many unpruned parameters to prune (0 or more).");
  PruningAmount a;
  a.is_count = true;
  a.value = static_cast<double>(value);
  return a;
}

std::ostream& operator<<(std::ostream& os, const ModelPruningOptions& o) {
  os << "ModelPruningOptions(pruning_fn=\"" << o.pruning_fn() << "\", parameters_to_prune=[";
  for (size_t i = 0; i < o.parameters_to_prune().size(); ++i) {
    os << (i ? ", " : "") << o.parameters_to_prune()[i].first << "."
       << o.parameters_to_prune()[i].second;
  }
  os << "], parameter_names=[";
  for (size_t i = 0; i < o.parameter_names().size(); ++i) {
    os << (i ? ", " : "") << o.parameter_names()[i];
  }
  os << "], use_global_unstructured=" << o.use_global_unstructured()
     << ", amount=" << (o.amount_fn() ? std::string("fn") : text_of(o.amount()))
     << ", apply_pruning="
     << (o.apply_pruning_fn() ? "fn"
         : o.apply_pruning()  ? "1"
                              : "0")
     << ", make_pruning_permanent=" << o.make_pruning_permanent()
     << ", use_lottery_ticket_hypothesis="
     << (o.use_lottery_ticket_hypothesis_fn() ? "fn"
         : o.use_lottery_ticket_hypothesis()  ? "1"
                                              : "0")
     << ", resample_parameters=" << o.resample_parameters() << ", pruning_dim=";
  if (o.pruning_dim()) {
    os << *o.pruning_dim();
  } else {
    os << "none";
  }
  os << ", pruning_norm=";
  if (o.pruning_norm()) {
    os << *o.pruning_norm();
  } else {
    os << "none";
  }
  return os << ", verbose=" << o.verbose()
            << ", prune_on_train_epoch_end=" << o.prune_on_train_epoch_end() << ")";
}

ModelPruning::ModelPruning(ModelPruningOptions options) : options_(std::move(options)) {
  const std::string& fn = options_.pruning_fn();
  VOLT_CHECK(kMethods.count(fn) == 1, ConfigError, kTag, "pruning_fn '", fn,
             "' is not one of l1_unstructured, random_unstructured, ln_structured, "
             "random_structured (torch.nn.utils.prune's).");
  for (const auto& name : options_.parameter_names()) {
    VOLT_CHECK(name == "weight" || name == "bias", ConfigError, kTag, "parameter_names holds '",
               name, "'; it may name weight and bias (or list parameters_to_prune).");
  }
  if (structured(fn)) {
    VOLT_CHECK(options_.pruning_dim().has_value(), ConfigError, kTag, fn,
               " needs pruning_dim, the dimension whose channels it removes (0: a Linear's "
               "output features).");
    VOLT_CHECK(!options_.use_global_unstructured(), ConfigError, kTag, fn,
               " is structured; use_global_unstructured=true takes unstructured methods only: "
               "set it to false.");
  }
  // Lightning ignores them elsewhere; a value that would change nothing is more likely a slip.
  VOLT_CHECK(structured(fn) || !options_.pruning_dim().has_value(), ConfigError, kTag,
             "pruning_dim is for the structured methods (ln_structured, random_structured); ", fn,
             " does not use it: remove it.");
  VOLT_CHECK(fn == "ln_structured" || !options_.pruning_norm().has_value(), ConfigError, kTag,
             "pruning_norm is for ln_structured; ", fn, " does not use it: remove it.");
  if (fn == "ln_structured") {
    VOLT_CHECK(options_.pruning_norm().has_value() && !std::isnan(*options_.pruning_norm()),
               ConfigError, kTag,
               "ln_structured needs pruning_norm, the norm channels are ranked by (1, 2, inf).");
  }
  VOLT_CHECK(options_.verbose() >= 0 && options_.verbose() <= 2, ConfigError, kTag,
             "verbose=", options_.verbose(), " is not 0, 1 or 2.");
  check_amount(options_.amount());
}

void ModelPruning::setup(RunContext& run, Module& module, Stage stage) {
  if (stage != Stage::kFit) return;
  VOLT_CHECK(run.strategy_name().rfind("deepspeed", 0) != 0, ConfigError, kTag,
             "does not work with DeepSpeed (ZeRO partitions the gradients it masks); use "
             "strategy ddp or single_device.");
  VOLT_CHECK(run.strategy_name() != "pipeline", ConfigError, kTag,
             "does not work with the pipeline strategy: each rank holds and trains only its "
             "stage's weights, so it can neither rank every weight nor keep the other stages' "
             "masks; prune with ddp or single_device.");
  VOLT_CHECK(run.strategy_name() != "model_parallel", ConfigError, kTag,
             "does not work with the model_parallel strategy: each rank holds a shard of the "
             "split layers, so it can neither rank every weight nor mask the whole tensors; "
             "prune with ddp or single_device.");
  VOLT_CHECK(run.world_size() == 1 || options_.pruning_fn().rfind("random", 0) != 0, ConfigError,
             kTag, options_.pruning_fn(),
             " with several processes would draw a different mask on each rank; use "
             "l1_unstructured or ln_structured.");
  std::vector<PrunedParameter> names = options_.parameters_to_prune();
  if (names.empty()) {
    // Lightning: every non-container layer's parameters named in parameter_names, by name first.
    for (const auto& pname : options_.parameter_names()) {
      for (const auto& item : module.named_modules("", /*include_self=*/false)) {
        if (is_container(*item.value())) continue;
        if (item.value()->named_parameters(false).contains(pname)) {
          names.emplace_back(item.key(), pname);
        }
      }
    }
  }
  names = filter_parameters_to_prune(std::move(names));
  std::vector<at::Tensor> params;
  std::vector<torch::nn::Module*> layers;
  std::vector<std::string> missing;
  // A layer registered twice (a shared or tied one) is listed under both paths but is one
  // tensor: pruned once (Lightning's modules() lists it once; pruned twice, amount 0.5 of a
  // random method zeroed about 75%).
  std::vector<PrunedParameter> kept;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& [path, pname] : names) {
    torch::nn::Module* layer = find_layer(module, path);
    const auto own = layer != nullptr ? layer->named_parameters(false)
                                      : torch::OrderedDict<std::string, at::Tensor>();
    const at::Tensor* p = own.find(pname);
    if (p == nullptr) {
      missing.push_back(path + "." + pname);
      continue;
    }
    VOLT_CHECK(!structured(options_.pruning_fn()) || p->dim() > 1, ConfigError, kTag,
               options_.pruning_fn(), " removes channels of tensors of 2 or more dimensions; ",
               path, ".", pname, " has ", p->dim(),
               ": prune weights only (parameter_names=[weight]).");
    VOLT_CHECK(!structured(options_.pruning_fn()) ||
                   (*options_.pruning_dim() < p->dim() && *options_.pruning_dim() >= -p->dim()),
               ConfigError, kTag, "pruning_dim=", *options_.pruning_dim(),
               " is not a dimension of ", path, ".", pname, " (", p->dim(), " dimensions).");
    if (!seen.insert(p->unsafeGetTensorImpl()).second) continue;
    kept.emplace_back(path, pname);
    params.push_back(*p);
    layers.push_back(layer);
  }
  std::string registered;
  for (const auto& item : module.named_parameters(true)) registered += " " + item.key();
  VOLT_CHECK(missing.empty(), ConfigError, kTag, "parameters_to_prune names ",
             c10::Join(", ", missing),
             ", which the module does not have; its parameters are:", registered, ".");
  VOLT_CHECK(!params.empty(), ConfigError, kTag,
             "found nothing to prune (no layer holds a parameter named in parameter_names); "
             "list parameters_to_prune.");
  names_ = std::move(kept);
  keys_.clear();
  for (const auto& [path, pname] : names_)
    keys_.push_back(path.empty() ? pname : path + "." + pname);
  params_ = std::move(params);
  layers_ = std::move(layers);
  // The lottery ticket's starting point: the values now (a resumed fit reads them back from the
  // checkpoint, after this). Masks from an earlier fit of this callback (make_pruning_permanent
  // off) stay when they still fit.
  initial_.clear();
  const bool lottery =
      options_.use_lottery_ticket_hypothesis_fn() || options_.use_lottery_ticket_hypothesis();
  std::map<std::string, at::Tensor> masks;
  for (size_t i = 0; i < names_.size(); ++i) {
    if (lottery) initial_[keys_[i]] = params_[i].detach().clone();
    auto it = masks_.find(keys_[i]);
    if (it != masks_.end() && it->second.sizes() == params_[i].sizes())
      masks[it->first] = it->second;
  }
  masks_ = std::move(masks);
}

void ModelPruning::mask_parameters() {
  if (masks_.empty()) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = masks_.find(keys_[i]);
    if (it != masks_.end()) params_[i].mul_(it->second);
  }
}

void ModelPruning::on_after_backward(RunContext&, Module&) {
  if (masks_.empty()) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = masks_.find(keys_[i]);
    at::Tensor grad = params_[i].grad();
    if (it != masks_.end() && grad.defined()) grad.mul_(it->second);
  }
}

void ModelPruning::on_train_batch_end(RunContext&, Module&, const Batch&, int64_t) {
  mask_parameters();
}

void ModelPruning::on_save_checkpoint(RunContext&, Module&) {
  mask_parameters();
}

void ModelPruning::apply_pruning(PruningAmount amount) {
  VOLT_CHECK(!params_.empty(), ValueError, kTag,
             "apply_pruning() before fit set up; call it from a hook of fit.");
  torch::NoGradGuard no_grad;
  const std::string& fn = options_.pruning_fn();
  const bool random = fn.rfind("random", 0) == 0;
  auto stats = [&] {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto it = masks_.find(keys_[i]);
      if (it == masks_.end()) {
        out.emplace_back(0, 1);  // Lightning's count for a parameter not pruned yet
      } else {
        out.emplace_back((it->second == 0).sum().item<int64_t>(), it->second.numel());
      }
    }
    return out;
  };
  const auto before = options_.verbose() > 0 ? stats() : decltype(stats()){};
  auto mask_of = [&](size_t i) {
    auto it = masks_.find(keys_[i]);
    return it != masks_.end() ? it->second : torch::ones_like(params_[i]);
  };
  std::map<std::string, at::Tensor> masks = masks_;
  if (options_.use_global_unstructured()) {
    // One ranking over every parameter: torch.nn.utils.prune.global_unstructured.
    std::vector<at::Tensor> flat, flat_masks;
    for (size_t i = 0; i < params_.size(); ++i) {
      flat.push_back(params_[i].detach().reshape(-1));
      flat_masks.push_back(mask_of(i).reshape(-1).to(params_[0].scalar_type()));
    }
    const at::Tensor all =
        prune_unstructured(torch::cat(flat), torch::cat(flat_masks), amount, random);
    int64_t at = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t n = params_[i].numel();
      masks[keys_[i]] =
          all.slice(0, at, at + n).view_as(params_[i]).to(params_[i].scalar_type()).clone();
      at += n;
    }
  } else {
    for (size_t i = 0; i < params_.size(); ++i) {
      const at::Tensor& p = params_[i];
      masks[keys_[i]] =
          structured(fn)
              ? prune_structured(p.detach(), mask_of(i), amount, *options_.pruning_dim(),
                                 fn == "ln_structured" ? options_.pruning_norm() : c10::nullopt)
              : prune_unstructured(p.detach(), mask_of(i), amount, random);
    }
  }
  masks_ = std::move(masks);
  mask_parameters();
  if (options_.verbose() > 0) {
    const auto after = stats();
    int64_t total = 0, zeros_before = 0, zeros_after = 0;
    for (size_t i = 0; i < after.size(); ++i) {
      total += after[i].second;
      zeros_before += before[i].first;
      zeros_after += after[i].first;
    }
    // Lightning's lines: the method's class name for global pruning, its function's otherwise.
    const std::string method = options_.use_global_unstructured()
                                   ? (random ? "RandomUnstructured" : "L1Unstructured")
                                   : fn;
    if (options_.verbose() >= 1) {
      log_info("ModelPruning", "Applied `" + method + "`. Pruned: " + std::to_string(zeros_before) +
                                   "/" + std::to_string(total) + " (" +
                                   percent(zeros_before, total) + ") -> " +
                                   std::to_string(zeros_after) + "/" + std::to_string(total) +
                                   " (" + percent(zeros_after, total) + ")");
    }
    if (options_.verbose() == 2) {
      auto a = detail::c_stream<std::ostringstream>();
      a << amount;
      for (size_t i = 0; i < after.size(); ++i) {
        log_info("ModelPruning", "Applied `" + method + "` to `" + keys_[i] + "` with amount=" +
                                     a.str() + ". Pruned: " + std::to_string(before[i].first) +
                                     " (" + percent(before[i].first, before[i].second) + ") -> " +
                                     std::to_string(after[i].first) + " (" +
                                     percent(after[i].first, after[i].second) + ")");
      }
    }
  }
}

const at::Tensor& ModelPruning::initial_of(size_t i) const {
  auto it = initial_.find(keys_[i]);
  VOLT_CHECK(it != initial_.end(), InternalError, kTag, "no initial value of ", keys_[i]);
  return it->second;
}

void ModelPruning::apply_lottery_ticket_hypothesis() {
  torch::NoGradGuard no_grad;
  if (options_.resample_parameters()) {
    // Each layer once, in the order its parameters come, as Lightning's _original_layers.
    // A layer without a known reset_parameters gets its original values, as in Lightning.
    std::map<torch::nn::Module*, std::map<std::string, at::Tensor>> fresh;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (fresh.count(layers_[i]) == 0) fresh[layers_[i]] = resampled(*layers_[i]);
      const auto& values = fresh[layers_[i]];
      auto it = values.find(names_[i].second);
      params_[i].copy_(it != values.end() ? it->second : initial_of(i));
    }
  } else {
    for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(initial_of(i));
  }
  mask_parameters();
}

void ModelPruning::make_pruning_permanent() {
  mask_parameters();
  masks_.clear();
}

void ModelPruning::run_pruning(int64_t epoch) {
  const bool prune =
      options_.apply_pruning_fn() ? options_.apply_pruning_fn()(epoch) : options_.apply_pruning();
  const PruningAmount amount =
      options_.amount_fn() ? options_.amount_fn()(epoch) : options_.amount();
  check_amount(amount);
  if (!prune || amount.value == 0.0) return;
  apply_pruning(amount);
  const bool lottery = options_.use_lottery_ticket_hypothesis_fn()
                           ? options_.use_lottery_ticket_hypothesis_fn()(epoch)
                           : options_.use_lottery_ticket_hypothesis();
  if (lottery) apply_lottery_ticket_hypothesis();
}

void ModelPruning::on_train_epoch_end(RunContext& run, Module&) {
  if (options_.prune_on_train_epoch_end()) run_pruning(run.state().epoch);
}

void ModelPruning::on_validation_epoch_end(RunContext& run, Module&) {
  // Only the validations of fit, not its sanity check (nor validate()).
  if (!options_.prune_on_train_epoch_end() && run.state().stage == Stage::kFit) {
    run_pruning(run.state().epoch);
  }
}

void ModelPruning::on_train_end(RunContext&, Module&) {
  if (options_.make_pruning_permanent()) make_pruning_permanent();
}

void ModelPruning::save_state(torch::serialize::OutputArchive& archive) const {
  torch::serialize::OutputArchive masks, initial;
  for (const auto& [key, t] : masks_) masks.write(key, t);
  for (const auto& [key, t] : initial_) initial.write(key, t);
  archive.write("masks", masks);
  archive.write("initial", initial);
}

void ModelPruning::load_state(torch::serialize::InputArchive& archive) {
  auto read = [&](const char* name, std::map<std::string, at::Tensor>& into) {
    torch::serialize::InputArchive nested;
    if (!archive.try_read(name, nested)) return;
    into.clear();
    for (const auto& key : nested.keys()) {
      at::Tensor t;
      nested.read(key, t);
      into[key] = t;
    }
  };
  read("masks", masks_);
  read("initial", initial_);
  // Checked against the parameters resolved in setup (which runs before a checkpoint is read).
  for (size_t i = 0; i < params_.size(); ++i) {
    for (auto* held : {&masks_, &initial_}) {
      auto it = held->find(keys_[i]);
      if (it == held->end()) continue;
      VOLT_CHECK(it->second.sizes() == params_[i].sizes(), CheckpointError, kTag,
                 "the checkpoint's ", held == &masks_ ? "mask" : "initial value", " of ", keys_[i],
                 " has shape ", it->second.sizes(), " but the parameter has ", params_[i].sizes(),
                 "; resume with the model the checkpoint was written by.");
      it->second = it->second.to(params_[i].device(), params_[i].scalar_type());
    }
  }
}

}  // namespace volt
