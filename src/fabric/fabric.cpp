// Fabric: the strategy, precision and accelerator the Trainer uses, driven by the program's own
// loop. Everything that touches processes, gradients or checkpoints is the strategy's code; this
// file only checks the calls and keeps the module and optimizers the strategy set up.
#include "volt/fabric/fabric.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <exception>
#include <iostream>
#include <memory>
#include <sstream>
#include <unordered_set>
#include <utility>

#include "core/detail/numbers.h"
#include "distributed/detail/collective_checks.h"
#include "io/detail/archive_check.h"
#include "io/detail/nested_archive.h"
#include "nn/detail/empty_init.h"
#include "optim/detail/step_scheduler.h"
#include "strategies/detail/replica_mesh.h"
#include "strategies/detail/stacked_gather_of.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/core/optimizer_config.h"
#include "volt/core/run_context.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/profiler/profiler.h"
#include "volt/trainer/plan.h"

namespace volt {
namespace {

using detail::write_nested;

constexpr const char* kTag = "[Fabric]";
constexpr int64_t kCheckpointFormat = 1;  // a Trainer checkpoint's volt_format
constexpr int64_t kFabricFormat = 1;      // this file's own entries

// A torch::nn::Module the program wrote, as the volt::Module the strategies take: the same
// children, parameters and buffers under the same names (no prefix), so checkpoints hold the
// program's names and moving or converting it moves the program's tensors.
class HeldModule : public Module {
 public:
  explicit HeldModule(const torch::nn::Module& held) : Module(held.name()) {
    for (const auto& c : held.named_children()) register_module(c.key(), c.value());
    for (const auto& p : held.named_parameters(/*recurse=*/false)) {
      register_parameter(p.key(), p.value(), p.value().requires_grad());
    }
    for (const auto& b : held.named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  }
  at::Tensor training_step(const Batch&, int64_t) override {
    VOLT_CHECK(false, InternalError, kTag, " a held module has no training_step.");
    return {};
  }
  std::vector<OptimizerConfig> configure_optimizers() override { return {}; }
};

// ZeRO (DeepSpeedStrategy): clipping inside its step.
bool sharded(const Strategy& strategy) {
  return strategy.name() == "deepspeed";
}

// The strategies that split one module (the pipeline's stages, tensor parallelism's layers), or
// "" when several modules may be set up (ZeRO keeps engines per module).
std::string splits_one_module(const Strategy& strategy) {
  if (strategy.name() == "pipeline") return "the pipeline strategy splits one module's pipeline";
  if (strategy.name() == "model_parallel") {
    return "the model_parallel strategy splits one module's layers";
  }
  return "";
}

// Loads `saved` into `scheduler` as a trial and puts back the scheduler's state and its
// optimizer's group options (the lrs and momenta a load writes), so a state that does not load
// (a chained scheduler's part of another type, a counter missing) is found before anything
// changes. A scheduler's save and load round-trip exactly (the resume tests rely on it).
void try_scheduler_load(LRScheduler& scheduler, torch::serialize::InputArchive& saved,
                        const std::string& path, const std::string& name) {
  torch::serialize::OutputArchive own;
  scheduler.save(own);
  auto bytes = detail::c_stream<std::ostringstream>();
  own.save_to(bytes);
  auto& groups = scheduler.optimizer().param_groups();
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  for (const auto& g : groups) options.push_back(g.options().clone());
  std::string failure;
  try {
    scheduler.load(saved);
  } catch (const c10::Error& e) {
    failure = e.what_without_backtrace();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const auto put_back_options = [&] {
    for (size_t i = 0; i < groups.size() && i < options.size(); ++i) {
      if (options[i]) groups[i].set_options(std::move(options[i]));
    }
  };
  try {
    torch::serialize::InputArchive back;
    auto in = detail::c_stream<std::istringstream>(bytes.str());
    back.load_from(in);
    scheduler.load(back);
  } catch (...) {
    put_back_options();
    throw;
  }
  put_back_options();
  VOLT_CHECK(failure.empty(), CheckpointError, kTag, " '", path, "' holds a state of scheduler '",
             name, "' that does not load into it: ", failure,
             " Load it into a scheduler built the same way (nothing was loaded).");
}

std::string join(const std::vector<std::string>& names) {
  auto os = detail::c_stream<std::ostringstream>();
  for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << names[i];
  return os.str();
}

}  // namespace

// ------------------------------------------------------------------ FabricRun

namespace detail {

// What a set-up volt::Module sees as its run inside a Fabric loop (Lightning's LightningModule
// with `_fabric` set): logging, manual optimization, collectives and rank queries go through
// the Fabric; what only the Trainer's loop has is a ConfigError naming it.
class FabricRun : public RunContext {
 public:
  FabricRun(Fabric& fabric, const FabricOptions& options) : fabric_(fabric), options_(options) {}

  std::vector<OptimizerConfig> configs;  // the optimizers setup() took with this module

  // global_step: the optimizer steps taken through the Fabric (read from it, not kept here).
  const LoopState& state() const override {
    st_.global_step = fabric_.steps_;
    return st_;
  }
  const Metrics& callback_metrics() const override { return callback_metrics_; }
  void set_callback_metric(const std::string& name, double value) override {
    callback_metrics_[name] = value;
  }
  const Metrics& progress_bar_metrics() const override { return progress_bar_; }

  void log(const std::string& name, const at::Tensor& value, const LogOptions& opts) override {
    VOLT_CHECK(!name.empty(), ValueError, "[Module] log() needs a name.");
    VOLT_CHECK(value.defined() && value.numel() == 1, ValueError, "[Module] log(\"", name,
               "\") needs a tensor of one element, got ",
               value.defined() ? value.sizes() : c10::IntArrayRef{},
               "; reduce it (mean or sum) first.");
    at::Tensor v = value.detach();
    if (opts.sync_dist()) v = fabric_.all_reduce(v.to(at::kDouble), opts.reduce());
    const double d = v.item<double>();
    callback_metrics_[name] = d;
    if (opts.prog_bar()) progress_bar_[name] = d;
    // Lightning under Fabric: fabric.log_dict, once per call (no epoch aggregation).
    if (opts.logger()) fabric_.log_dict({{name, d}}, fabric_.steps_);
  }

  bool is_global_zero() const override { return fabric_.strategy().is_global_zero(); }
  int64_t world_size() const override { return fabric_.strategy().world_size(); }
  int64_t data_parallel_size() const override { return fabric_.strategy().data_shard().world_size; }
  int64_t global_rank() const override { return fabric_.strategy().rank(); }
  bool reduce_boolean_decision(bool decision, bool all) override {
    return fabric_.strategy().reduce_boolean_decision(decision, all);
  }
  at::Tensor all_gather(const at::Tensor& value, bool sync_grads) override {
    return stacked_all_gather(fabric_.strategy(), value, sync_grads);
  }
  const std::vector<std::shared_ptr<Logger>>& loggers() const override {
    return fabric_.strategy().is_global_zero() ? options_.loggers() : no_loggers_;
  }
  bool has_loggers() const override { return !options_.loggers().empty(); }
  Profiler& profiler() override { return profiler_; }
  Metrics device_stats() override { return fabric_.strategy().accelerator().device_stats(); }
  std::string strategy_name() const override { return fabric_.strategy().name(); }
  std::vector<OptimizerConfig>& optimizer_configs() override { return configs; }

