// PipelineStrategy: the DDP launcher and process group, without gradient all-reduce; the
// module's volt::Pipeline split over the ranks; clipping, found-inf and checkpoints across stages.
#include "volt/strategies/pipeline.h"

#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <ostream>
#include <unordered_map>
#include <unordered_set>

#include "core/detail/numbers.h"
#include "core/detail/state_key.h"
#include "kernels/detail/clip_coefficient.h"
#include "strategies/detail/rank_key.h"
#include "strategies/detail/rank_layout.h"
#include "strategies/detail/replica_mesh.h"
#include "strategies/detail/timeout.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/distributed/process_group.h"
#include "volt/io/state.h"
#include "volt/nn/pipeline.h"
#include "volt/precision/fp8_precision.h"
#include "volt/precision/precision.h"

namespace volt {
namespace {

constexpr const char* kTag = "[PipelineStrategy]";

DdpStrategyOptions ddp_options(const PipelineStrategyOptions& o) {
  VOLT_CHECK(o.chunks() >= 0, ConfigError, kTag, " chunks=", o.chunks(),
             " must be >= 0 (0 keeps the model's PipelineOptions::chunks).");
  VOLT_CHECK(o.stages() >= 0, ConfigError, kTag, " stages=", o.stages(),
             " must be >= 0 (0: one pipeline of every process).");
  VOLT_CHECK(o.checkpoint().empty() || is_checkpoint_mode(o.checkpoint()), ConfigError, kTag,
             " checkpoint='", o.checkpoint(),
             "' is not a checkpointing mode; use never, always or except_last (or leave it "
             "empty for the model's own setting).");
  VOLT_CHECK(o.activation_checkpoint_interval() >= -1, ConfigError, kTag,
             " activation_checkpoint_interval=", o.activation_checkpoint_interval(),
             " must be >= 0 (layers per checkpointed run; 0: off), or -1 for the model's own "
             "setting.");
  detail::check_timeout_s(o.timeout_s(), kTag);
  // No gradient buckets: each parameter is trained by one stage. Buffers are not broadcast over
  // the world before each step (each stage's are its own); the replicas of a stage take replica
  // 0's after each synced backward (PipelineStrategy::backward).
  return DdpStrategyOptions()
      .timeout_s(o.timeout_s())
      .process_group_backend(o.process_group_backend())
      .broadcast_buffers(false);
}

// Every rank's bytes on the group's rank 0, in rank order (their lengths may differ); empty on
// the others, which send theirs and hold nothing more (an all-gather padded to the longest gave
// every rank every rank's bytes).
std::vector<std::string> gather_bytes_to_zero(ProcessGroup& group, const std::string& mine) {
  if (group.rank() != 0) {
    group.send(at::full({1}, static_cast<int64_t>(mine.size()), at::kLong), 0);
    at::Tensor data =
        at::empty({std::max<int64_t>(1, static_cast<int64_t>(mine.size()))}, at::kByte);
    std::memcpy(data.data_ptr(), mine.data(), mine.size());
    group.send(data, 0);
    return {};
  }
  std::vector<std::string> out{mine};
  for (int64_t r = 1; r < group.world_size(); ++r) {
    at::Tensor length = at::empty({1}, at::kLong);
    group.recv_(length, r);
    const int64_t n = length.item<int64_t>();
    VOLT_CHECK(n >= 0, DistributedError, kTag, " rank ", r,
               " sent a malformed optimizer state length; every rank must run the same code.");
    at::Tensor data = at::empty({std::max<int64_t>(1, n)}, at::kByte);
    group.recv_(data, r);
    const auto* bytes = static_cast<const char*>(data.data_ptr());
    out.emplace_back(bytes, bytes + n);
  }
  return out;
}

// For the strategy's log line: how the stages checkpoint their activations, if they do, and
// whether BatchNorm's statistics move once per batch.
std::string stage_options(const PipelineOptions& o) {
  std::string out;
  if (o.checkpoint() != "never") out += ", checkpoint " + o.checkpoint();
  if (o.activation_checkpoint_interval() > 0) {
    out += ", checkpointed every " + std::to_string(o.activation_checkpoint_interval()) + " layers";
  }
  if (o.deferred_batch_norm()) out += ", deferred BatchNorm";
  return out;
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const PipelineStrategyOptions& o) {
  return os << "PipelineStrategyOptions(chunks=" << o.chunks() << ", stages=" << o.stages()
            << ", checkpoint=" << o.checkpoint()
            << ", activation_checkpoint_interval=" << o.activation_checkpoint_interval()
            << ", deferred_batch_norm=" << (o.deferred_batch_norm() ? "true" : "false")
            << ", release_other_stages=" << (o.release_other_stages() ? "true" : "false")
            << ", timeout_s=" << o.timeout_s()
            << ", process_group_backend=" << o.process_group_backend() << ")";
}

PipelineStrategy::PipelineStrategy(PipelineStrategyOptions options,
                                   std::shared_ptr<Accelerator> accelerator,
                                   std::shared_ptr<Precision> precision, int64_t devices,
                                   int64_t num_nodes, std::shared_ptr<CheckpointIO> checkpoint_io)
    : DdpStrategy(ddp_options(options), std::move(accelerator), std::move(precision), devices,
                  num_nodes, std::move(checkpoint_io)),
      options_(std::move(options)) {}

PipelineStrategy::~PipelineStrategy() = default;

void PipelineStrategy::setup_environment() {
  DdpStrategy::setup_environment();
  if (pipe_group_) return;  // the groups outlive an entry point, as the world's does
  const int64_t world = world_size();
  const int64_t stages = options_.stages() == 0 ? world : options_.stages();
  VOLT_CHECK(world % stages == 0, ConfigError, kTag, " stages=", stages, " does not divide the ",
             world,
             " processes; use a divisor of the world size (the quotient is the number of "
             "data-parallel replicas of the pipeline), or 0 for one stage per process.");
  // Consecutive ranks form a pipeline (its transfers stay on one node when devices is a
  // multiple of stages); the same stage of every replica averages gradients.
  const detail::ReplicaMesh mesh =
      detail::make_replica_mesh(group_, stages, "pipeline", "pipeline_replicas");
  stages_ = mesh.inner;
  replicas_ = mesh.replicas;
  replica_ = mesh.replica;
  pipe_group_ = mesh.inner_group;
  dp_group_ = mesh.replica_group;
  if (replicas_ == 1) return;
  log_info("PipelineStrategy", std::to_string(replicas_) + " replicas of a " +
                                   std::to_string(stages_) + "-stage pipeline");
}

void PipelineStrategy::setup_module(Module& module) {
  VOLT_CHECK(!sync_batchnorm() || replicas_ > 1, ConfigError, kTag,
             " sync_batchnorm has nothing to synchronise: every stage sees the whole batch. "
             "Turn sync_batchnorm off.");
  VOLT_CHECK(dynamic_cast<const Fp8Precision*>(precision_.get()) == nullptr, ConfigError, kTag,
             " fp8 precision is not supported: its scaling history is per layer and would be "
             "kept by each stage apart. Use bf16-mixed or 32-true with the pipeline.");
  Strategy::setup_module(module);
  std::vector<std::shared_ptr<PipelineImpl>> found;
  for (const auto& m : module.modules(/*include_self=*/false)) {
    if (auto p = std::dynamic_pointer_cast<PipelineImpl>(m)) found.push_back(p);
  }
  VOLT_CHECK(found.size() == 1, ConfigError, kTag, " the module holds ", found.size(),
             " volt::Pipeline layers; the pipeline strategy splits exactly one. Put the layers "
             "to split, in order, into one volt::Pipeline (volt/nn/pipeline.h).");
  // A weight the pipeline shares with the layers outside it would be trained by one stage inside
  // and by every rank outside, and freed where its stage is not. Every rank fails alike.
  std::string prefix;
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    if (item.value().get() == found[0].get()) {
      prefix = item.key() + ".";
      break;
    }
  }
  std::unordered_map<const c10::TensorImpl*, std::string> inside;
  for (const auto& p : found[0]->named_parameters(true)) {
    inside.emplace(p.value().unsafeGetTensorImpl(), prefix + p.key());
  }
  for (const auto& p : module.named_parameters(true)) {
    auto it = inside.find(p.value().unsafeGetTensorImpl());
    VOLT_CHECK(it == inside.end() || p.key().rfind(prefix, 0) == 0, ConfigError, kTag, " ", p.key(),
               " is the pipeline's ", it->second,
               " (a weight shared between the pipeline and the layers outside it), which the "
               "stages cannot train alike: share weights only between layers inside the "
               "pipeline (or only outside it).");
  }
  broadcast_module_state(module);  // every rank starts from rank 0's weights
  pipe_ = found[0];
  module_ = &module;
  if (options_.chunks() > 0) pipe_->set_chunks(options_.chunks());
  if (!options_.checkpoint().empty()) pipe_->set_checkpoint(options_.checkpoint());
  if (options_.activation_checkpoint_interval() >= 0) {
    pipe_->set_activation_checkpoint_interval(options_.activation_checkpoint_interval());
  }
  if (options_.deferred_batch_norm()) pipe_->set_deferred_batch_norm(true);
  VOLT_CHECK(!sync_batchnorm() || !pipe_->options().deferred_batch_norm(), ConfigError, kTag,
             " sync_batchnorm and deferred_batch_norm together are not supported (the deferred "
             "statistics are the pipeline's own, not the replicas'); use one of them.");
  pipe_->distribute(pipe_group_);
  if (options_.release_other_stages()) pipe_->release_other_stages();
  stage_of_.clear();
  mine_.clear();
  for (int64_t s = 0; s < pipe_->num_stages(); ++s) {
    for (const auto& p : pipe_->stage_parameters(s)) stage_of_.emplace(p.unsafeGetTensorImpl(), s);
  }
  for (const auto& p : pipe_->stage_parameters(pipe_->stage())) {
    mine_.insert(p.unsafeGetTensorImpl());
  }
  // Outside the pipeline every rank trains alike (layers before it get stage 0's input gradient
  // on every rank, layers after it the same loss's); stage 0's copy is the one saved.
  owner_by_name_.clear();
  for (const auto& p : module.named_parameters(true)) {
    auto it = stage_of_.find(p.value().unsafeGetTensorImpl());
    owner_by_name_[p.key()] = it == stage_of_.end() ? 0 : it->second;
  }
  const auto [first, last] = pipe_->stage_layers(pipe_->stage());
  log_info("PipelineStrategy",
           "rank " + std::to_string(rank()) + " runs stage " + std::to_string(pipe_->stage()) +
               " of " + std::to_string(pipe_->num_stages()) + ": layers " + std::to_string(first) +
               "-" + std::to_string(last - 1) + ", " + std::to_string(pipe_->options().chunks()) +
               " micro-batches" + stage_options(pipe_->options()));
  // The BatchNorm layers of this rank's stage (and outside the pipeline) normalise over the
  // stage's replicas: each micro-batch by the statistics of that micro-batch on every replica.
  sync_batchnorm_over(module, sync_batchnorm() ? dp_group_ : nullptr);
}

void PipelineStrategy::teardown() {
  // After a failed run (the Trainer's error handler, a Fabric destroyed by an exception) the
  // ranks are out of step: nothing collective runs then. After a normal end every rank gets the
  // whole trained model, and the pipeline runs whole (a program's own forward after fit must not
  // wait for other ranks).
  if (pipe_ && pipe_->distributed()) {
    // Also after validate / test / predict: the other stages' weights were released there too,
    // and undistribute() would leave zeros in their place.
    if (module_ != nullptr && !run_failed()) {
      gather_model(*module_);
    }
    pipe_->undistribute();
  }
  module_ = nullptr;
  DdpStrategy::teardown();
}

void PipelineStrategy::gather_model(const Module& module) const {
  pipe_->gather();
  // What lies outside the pipeline, from stage 0 (see setup_module).
  std::unordered_set<const c10::TensorImpl*> inside;
  for (const auto& t : pipe_->parameters(true)) inside.insert(t.unsafeGetTensorImpl());
  for (const auto& t : pipe_->buffers(true)) inside.insert(t.unsafeGetTensorImpl());
  std::vector<at::Tensor> outside;
  for (const auto& t : module.parameters(true)) {
    if (!inside.count(t.unsafeGetTensorImpl())) outside.push_back(t.detach());
  }
  for (const auto& t : module.buffers(true)) {
    if (t.defined() && !inside.count(t.unsafeGetTensorImpl())) outside.push_back(t.detach());
  }
  torch::NoGradGuard no_grad;
  if (!outside.empty()) pipe_group_->broadcast_(outside, 0);
}

int64_t PipelineStrategy::owner(const std::string& name) const {
  auto it = owner_by_name_.find(name);
  return it == owner_by_name_.end() ? 0 : it->second;
}

bool PipelineStrategy::trains(const at::Tensor& p) const {
  return !stage_of_.count(p.unsafeGetTensorImpl()) || mine_.count(p.unsafeGetTensorImpl());
}

void PipelineStrategy::backward(const at::Tensor& loss, Module& module, bool sync_gradients) {
  Strategy::backward(loss, module, sync_gradients);
  // As DDP's no_sync: accumulating micro-steps keep their own sums, the last one averages.
  if (dp_group_ && sync_gradients) {
    average_over_replicas(module);
    // And as DDP's broadcast_buffers: the replicas of a stage hold replica 0's buffers (a
    // BatchNorm's running statistics, which each replica moved by its own shard of the data),
    // once per optimizer step. Before session 99 they drifted apart: validation mixed the
    // replicas' models and a checkpoint kept replica 0's alone.
    std::vector<at::Tensor> buffers;
    for (const auto& b : module.buffers(true)) {
      if (b.defined() && b.numel() > 0) buffers.push_back(b.detach());
    }
    torch::NoGradGuard no_grad;
    if (!buffers.empty()) dp_group_->broadcast_(buffers, 0);
  }
}

void PipelineStrategy::average_over_replicas(const Module& module) {
  detail::average_over_replicas(dp_group_.get(), module);
}

bool PipelineStrategy::optimizer_step(torch::optim::Optimizer& optimizer,
                                      c10::optional<double> clip_value, ClipAlgorithm algorithm,
                                      const ClipCall& clip) {
  // Strategy::optimizer_step's sequence, with the ranks agreeing on inf/NaN gradients: each
  // checked only its own stage's, and a stage that skipped a step the others took would train
  // a model that is no longer one.
  detail::unscale_agreeing_on_found_inf(*precision_, group(), optimizer);
  clip_for_step(optimizer, clip_value, algorithm, clip);
  return precision_->optimizer_step(optimizer);
}

at::Tensor PipelineStrategy::clip_gradients(torch::optim::Optimizer& optimizer, double value,
                                            ClipAlgorithm algorithm) {
  if (algorithm != ClipAlgorithm::kNorm || !pipe_ || !pipe_->distributed()) {
    return Strategy::clip_gradients(optimizer, value, algorithm);
  }
  // The norm over every stage's gradients: each stage sums the squares of its own (a tied one's
  // the first stage holding it), and of the parameters outside the pipeline stage 0 does (every
  // stage has the same gradients for them); the sum over the pipeline is the whole model's, as
  // clip_grad_norm_ in one process (replicas hold the same, averaged, gradients).
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  at::Tensor squares = at::zeros({}, at::kDouble);
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      grads.push_back(p.grad());
      auto it = stage_of_.find(p.unsafeGetTensorImpl());
      const bool counted = (it == stage_of_.end() ? 0 : it->second) == pipe_->stage();
      if (counted) squares += p.grad().to(at::kDouble).pow(2).sum().cpu();
    }
  }
  const at::Tensor total = pipe_group_->all_reduce(squares, Reduce::kSum).sqrt();
  const double coef = detail::clip_coefficient(value, total.item<double>());  // NaN: all NaN
  if (coef != 1.0) {
    for (auto& g : grads) g.mul_(coef);
  }
  return total;
}