  // Manual optimization (Lightning: manual_backward is fabric.backward; the optimizers step
  // through the Fabric).
  void manual_backward(const at::Tensor& loss) override { fabric_.backward(loss); }
  void manual_step(size_t index) override { fabric_.step(optimizer(index)); }
  void manual_zero_grad(size_t index) override { fabric_.zero_grad(optimizer(index)); }
  void manual_count_step(size_t index) override {
    optimizer(index);
    ++fabric_.steps_;
  }
  at::Tensor clip_gradients(torch::optim::Optimizer& optimizer, c10::optional<double> value,
                            c10::optional<ClipAlgorithm> algorithm) override {
    if (!value || *value == 0) return {};  // no Trainer option to fall back on
    return fabric_.clip_gradients(optimizer, *value, algorithm.value_or(ClipAlgorithm::kNorm));
  }
  void zero_grad(torch::optim::Optimizer& optimizer) override { fabric_.zero_grad(optimizer); }
  Batch batch_to_device(const Batch& batch) const override {
    return fabric_.strategy().batch_to_device(batch);
  }
  void step_lr_scheduler(LRScheduler& scheduler, c10::optional<double> metric) override {
    detail::step_scheduler(scheduler, metric);
  }
  DataModule* data_module() override { return nullptr; }
  const DataLoader* train_dataloader() const override { return nullptr; }
  const std::vector<int64_t>& predict_batch_indices() const override { return no_indices_; }

  // The Trainer's loop only.
  void save_checkpoint(const std::string&, bool) override { trainer_only("save_checkpoint()"); }
  void remove_checkpoint(const std::string&) override { trainer_only("remove_checkpoint()"); }
  void link_checkpoint(const std::string&, const std::string&) override {
    trainer_only("link_checkpoint()");
  }
  void request_stop() override { trainer_only("request_stop()"); }
  std::string log_dir() const override { trainer_only("log_dir()"); }
  int64_t max_epochs() const override { trainer_only("max_epochs()"); }
  int64_t max_steps() const override { trainer_only("max_steps()"); }
  int64_t estimated_stepping_batches() const override {
    trainer_only("estimated_stepping_batches()");
  }
  int64_t log_every_n_steps() const override { trainer_only("log_every_n_steps()"); }
  void set_accumulate_grad_batches(int64_t) override {
    trainer_only("set_accumulate_grad_batches()");
  }
  void check_accumulate_grad_batches(int64_t) const override {
    trainer_only("check_accumulate_grad_batches()");
  }
  void forward_training_data() override { trainer_only("forward_training_data()"); }
  const TrainerOptions& trainer_options() const override { trainer_only("trainer_options()"); }

 private:
  torch::optim::Optimizer& optimizer(size_t index) const {
    VOLT_CHECK(index < configs.size(), ConfigError, "[Module] optimizer index ", index,
               " out of range: fabric.setup() took ", configs.size(), " optimizer(s).");
    return *configs[index].optimizer();
  }
  [[noreturn]] static void trainer_only(const char* what) {
    throw ConfigError(std::string("[Fabric] ") + what +
                      " belongs to the Trainer's loop; a module set up by Fabric runs in the "
                      "program's loop: do it there (e.g. fabric.save for a checkpoint), or "
                      "train with volt::Trainer.");
  }

  Fabric& fabric_;
  const FabricOptions& options_;
  mutable LoopState st_;  // what state() returns
  Metrics callback_metrics_, progress_bar_;
  PassThroughProfiler profiler_;
  const std::vector<std::shared_ptr<Logger>> no_loggers_;
  const std::vector<int64_t> no_indices_;
};

}  // namespace detail

// ------------------------------------------------------------------ FabricState

void FabricState::check_new(const std::string& name) const {
  VOLT_CHECK(!name.empty() && name.find('/') == std::string::npos, ConfigError, kTag,
             " state entry name '", name, "' must be non-empty and without '/'.");
  // Saved fine, but libtorch could never read the file back ("expected ident").
  VOLT_CHECK(!detail::is_torchscript_keyword(name), ConfigError, kTag, " state entry name '", name,
             "' is a word TorchScript reserves, which a checkpoint cannot hold as a name; "
             "choose another (e.g. '",
             name, "_state').");
  bool taken = values_.count(name) > 0;
  for (const auto& m : modules_) taken = taken || m.first == name;
  for (const auto& o : optimizers_) taken = taken || o.first == name;
  for (const auto& l : schedulers_) taken = taken || l.first == name;
  for (const auto& t : tensors_) taken = taken || t.first == name;
  VOLT_CHECK(!taken, ConfigError, kTag, " the state has an entry named '", name,
             "' already; give each entry its own name.");
}

FabricState& FabricState::module(const std::string& name, torch::nn::Module& module) {
  check_new(name);
  for (const auto& m : modules_) {
    VOLT_CHECK(m.second != &module, ConfigError, kTag, " the state has this module already (as '",
               m.first, "'); name each module once.");
  }
  modules_.emplace_back(name, &module);
  return *this;
}

FabricState& FabricState::optimizer(const std::string& name, torch::optim::Optimizer& optimizer) {
  check_new(name);
  optimizers_.emplace_back(name, &optimizer);
  return *this;
}

FabricState& FabricState::scheduler(const std::string& name, LRScheduler& scheduler) {
  check_new(name);
  schedulers_.emplace_back(name, &scheduler);
  return *this;
}

FabricState& FabricState::tensor(const std::string& name, at::Tensor& tensor) {
  check_new(name);
  tensors_.emplace_back(name, &tensor);
  return *this;
}

FabricState& FabricState::value(const std::string& name, c10::IValue value) {
  check_new(name);
  VOLT_CHECK(value.isInt() || value.isDouble() || value.isBool() || value.isString(), ConfigError,
             kTag, " state value '", name, "' is a ", value.tagKind(),
             "; values are ints, doubles, bools or strings (tensors go in tensor()).");
  values_.emplace(name, std::move(value));
  return *this;
}

const c10::IValue& FabricState::value(const std::string& name) const {
  auto it = values_.find(name);
  VOLT_CHECK(it != values_.end(), ValueError, kTag, " the state has no value named '", name, "'.");
  return it->second;
}

// ------------------------------------------------------------------ Fabric

struct Fabric::SetUp {
  std::shared_ptr<torch::nn::Module> user;  // what the program passed
  std::shared_ptr<Module> module;           // it, or the volt::Module holding its tensors
  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers;
  std::unique_ptr<detail::FabricRun> run;  // attached when the program's module is a volt::Module
  bool sync = true;                        // false inside no_backward_sync(module)
  bool forward_seen = false;               // a forward_context(module) was entered
};

Fabric::Fabric(FabricOptions options) : options_(std::move(options)) {
  RunPlan plan = resolve_plan(options_.accelerator(), options_.devices(), options_.strategy(),
                              options_.precision(), options_.num_nodes(), "Fabric");
  for (size_t i = 0; i < options_.callbacks().size(); ++i) {
    VOLT_CHECK(options_.callbacks()[i] != nullptr, ConfigError, kTag, " callback ", i,
               " is null; pass objects derived from volt::FabricCallback.");
  }
  precision_ = plan.precision;
  strategy_ = plan.strategy;
  if (options_.checkpoint_io()) strategy_->set_checkpoint_io(options_.checkpoint_io());
  strategy_->set_sync_batchnorm(options_.sync_batchnorm());
}

Fabric::~Fabric() {
  for (const auto& s : set_up_) {
    if (s->module->run() == s->run.get()) s->module->attach(nullptr);
  }
  if (!launched_) return;
  // On the way out of an error, or after the program marked the run failed (it caught an
  // error and is giving up): the other ranks may be gone, so nothing collective. Nothing waits
  // here for checkpoint writes either: save() returns once its file is complete everywhere.
  const bool failed = std::uncaught_exceptions() > 0 || strategy_->run_failed();
  try {
    if (strategy_->is_global_zero()) {
      for (const auto& l : options_.loggers()) {
        if (l) l->finalize(failed ? RunStatus::kFailed : RunStatus::kFinished);
      }
    }
    strategy_->set_run_failed(failed);
    strategy_->teardown();
  } catch (const std::exception& e) {
    log_error("Fabric", std::string("teardown: ") + e.what());
  }
}

void Fabric::launch() {
  if (launched_) return;
  strategy_->launch();
  strategy_->setup_environment();
  launched_ = true;
}

int64_t Fabric::global_rank() {
  launch();
  return strategy_->rank();
}

int64_t Fabric::local_rank() {
  launch();
  return strategy_->local_rank();
}

int64_t Fabric::node_rank() {
  launch();
  return strategy_->node_rank();
}

int64_t Fabric::world_size() {
  launch();
  return strategy_->world_size();
}

bool Fabric::is_global_zero() {
  return global_rank() == 0;
}

c10::Device Fabric::device() {
  launch();
  return strategy_->root_device();
}

Fabric::SetUp* Fabric::set_up_of(const torch::nn::Module& module) const {
  for (const auto& s : set_up_) {
    if (&module == s->user.get() || &module == s->module.get()) return s.get();
  }
  return nullptr;
}

Fabric::SetUp* Fabric::owner_of(const torch::optim::Optimizer& optimizer) const {
  for (const auto& s : set_up_) {
    for (const auto& o : s->optimizers) {
      if (o.get() == &optimizer) return s.get();
    }
  }
  return nullptr;
}

void Fabric::check_set_up(const char* what) const {
  VOLT_CHECK(!set_up_.empty(), ConfigError, kTag, " ", what,
             " before setup(): call fabric.setup(module, {optimizers}) first.");
}

torch::nn::Module* Fabric::checked(torch::nn::Module* module, const char* what) {
  VOLT_CHECK(module != nullptr, ConfigError, kTag, " ", what, " got a null module.");
  return module;
}

Fabric::SetUp& Fabric::set_up_for(const torch::nn::Module& module, const char* what) const {
  SetUp* s = set_up_of(module);
  VOLT_CHECK(s != nullptr, ConfigError, kTag, " ", what,
             " got a module that setup() did not take; pass it to fabric.setup(module, "
             "{optimizers}) first.");
  return *s;
}

void Fabric::setup(const std::shared_ptr<torch::nn::Module>& module,
                   const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) {
  VOLT_CHECK(module != nullptr, ConfigError, kTag, " setup() got a null module.");
  VOLT_CHECK(set_up_of(*module) == nullptr, ConfigError, kTag,
             " setup() got a module that is set up already; set each module up once.");
  std::unordered_set<const c10::TensorImpl*> own;
  for (const auto& p : module->parameters(/*recurse=*/true)) own.insert(p.unsafeGetTensorImpl());
  for (size_t k = 0; k < set_up_.size(); ++k) {
    for (const auto& p : set_up_[k]->module->parameters(/*recurse=*/true)) {
      // Two gradient reducers would average one gradient twice.
      VOLT_CHECK(own.count(p.unsafeGetTensorImpl()) == 0, ConfigError, kTag,
                 " setup() got a module sharing a parameter of shape ", p.sizes(), " with module ",
                 k, " set up already; set up one module holding both.");
    }
  }
  for (size_t i = 0; i < optimizers.size(); ++i) {
    VOLT_CHECK(optimizers[i] != nullptr, ConfigError, kTag, " optimizer ", i, " is null.");
    for (const auto& group : optimizers[i]->param_groups()) {
      for (const auto& p : group.params()) {
        VOLT_CHECK(own.count(p.unsafeGetTensorImpl()) > 0, ConfigError, kTag, " optimizer ", i,
                   " holds a parameter of shape ", p.sizes(),
                   " that is not one of the module's, whose gradient no strategy would "
                   "average; build the optimizer over the module's parameters().");
      }
    }
  }
  // The pipeline strategy keeps one split of one volt::Pipeline, model_parallel one engine.
  const std::string one = splits_one_module(*strategy_);
  VOLT_CHECK(one.empty() || set_up_.empty(), ConfigError, kTag,
             " setup() of a second module under \"", strategy_->name(), "\": ", one,
             "; set up one module holding both, or use strategy \"ddp\" for several.");
  launch();
  auto as_volt = std::dynamic_pointer_cast<Module>(module);
  auto s = std::make_unique<SetUp>();
  s->user = module;
  s->module = as_volt ? as_volt : std::make_shared<HeldModule>(*module);
  // A module set up without optimizers is only evaluated: ZeRO stage 3 partitions its weights
  // alone (ZeRO-Inference).
  const LoopSettings before = strategy_->loop_settings();
  LoopSettings loop = before;
  loop.fitting = !optimizers.empty();
  strategy_->set_loop_settings(loop);
  std::vector<OptimizerConfig> configs(optimizers.begin(), optimizers.end());
  try {
    strategy_->setup_module(*s->module);
    strategy_->setup_optimizers(*s->module, configs);
    // A DeepSpeed config may make an optimizer of its own, which the program could not step.
    VOLT_CHECK(configs.size() == optimizers.size(), ConfigError, kTag, " the strategy made ",
               configs.size() - optimizers.size(),
               " optimizer(s) of its own (the DeepSpeed config's \"optimizer\") that the loop "
               "cannot reach; build the optimizer in the program and pass it to setup().");
  } catch (...) {
    // The strategy may keep pointers to the module it began to set up (DeepSpeed's cast,
    // model_parallel's split): it stays alive until the strategy's teardown (a held copy of a
    // plain module was freed here before session 99, and the teardown used it).
    strategy_->set_loop_settings(before);
    failed_set_ups_.push_back(std::move(s));
    throw;
  }
  s->optimizers = optimizers;
  s->run = std::make_unique<detail::FabricRun>(*this, options_);
  s->run->configs = std::move(configs);
  // A volt::Module's log(), manual_backward(), optimizers() ... come here while it is set up.
  if (as_volt) s->module->attach(s->run.get());
  set_up_.push_back(std::move(s));
}

DataLoader Fabric::setup_dataloader(const DataLoader& loader) {
  launch();
  const DataShard s = strategy_->data_shard();
  // A loader (or a combined loader's part) the program sharded itself is kept, as Lightning's
  // Fabric keeps a DistributedSampler it finds: its unpadded shards (even_shards false, for
  // predictions without repeats) came back padded, and its own rank and world size replaced.
  return s.world_size > 1 ? loader.sharded_where_unsharded(s.rank, s.world_size) : loader;
}

Batch Fabric::to_device(const Batch& batch) {
  launch();
  // The precision's input conversion too (bf16-true's inputs in bf16), as Lightning's wrapped
  // forward applies it.
  return precision_->convert_input(strategy_->batch_to_device(batch));
}

at::Tensor Fabric::to_device(const at::Tensor& tensor) {
  const c10::Device d = device();
  return tensor.device() == d ? tensor : tensor.to(d, /*non_blocking=*/true);
}

std::shared_ptr<void> Fabric::init_module(bool empty_init) {
  return detail::init_module_context(precision_->tensor_init_context(), empty_init);
}

std::shared_ptr<void> Fabric::init_tensor() {
  return precision_->tensor_init_context();
}

std::shared_ptr<void> Fabric::autocast() {
  return precision_->forward_context();
}

std::shared_ptr<void> Fabric::forward_context(torch::nn::Module& module) {
  SetUp& s = set_up_for(module, "forward_context()");
  // Lightning's _FabricModule.forward: the strategy's wrapped forward (DDP's buffer broadcast
  // and SyncBatchNorm) inside, the precision's forward context around the call.
  std::shared_ptr<void> strategy = strategy_->training_forward_context(*s.module);
  std::shared_ptr<void> precision = precision_->forward_context();
  s.forward_seen = true;
  if (!strategy) return precision;
  if (!precision) return strategy;
  // A pair's members go in reverse order: the precision's context closes first.
  return std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(
      std::move(strategy), std::move(precision));
}

namespace {

// The nodes of `loss`'s autograd graph.
std::unordered_set<const torch::autograd::Node*> graph_of(const at::Tensor& loss) {
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo;
  if (auto root = torch::autograd::impl::gradient_edge(loss).function) todo.push_back(root.get());
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    for (const auto& e : n->next_edges()) {
      if (e.function && seen.count(e.function.get()) == 0) todo.push_back(e.function.get());
    }
  }
  return seen;
}

template <typename Impl>
bool batch_norm_weight(const torch::nn::Module& m, at::Tensor& weight) {
  const auto* bn = dynamic_cast<const Impl*>(&m);
  if (bn != nullptr) weight = bn->weight;
  return bn != nullptr;
}

// The path of a training-mode BatchNorm layer of `module` whose weight `graph` reaches through
// libtorch's own batch-norm backward (NativeBatchNormBackward0, CudnnBatchNormBackward0, ...):
// that forward normalised by this rank's statistics alone. SyncBatchNorm's forward is built of
// other operations, so a synchronised layer has no such node. Layers without a weight cannot be
// told apart and are not reported.
c10::optional<std::string> unsynced_batch_norm(
    const torch::nn::Module& module,
    const std::unordered_set<const torch::autograd::Node*>& graph) {
  std::unordered_set<const torch::autograd::Node*> fed;  // accumulators a batch-norm node feeds
  for (const torch::autograd::Node* n : graph) {
    if (n->name().find("BatchNorm") == std::string::npos) continue;
    for (const auto& e : n->next_edges()) {
      if (e.function) fed.insert(e.function.get());
    }
  }
  if (fed.empty()) return c10::nullopt;
  const auto unsynced = [&](const torch::nn::Module& m) {
    at::Tensor weight;
    if (!m.is_training() || !(batch_norm_weight<torch::nn::BatchNorm1dImpl>(m, weight) ||
                              batch_norm_weight<torch::nn::BatchNorm2dImpl>(m, weight) ||
                              batch_norm_weight<torch::nn::BatchNorm3dImpl>(m, weight))) {
      return false;
    }
    auto acc = weight.defined() ? torch::autograd::impl::try_get_grad_accumulator(weight) : nullptr;
    return acc && fed.count(acc.get()) > 0;
  };
  // The module itself apart: named_modules(include_self) needs it held by a shared_ptr.
  if (unsynced(module)) return std::string("(the module itself)");
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    if (unsynced(*item.value())) return item.key();
  }
  return c10::nullopt;
}

// Where each parameter's gradient stands: which tensor, at which version. A backward that adds to
// a gradient changes one or the other (accumulated in place, or a new tensor).
std::vector<std::pair<const c10::TensorImpl*, uint32_t>> gradient_marks(
    const torch::nn::Module& module) {
  std::vector<std::pair<const c10::TensorImpl*, uint32_t>> marks;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    const at::Tensor& g = p.grad();
    marks.emplace_back(g.defined() ? g.unsafeGetTensorImpl() : nullptr,
                       g.defined() ? g._version() : 0);
  }
  return marks;
}

// Whether `graph` reaches one of `module`'s parameters' gradient accumulators (a parameter the
// graph uses has one; it lives as long as the graph).
bool reaches(const std::unordered_set<const torch::autograd::Node*>& graph,
             const torch::nn::Module& module) {
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    auto acc = torch::autograd::impl::try_get_grad_accumulator(p);
    if (acc && graph.count(acc.get()) > 0) return true;
  }
  return false;
}

}  // namespace