void PipelineStrategy::save_model_state(const Module& module,
                                        torch::serialize::OutputArchive& ar) const {
  if (!pipe_ || !pipe_->distributed()) {
    Strategy::save_model_state(module, ar);
    return;
  }
  if (!pipe_->released()) {
    gather_model(module);
    Strategy::save_model_state(module, ar);
    return;
  }
  // Only global rank 0 (replica 0's first stage) writes the file: the other stages of its
  // pipeline send it their weights, a stage at a time, and no other rank allocates another
  // stage's weights (every rank held the whole model while a checkpoint was saved, where a
  // pipeline's point is that it does not fit one rank). The other replicas hold the same weights.
  if (replica_ != 0) return;
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> tensors;  // each once (a tied one has several names)
  std::unordered_set<const c10::TensorImpl*> seen;
  const auto list = [&](const at::Tensor& t) {
    if (t.defined() && seen.insert(t.unsafeGetTensorImpl()).second) tensors.push_back(t);
  };
  for (const auto& item : module.named_parameters(true)) list(item.value());
  for (const auto& item : module.named_buffers(true)) list(item.value());
  std::vector<at::Tensor> values;
  values.reserve(tensors.size());
  for (const auto& t : tensors) values.push_back(t.detach());
  values = pipe_->gather_beside(tensors, std::move(values), /*dst=*/0);
  if (pipe_->stage() != 0) return;
  // What lies outside the pipeline is stage 0's (see setup_module), as this rank's own stage.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> whole;
  for (size_t i = 0; i < tensors.size(); ++i)
    whole.emplace(tensors[i].unsafeGetTensorImpl(), values[i]);
  const auto of = [&](const at::Tensor& t) {
    const auto it = whole.find(t.unsafeGetTensorImpl());
    return it != whole.end() ? it->second : t;
  };
  for (const auto& item : module.named_parameters(true)) ar.write(item.key(), of(item.value()));
  for (const auto& item : module.named_buffers(true)) {
    ar.write(item.key(), of(item.value()), /*is_buffer=*/true);
  }
}