void Fabric::backward(const at::Tensor& loss) {
  backward_with(loss, {});
}

void Fabric::backward_with(const at::Tensor& loss,
                           const std::vector<const torch::nn::Module*>& named) {
  check_set_up("backward()");
  VOLT_CHECK(loss.defined() && loss.numel() == 1, ValueError, kTag,
             " backward() needs a loss with one element, got ",
             loss.defined() ? loss.sizes() : c10::IntArrayRef{},
             loss.defined() ? "" : " (undefined)", "; reduce it (mean or sum) first.");
  // The loss's graph, walked once and only when needed.
  c10::optional<std::unordered_set<const torch::autograd::Node*>> walked;
  const auto graph = [&]() -> const std::unordered_set<const torch::autograd::Node*>& {
    if (!walked) walked = graph_of(loss);
    return *walked;
  };
  std::vector<SetUp*> modules;
  if (set_up_.size() == 1) {
    for (const torch::nn::Module* m : named) set_up_for(*m, "backward()");
    modules.push_back(set_up_.front().get());
  } else {
    // The modules the graph shows and those named, in setup order.
    std::unordered_set<const SetUp*> wanted;
    for (const torch::nn::Module* m : named) wanted.insert(&set_up_for(*m, "backward()"));
    for (const auto& s : set_up_) {
      if (wanted.count(s.get()) > 0 || reaches(graph(), *s->module)) modules.push_back(s.get());
    }
  }
  const bool distributed = strategy_->world_size() > 1;
  if (options_.sync_batchnorm() && distributed) {
    for (const SetUp* s : modules) {
      // The strategy can only synchronize the BatchNorm layers of forwards it sees.
      VOLT_CHECK(s->forward_seen, ConfigError, kTag,
                 " backward() through a module whose forward ran outside "
                 "fabric.forward_context(module) while sync_batchnorm is on: its BatchNorm "
                 "layers used this rank's statistics alone; run its training forward inside "
                 "the context.");
      const auto layer = unsynced_batch_norm(*s->module, graph());
      VOLT_CHECK(!layer, ConfigError, kTag, " backward() through BatchNorm layer '", *layer,
                 "' of a set-up module whose training forward ran outside "
                 "fabric.forward_context(module) while sync_batchnorm is on: it normalized by "
                 "this rank's statistics alone; run every training forward of the module "
                 "inside the context.");
    }
  }
  if (set_up_.size() == 1) {
    strategy_->backward(loss, *modules.front()->module, sync_ && modules.front()->sync);
    return;
  }
  // Every rank must arm the same modules' reducers, or one rank's all-reduces pair with another
  // module's on the others (a loss that reaches a module on some ranks only: a data-dependent
  // branch). One small all-reduce agrees on them. A module reached on some ranks only is armed
  // everywhere without syncing (its hooks fire in a different order on each rank, so its bucket
  // all-reduces would interleave with the others' differently), and its gradients are averaged
  // after the backward, zeros where a rank's graph missed it (as DDP treats a parameter one rank
  // did not use).
  std::vector<SetUp*> partial;
  if (distributed) {  // also under no_backward_sync: c10d's bucket rebuild is a collective
    at::Tensor mask = at::zeros({static_cast<int64_t>(set_up_.size())}, at::kLong);
    for (size_t i = 0; i < set_up_.size(); ++i) {
      if (std::find(modules.begin(), modules.end(), set_up_[i].get()) != modules.end()) {
        mask[static_cast<int64_t>(i)] = 1;
      }
    }
    const at::Tensor reached_by = strategy_->reduce(mask, Reduce::kSum);
    const int64_t world = strategy_->world_size();
    std::vector<SetUp*> agreed;
    for (size_t i = 0; i < set_up_.size(); ++i) {
      const int64_t n = reached_by[static_cast<int64_t>(i)].item<int64_t>();
      if (n == 0) continue;
      SetUp* s = set_up_[i].get();
      agreed.push_back(s);
      if (n == world) continue;
      // ZeRO's engines reduce and partition gradients as their hooks see them, which the
      // average after backward cannot stand in for. `n` is the same on every rank, so every
      // rank refuses.
      VOLT_CHECK(!sharded(*strategy_), ConfigError, kTag, " backward() reached set-up module ", i,
                 " (", s->user->name(), ") on ", n, " of ", world,
                 " ranks (a data-dependent branch of the loss); under \"deepspeed\" every rank's "
                 "loss must reach the same modules: add 0 * (a term of its output) to the loss "
                 "where the branch is not taken.");
      if (sync_ && s->sync) partial.push_back(s);
    }
    modules = std::move(agreed);
  }
  // A module left out here whose parameters still get gradients ran where the graph did not
  // show it (wholly inside volt::checkpoint): its gradients would silently differ across ranks.
  std::vector<std::pair<const SetUp*, std::vector<std::pair<const c10::TensorImpl*, uint32_t>>>>
      left_out;
  if (distributed && sync_) {
    for (const auto& s : set_up_) {
      if (s->sync && std::find(modules.begin(), modules.end(), s.get()) == modules.end()) {
        left_out.emplace_back(s.get(), gradient_marks(*s->module));
      }
    }
  }
  std::vector<Strategy::Reached> reached;
  for (SetUp* s : modules) {
    const bool later = std::find(partial.begin(), partial.end(), s) != partial.end();
    reached.push_back({s->module.get(), sync_ && s->sync && !later});
  }
  strategy_->backward_through(loss, reached);
  for (SetUp* s : partial) {  // in setup order on every rank
    detail::average_gradients(
        *s->module, [this](const at::Tensor& t, Reduce op) { return strategy_->reduce(t, op); });
  }
  if (!left_out.empty()) {
    // Decided alike on every rank (the list is, after the agreement above): a rank that threw
    // alone would leave the others in their next collective.
    at::Tensor changed = at::zeros({static_cast<int64_t>(left_out.size())}, at::kLong);
    for (size_t i = 0; i < left_out.size(); ++i) {
      if (gradient_marks(*left_out[i].first->module) != left_out[i].second) {
        changed[static_cast<int64_t>(i)] = 1;
      }
    }
    changed = strategy_->reduce(changed, Reduce::kMax);
    for (size_t i = 0; i < left_out.size(); ++i) {
      const SetUp* s = left_out[i].first;
      const auto index = std::find_if(set_up_.begin(), set_up_.end(),
                                      [&](const auto& u) { return u.get() == s; }) -
                         set_up_.begin();
      VOLT_CHECK(changed[static_cast<int64_t>(i)].item<int64_t>() == 0, ConfigError, kTag,
                 " backward() gave gradients to set-up module ", index, " (", s->user->name(),
                 ") on some rank, which the loss's graph does not show (did it run wholly inside "
                 "volt::checkpoint?): they were not averaged over the ranks. Name it: "
                 "fabric.backward(loss, module).");
    }
  }
}

Fabric::NoBackwardSync::NoBackwardSync(bool* sync, bool enabled) : sync_(sync), previous_(*sync) {
  if (enabled) *sync_ = false;
}

Fabric::NoBackwardSync::NoBackwardSync(NoBackwardSync&& other) noexcept
    : sync_(std::exchange(other.sync_, nullptr)), previous_(other.previous_) {}

Fabric::NoBackwardSync::~NoBackwardSync() {
  if (sync_ != nullptr) *sync_ = previous_;
}

Fabric::NoBackwardSync Fabric::no_backward_sync(bool enabled) {
  check_set_up("no_backward_sync()");
  return NoBackwardSync(&sync_, enabled);
}

Fabric::NoBackwardSync Fabric::no_backward_sync(torch::nn::Module& module, bool enabled) {
  return NoBackwardSync(&set_up_for(module, "no_backward_sync()").sync, enabled);
}

bool Fabric::step(torch::optim::Optimizer& optimizer) {
  check_set_up("step()");
  VOLT_CHECK(owner_of(optimizer) != nullptr, ConfigError, kTag,
             " step() got an optimizer that setup() did not take; pass it to "
             "fabric.setup(module, {optimizer}).");
  const bool stepped = strategy_->optimizer_step(optimizer, c10::nullopt, ClipAlgorithm::kNorm);
  if (stepped) ++steps_;  // a volt::Module's global_step() and log steps
  return stepped;
}