void PipelineStrategy::load_model_state(Module& module, torch::serialize::InputArchive& ar,
                                        bool strict) const {
  // Every tensor whole for the load, then the other stages' freed again.
  const bool released = pipe_ && pipe_->released();
  if (released) pipe_->restore_other_stages();
  Strategy::load_model_state(module, ar, strict);
  if (released) pipe_->release_other_stages();
}

void PipelineStrategy::save_optimizer_state(const torch::optim::Optimizer& optimizer,
                                            const Module& module,
                                            torch::serialize::OutputArchive& ar) const {
  if (!pipe_ || !pipe_->distributed()) {
    Strategy::save_optimizer_state(optimizer, module, ar);
    return;
  }
  // Each rank holds the state of what it trains: every rank's archive, then each parameter's
  // state from its owner, in volt::save_optimizer_state's format (loads anywhere). Only global
  // rank 0 writes the file: the other replicas keep theirs, and in replica 0 the stages send
  // theirs to its first rank (about 3x the stage's weights for Adam; every rank held every
  // stage's before).
  if (replica_ != 0) return;
  torch::serialize::OutputArchive mine;
  volt::save_optimizer_state(optimizer, module, mine);
  auto os = detail::c_stream<std::ostringstream>();
  mine.save_to(os);
  const auto bytes = gather_bytes_to_zero(*pipe_group_, os.str());
  if (bytes.empty()) return;
  std::vector<torch::serialize::InputArchive> parts(bytes.size());
  for (size_t r = 0; r < bytes.size(); ++r) {
    auto is = detail::c_stream<std::istringstream>(bytes[r]);
    parts[r].load_from(is);
  }
  c10::IValue num_groups;
  parts[0].read("num_groups", num_groups);
  ar.write("num_groups", num_groups);
  for (int64_t g = 0; g < num_groups.toInt(); ++g) {
    const std::string key = "group_" + std::to_string(g);
    std::vector<torch::serialize::InputArchive> groups(parts.size()), states(parts.size());
    for (size_t r = 0; r < parts.size(); ++r) {
      parts[r].read(key, groups[r]);
      groups[r].read("state", states[r]);
    }
    torch::serialize::OutputArchive group_ar, options_ar, states_ar;
    optimizer.param_groups()[g].options().serialize(options_ar);  // the same on every rank
    group_ar.write("options", options_ar);
    c10::IValue names;
    groups[0].read("params", names);
    group_ar.write("params", names);
    const auto list = c10::impl::toTypedList<std::string>(names.toList());
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string name = list.get(i);
      torch::serialize::InputArchive one;
      if (!states[owner(name)].try_read(name, one)) continue;  // never stepped
      auto st = new_optimizer_param_state(optimizer);
      st->serialize(one);
      torch::serialize::OutputArchive out;
      st->serialize(out);
      states_ar.write(name, out);
    }
    group_ar.write("state", states_ar);
    ar.write(key, group_ar);
  }
}