void Fabric::zero_grad(torch::optim::Optimizer& optimizer) {
  // As step(): a sharded strategy zeroes what it made of the optimizer, so one it did not take
  // is a mistake in the loop (its gradients were left as they were under "deepspeed").
  check_set_up("zero_grad()");
  VOLT_CHECK(owner_of(optimizer) != nullptr, ConfigError, kTag,
             " zero_grad() got an optimizer that setup() did not take; pass it to "
             "fabric.setup(module, {optimizer}), or call its own zero_grad().");
  strategy_->zero_grad(optimizer);
}

at::Tensor Fabric::clip_gradients(torch::optim::Optimizer& optimizer, double value,
                                  ClipAlgorithm algorithm) {
  check_set_up("clip_gradients()");
  VOLT_CHECK(owner_of(optimizer) != nullptr, ConfigError, kTag,
             " clip_gradients() got an optimizer that setup() did not take; pass it to "
             "fabric.setup(module, {optimizer}).");
  VOLT_CHECK(value > 0, ConfigError, kTag, " clip_gradients() needs a value > 0 (the largest ",
             algorithm == ClipAlgorithm::kNorm ? "total norm" : "gradient element", "), got ",
             value, ".");
  // Lightning Fabric's DeepSpeed strategy refuses it too: ZeRO's step prepares the gradients
  // (reduced chunks, fp32 masters) it clips.
  VOLT_CHECK(!sharded(*strategy_), ConfigError, kTag,
             " clip_gradients() under \"deepspeed\": ZeRO clips inside its step; set "
             "\"gradient_clipping\" in the DeepSpeed config (DeepSpeedStrategyOptions::config).");
  precision_->unscale_gradients(optimizer);
  return strategy_->clip_gradients(optimizer, value, algorithm);
}

namespace {

// A collective's operand: ProcessGroup's checks, also with one process (the same error with one
// process as with several).
void check_operand(const at::Tensor& value, const char* op) {
  VOLT_CHECK(value.defined(), ValueError, kTag, " ", op,
             "() got an undefined tensor; pass a tensor on every rank.");
  detail::check_collective_operand(value, kTag, op);
}

}  // namespace

at::Tensor Fabric::all_reduce(const at::Tensor& value, Reduce op) {
  check_operand(value, "all_reduce");
  detail::check_reduction(value.scalar_type(), op, kTag, "all_reduce");
  launch();
  return strategy_->reduce(to_device(value), op);
}

at::Tensor Fabric::all_gather(const at::Tensor& value) {
  check_operand(value, "all_gather");
  launch();
  return at::stack(strategy_->all_gather(to_device(value)));
}

at::Tensor Fabric::broadcast(const at::Tensor& value, int64_t src) {
  const int64_t world = world_size();
  VOLT_CHECK(src >= 0 && src < world, ValueError, kTag, " broadcast from rank ", src,
             ", but the ranks are 0..", world - 1, ".");
  if (world == 1) {
    check_operand(value, "broadcast");
    return strategy_->broadcast(to_device(value), src);
  }
  // Rank src's dtype and shape go first, so the other ranks receive into a tensor of its kind
  // whatever they passed; a value rank src cannot send is sent as an error code, so every rank
  // fails alike instead of the others waiting for data that never comes.
  constexpr int64_t kMaxDims = 16, kUndefined = -1, kNotDense = -2, kTooManyDims = -3;
  at::Tensor header = at::zeros({2 + kMaxDims}, at::kLong);
  if (global_rank() == src) {
    auto h = header.accessor<int64_t, 1>();
    if (!value.defined()) {
      h[0] = kUndefined;
    } else if (value.layout() != at::kStrided || value.is_quantized()) {
      h[0] = kNotDense;
    } else if (value.dim() > kMaxDims) {
      h[0] = kTooManyDims;
    } else {
      h[0] = static_cast<int64_t>(value.scalar_type());
      h[1] = value.dim();
      for (int64_t d = 0; d < value.dim(); ++d) h[2 + d] = value.size(d);
    }
  }
  header = strategy_->broadcast(to_device(header), src).cpu().contiguous();
  const int64_t* h = header.data_ptr<int64_t>();
  VOLT_CHECK(h[0] >= 0, ValueError, kTag, " broadcast from rank ", src, ": its value is ",
             h[0] == kUndefined  ? std::string("undefined")
             : h[0] == kNotDense ? std::string("sparse or quantized")
                                 : "of more than " + std::to_string(kMaxDims) + " dimensions",
             "; rank ", src,
             " must pass a defined dense tensor (make it dense with .to_dense(), "
             ".dequantize() or reshape it).");
  const std::vector<int64_t> sizes(h + 2, h + 2 + h[1]);
  const at::Tensor sent =
      global_rank() == src
          ? to_device(value)
          : at::empty(sizes, at::TensorOptions(static_cast<at::ScalarType>(h[0])).device(device()));
  return strategy_->broadcast(sent, src);
}

void Fabric::barrier(const std::string& name) {
  launch();
  strategy_->barrier(name);
}

Fabric::RankZeroFirst::RankZeroFirst(Fabric* fabric, bool first)
    : fabric_(fabric), first_(first), exceptions_(std::uncaught_exceptions()) {
  // The others wait here until the first ones have run the block and reached the same barrier
  // in their destructor.
  if (!first_) fabric_->barrier("Fabric.rank_zero_first");
}

Fabric::RankZeroFirst::RankZeroFirst(RankZeroFirst&& other) noexcept
    : fabric_(std::exchange(other.fabric_, nullptr)),
      first_(other.first_),
      exceptions_(other.exceptions_) {}

Fabric::RankZeroFirst::~RankZeroFirst() noexcept(false) {
  // A block left by an exception does not release the others: they would run on what it failed
  // to prepare. They fail when this process ends instead.
  if (fabric_ != nullptr && first_ && std::uncaught_exceptions() == exceptions_) {
    fabric_->barrier("Fabric.rank_zero_first");
  }
}

Fabric::RankZeroFirst Fabric::rank_zero_first(bool local) {
  launch();
  if (world_size() == 1) return RankZeroFirst(nullptr, true);
  return RankZeroFirst(this, (local ? local_rank() : global_rank()) == 0);
}

void Fabric::print(const std::string& text) {
  if (local_rank() == 0) std::cout << text << std::endl;
}

void Fabric::log(const std::string& name, double value, c10::optional<int64_t> step) {
  log_dict({{name, value}}, step);
}

void Fabric::log(const std::string& name, const at::Tensor& value, c10::optional<int64_t> step) {
  VOLT_CHECK(value.defined() && value.numel() == 1, ValueError, kTag, " log(\"", name,
             "\") needs a tensor of one element, got ",
             value.defined() ? value.sizes() : c10::IntArrayRef{}, "; reduce it first.");
  if (!is_global_zero()) return;  // the value is read on the host on rank 0 only
  log_dict({{name, value.item<double>()}}, step);
}

void Fabric::log_dict(const Metrics& metrics, c10::optional<int64_t> step) {
  if (!is_global_zero()) return;
  const int64_t at = step.value_or(steps_);
  for (const auto& l : options_.loggers()) {
    if (l) l->log_metrics(metrics, at);
  }
}

// ------------------------------------------------------------------ checkpoints

void Fabric::save(const std::string& path, const FabricState& state) {
  launch();
  VOLT_CHECK(!path.empty(), ConfigError, kTag, " save() needs a path.");
  std::vector<Module*> modules;  // the state's, as the strategy holds them
  for (const auto& [name, m] : state.modules_) {
    SetUp* s = set_up_of(*m);
    VOLT_CHECK(s != nullptr, ConfigError, kTag, " state module '", name,
               "' is not one setup() took; pass it to fabric.setup(module, {optimizers}).");
    modules.push_back(s->module.get());
  }
  for (const auto& [name, o] : state.optimizers_) {
    VOLT_CHECK(owner_of(*o) != nullptr, ConfigError, kTag, " state optimizer '", name,
               "' is not one setup() took; pass it to fabric.setup(module, {optimizer}).");
  }
  torch::serialize::OutputArchive root;
  root.write("volt_format", c10::IValue(kCheckpointFormat));
  root.write("fabric_format", c10::IValue(kFabricFormat));
  // A Trainer's fit cannot resume from it (no loop state); load_weights and evaluation can read
  // the first module, which goes where a Trainer checkpoint has its module.
  root.write("weights_only", c10::IValue(true));
  if (!modules.empty()) {
    write_nested(root, "state_dict",
                 [&](auto& ar) { strategy_->save_model_state(*modules.front(), ar); });
  }
  write_nested(root, "module", [&](auto& ar) {
    if (!modules.empty()) modules.front()->on_save_checkpoint(ar);
  });
  write_nested(root, "fabric", [&](auto& fab) {
    if (!modules.empty()) fab.write("module_name", c10::IValue(state.modules_.front().first));
    // The state's other modules: each one's weights and on_save_checkpoint entries.
    write_nested(fab, "modules", [&](auto& ar) {
      for (size_t i = 1; i < modules.size(); ++i) {
        write_nested(ar, state.modules_[i].first, [&](auto& one) {
          write_nested(one, "state_dict",
                       [&](auto& w) { strategy_->save_model_state(*modules[i], w); });
          write_nested(one, "module", [&](auto& h) { modules[i]->on_save_checkpoint(h); });
        });
      }
    });
    // The steps taken (log()'s default step, a volt::Module's global_step): a loaded run goes on
    // counting from here.
    fab.write("global_step", c10::IValue(steps_));
    write_nested(fab, "optimizers", [&](auto& ar) {
      for (const auto& [name, o] : state.optimizers_) {
        const Module* owner = owner_of(*o)->module.get();
        write_nested(ar, name, [&](auto& one) {
          strategy_->save_optimizer_state(*o, *owner, one);
          // Where its module's weights are in this file (a ZeRO folder's consolidation puts
          // the fp32 master weights there).
          for (size_t i = 0; i < modules.size(); ++i) {
            if (modules[i] != owner) continue;
            one.write(
                "weights_at",
                c10::IValue(i == 0 ? std::string("state_dict")
                                   : "fabric/modules/" + state.modules_[i].first + "/state_dict"));
            break;
          }
        });
      }
    });
    write_nested(fab, "schedulers", [&](auto& ar) {
      for (const auto& [name, l] : state.schedulers_) {
        write_nested(ar, name, [&, l = l](auto& one) { l->save(one); });
      }
    });
    // The loss scale and its growth tracker (16-mixed): a resumed training goes on with them.
    write_nested(fab, "precision", [&](auto& ar) { strategy_->precision().save_state(ar); });
    write_nested(fab, "tensors", [&](auto& ar) {
      for (const auto& [name, t] : state.tensors_) {
        VOLT_CHECK(t->defined(), ConfigError, kTag, " state tensor '", name, "' is undefined.");
        ar.write(name, t->detach());
      }
    });
    write_nested(fab, "values", [&](auto& ar) {
      for (const auto& [name, v] : state.values_) ar.write(name, v);
    });
  });
  strategy_->save_checkpoint(root, path);
  strategy_->flush_checkpoints();
  strategy_->barrier("Fabric.save");  // the file is complete wherever save() returns
}