void PipelineStrategy::load_optimizer_state(torch::optim::Optimizer& optimizer,
                                            const Module& module,
                                            torch::serialize::InputArchive& ar) const {
  Strategy::load_optimizer_state(optimizer, module, ar);
  if (!pipe_ || !pipe_->distributed()) return;
  // The other stages' state stays with them.
  auto& state = optimizer.state();
  for (const auto& p : pipe_->foreign_parameters()) {
    state.erase(detail::state_key_for<detail::OptimizerStateKey>(p));
  }
}

namespace {
// Beside the accumulated gradients: the layout (stages, replicas) whose ranks' partial sums the
// "rank<r>." entries hold. A rank's own entry is its partial sum only under that layout.
constexpr const char* kLayoutKey = "__pipeline_layout__";
}  // namespace

void PipelineStrategy::save_accumulated_gradients(const Module& module,
                                                  torch::serialize::OutputArchive& ar) const {
  if (!pipe_ || !pipe_->distributed()) {
    Strategy::save_accumulated_gradients(module, ar);
    return;
  }
  // Each rank's partial sums of what it trains under "rank<r>.<name>" (a resume at the same
  // layout), and under the plain name the mean of its owning stage's replicas: what one process
  // on the global batch would have accumulated (a resume at any other layout, or one process).
  std::unordered_map<const c10::TensorImpl*, std::vector<bool>> held_by;  // pipeline parameters
  for (int64_t s = 0; s < stages_; ++s) {
    for (const auto& p : pipe_->stage_parameters(s)) {
      auto& stages = held_by[p.unsafeGetTensorImpl()];
      stages.resize(stages_, false);
      stages[s] = true;
    }
  }
  // Global rank 0 writes the file: each other rank holding a parameter sends it its partial sum,
  // in parameter order (every rank all-gathered every gradient, world copies of each).
  const int64_t me = group().rank();
  const int64_t world = group().world_size();
  for (const auto& p : module.named_parameters(true)) {
    if (!p.value().requires_grad()) continue;
    const auto held = held_by.find(p.value().unsafeGetTensorImpl());
    // Outside the pipeline every rank trains it; inside, the ranks of the stages holding it.
    const auto holds = [&](int64_t r) {
      return held == held_by.end() || held->second[static_cast<size_t>(r % stages_)];
    };
    const auto whole = pipe_->whole_shape(p.value());
    const auto mine = [&] {
      return p.value().grad().defined() ? p.value().grad().contiguous()
                                        : torch::zeros(whole, p.value().options());
    };
    if (me != 0) {
      if (holds(me)) group().send(mine(), 0);
      continue;
    }
    std::vector<at::Tensor> all(static_cast<size_t>(world));
    for (int64_t r = 0; r < world; ++r) {
      if (!holds(r)) continue;
      if (r == 0) {
        all[0] = mine();
      } else {
        all[static_cast<size_t>(r)] = at::empty(whole, p.value().options());
        group().recv_(all[static_cast<size_t>(r)], r);
      }
      ar.write(detail::rank_key(r, p.key()), all[static_cast<size_t>(r)]);
    }
    std::vector<at::Tensor> owners;
    for (int64_t d = 0; d < replicas_; ++d) owners.push_back(all[d * stages_ + owner(p.key())]);
    ar.write(p.key(), owners.size() == 1 ? owners[0] : torch::stack(owners).mean(0));
  }
  detail::write_rank_layout(ar, kLayoutKey, stages_, replicas_);
}

void PipelineStrategy::load_accumulated_gradients(Module& module,
                                                  torch::serialize::InputArchive& ar) {
  // This rank's own partial sums when the checkpoint's ranks ran this layout (the same stages and
  // replicas); under another one a rank's entry holds other layers' sums or misses ranks', so
  // every rank reads the mean (as does a checkpoint written before the layout was recorded).
  const bool same_layout =
      detail::read_rank_layout(ar, kLayoutKey, stages_, replicas_) == detail::RankLayout::kSame;
  for (auto& p : module.named_parameters(true)) {
    if (!trains(p.value())) continue;  // another stage's: it gets no gradient here
    at::Tensor g;
    if ((same_layout && ar.try_read(detail::rank_key(rank(), p.key()), g)) ||
        ar.try_read(p.key(), g)) {
      p.value().mutable_grad() = g.to(p.value().device());
    }
  }
}

}  // namespace volt