void Fabric::load(const std::string& path, FabricState& state, bool strict) {
  launch();
  std::vector<Module*> modules;
  for (const auto& [name, m] : state.modules_) {
    SetUp* s = set_up_of(*m);
    VOLT_CHECK(s != nullptr, ConfigError, kTag, " state module '", name,
               "' is not one setup() took; set it up before load().");
    modules.push_back(s->module.get());
  }
  for (const auto& [name, o] : state.optimizers_) {
    VOLT_CHECK(owner_of(*o) != nullptr, ConfigError, kTag, " state optimizer '", name,
               "' is not one setup() took; pass it to fabric.setup(module, {optimizer}).");
  }
  // Optimizer states are read when the state names optimizers: a ZeRO folder's are consolidated
  // then, and only then (LoopSettings::fitting, which the last setup() set for its module).
  LoopSettings loop = strategy_->loop_settings();
  const bool fitting = loop.fitting;
  loop.fitting = !state.optimizers_.empty();
  strategy_->set_loop_settings(loop);
  torch::serialize::InputArchive root;
  try {
    root = strategy_->load_checkpoint(path);
  } catch (...) {
    loop.fitting = fitting;
    strategy_->set_loop_settings(loop);
    throw;
  }
  loop.fitting = fitting;
  strategy_->set_loop_settings(loop);
  c10::IValue format;
  torch::serialize::InputArchive fab;
  VOLT_CHECK(
      root.try_read("fabric_format", format) && format.isInt() && root.try_read("fabric", fab),
      CheckpointError, kTag, " '", path,
      "' was not written by Fabric::save; a Trainer checkpoint's weights load with "
      "volt::load_weights(module, path).");
  VOLT_CHECK(format.toInt() == kFabricFormat, CheckpointError, kTag, " '", path,
             "' has Fabric format ", format.toInt(), "; this volt reads format ", kFabricFormat,
             ".");
  // Everything is found before anything changes, so a strict miss leaves the state as it was.
  std::vector<std::string> missing;
  torch::serialize::InputArchive optimizers, schedulers, precision, tensors, values, others;
  fab.read("optimizers", optimizers);
  const bool has_schedulers = fab.try_read("schedulers", schedulers);  // since session 100
  const bool has_precision = fab.try_read("precision", precision);
  fab.read("tensors", tensors);
  fab.read("values", values);
  c10::IValue first_name;
  fab.try_read("module_name", first_name);
  const bool has_others = fab.try_read("modules", others);
  struct FoundModule {
    Module* module;
    torch::serialize::InputArchive weights, hooks;
    bool has_hooks;
  };
  std::vector<FoundModule> found_modules;
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::string& name = state.modules_[i].first;
    FoundModule f{modules[i], {}, {}, false};
    bool found = false;
    if (first_name.isString() && first_name.toStringRef() == name) {
      found = root.try_read("state_dict", f.weights);
      f.has_hooks = root.try_read("module", f.hooks);
    } else if (torch::serialize::InputArchive one; has_others && others.try_read(name, one)) {
      found = one.try_read("state_dict", f.weights);
      f.has_hooks = one.try_read("module", f.hooks);
    }
    if (found) {
      found_modules.push_back(std::move(f));
    } else {
      missing.push_back("module '" + name + "'");
    }
  }
  std::vector<std::pair<torch::optim::Optimizer*, torch::serialize::InputArchive>> found_opts;
  for (const auto& [name, o] : state.optimizers_) {
    torch::serialize::InputArchive one;
    if (optimizers.try_read(name, one)) {
      // Another setup is refused here, before anything changes (the strategy's load refuses it
      // too, after the modules were loaded).
      c10::IValue groups;
      const size_t want = o->param_groups().size();
      VOLT_CHECK(!one.try_read("num_groups", groups) || !groups.isInt() ||
                     groups.toInt() == static_cast<int64_t>(want),
                 CheckpointError, kTag, " '", path, "' holds optimizer '", name, "' with ",
                 groups.toInt(), " param groups, not ", want,
                 "; load it into an optimizer built the same way (nothing was loaded).");
      found_opts.emplace_back(o, std::move(one));
    } else {
      missing.push_back("optimizer '" + name + "'");
    }
  }
  std::vector<std::pair<LRScheduler*, torch::serialize::InputArchive>> found_schedulers;
  for (const auto& [name, l] : state.schedulers_) {
    torch::serialize::InputArchive one;
    if (has_schedulers && schedulers.try_read(name, one)) {
      // Another type is refused here, before anything changes (its own load() would refuse it
      // after the modules and optimizers were loaded).
      c10::IValue type, base;
      VOLT_CHECK(
          !one.try_read("scheduler", type) || !type.isString() || type.toStringRef() == l->name(),
          CheckpointError, kTag, " '", path, "' holds scheduler '", name, "' of type ",
          type.toStringRef(), ", not ", l->name(),
          "; load it into a scheduler of that type (nothing was loaded).");
      VOLT_CHECK(!one.try_read("base_lrs", base) || !base.isDoubleList() ||
                     base.toDoubleList().size() == l->base_lrs().size(),
                 CheckpointError, kTag, " '", path, "' holds scheduler '", name, "' over ",
                 base.toDoubleList().size(), " param groups, not ", l->base_lrs().size(),
                 "; load it into a scheduler of an optimizer built the same way (nothing was "
                 "loaded).");
      try_scheduler_load(*l, one, path, name);
      found_schedulers.emplace_back(l, std::move(one));
    } else {
      missing.push_back("scheduler '" + name + "'");
    }
  }
  std::vector<std::pair<at::Tensor*, at::Tensor>> found_tensors;
  for (const auto& [name, t] : state.tensors_) {
    at::Tensor v;
    if (tensors.try_read(name, v)) {
      found_tensors.emplace_back(t, v);
    } else {
      missing.push_back("tensor '" + name + "'");
    }
  }
  std::map<std::string, c10::IValue> found_values;
  for (const auto& [name, v] : state.values_) {
    c10::IValue read;
    if (values.try_read(name, read)) {
      found_values.emplace(name, std::move(read));
    } else {
      missing.push_back("value '" + name + "'");
    }
  }
  VOLT_CHECK(!strict || missing.empty(), CheckpointError, kTag, " '", path, "' has no ",
             join(missing), "; save them, or load with strict=false to leave them as they are.");
  for (auto& f : found_modules) {
    // The module's own state before its weights, as the Trainer (Lightning's restore_model).
    if (f.has_hooks) f.module->on_load_checkpoint(f.hooks);
    try {
      strategy_->load_model_state(*f.module, f.weights, strict);
    } catch (const CheckpointError& e) {
      throw CheckpointError(std::string(e.what()) + " (checkpoint: '" + path + "')");
    }
  }
  for (auto& [o, ar] : found_opts) {
    strategy_->load_optimizer_state(*o, *owner_of(*o)->module, ar);
  }
  for (auto& [l, ar] : found_schedulers) l->load(ar);
  // A resumed training takes the saved loss scale; loading weights alone leaves this run's, and
  // so does a file saved without loss scaling (Lightning Fabric restores no precision state).
  if (!found_opts.empty() && has_precision) {
    try {
      strategy_->precision().load_state(precision);
    } catch (const CheckpointError& e) {
      log_warning("Fabric",
                  std::string("'") + path + "': " + e.what() + " This run's loss scale is kept.");
    }
  }
  at::NoGradGuard no_grad;
  for (auto& [t, v] : found_tensors) {
    if (t->defined() && t->sizes() == v.sizes() && t->scalar_type() == v.scalar_type()) {
      t->copy_(v);
    } else {
      *t = t->defined() ? v.to(t->device()) : v;
    }
  }
  for (auto& [name, v] : found_values) state.values_[name] = std::move(v);
  // A resumed training (the state names an optimizer) goes on counting from the file's steps;
  // weights alone (a teacher, a pretrained backbone) leave this run's count as it is.
  c10::IValue global_step;
  if (!found_opts.empty() && fab.try_read("global_step", global_step) && global_step.isInt()) {
    steps_ = global_step.toInt();
  }
}

}  // namespace volt
