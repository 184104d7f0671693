// ModelParallelStrategy: the DDP launcher and process group; a tensor-parallel group of
// consecutive ranks splits the module (TensorParallelEngine, differentiated across the group),
// the groups split the data and average their gradients; clipping and found-inf see the whole
// model; checkpoints are the first group's shards in a folder (save_distributed_checkpoint) or
// the whole model in one file.
#include "volt/strategies/model_parallel.h"

#include <torch/torch.h>

#include <ostream>
#include <utility>

#include "core/detail/numbers.h"
#include "core/detail/state_key.h"
#include "distributed/detail/bucket_cap.h"
#include "kernels/detail/state_tensors.h"
#include "strategies/detail/checkpoint_folder.h"
#include "strategies/detail/rank_key.h"
#include "strategies/detail/rank_layout.h"
#include "strategies/detail/replica_mesh.h"
#include "strategies/detail/timeout.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/distributed/process_group.h"
#include "volt/io/state.h"
#include "volt/precision/fp8_precision.h"
#include "volt/precision/precision.h"

namespace volt {
namespace {

constexpr const char* kTag = "[ModelParallelStrategy]";

DdpStrategyOptions ddp_options(const ModelParallelStrategyOptions& o) {
  VOLT_CHECK(o.tensor_parallel_size() >= 0, ConfigError, kTag,
             " tensor_parallel_size=", o.tensor_parallel_size(),
             " must be >= 0 (0: every process of a node).");
  VOLT_CHECK(o.num_heads() >= 0, ConfigError, kTag, " num_heads=", o.num_heads(),
             " must be >= 0 (0: unknown).");
  detail::check_timeout_s(o.timeout_s(), kTag);
  detail::check_bucket_cap_mb(o.bucket_cap_mb(), kTag);
  // The gradient buckets average over the replicas (setup_module builds them over that group);
  // buffers are each rank's own, the same on every rank of a group (no broadcast before each
  // step).
  return DdpStrategyOptions()
      .bucket_cap_mb(o.bucket_cap_mb())
      .find_unused_parameters(o.find_unused_parameters())
      .static_graph(o.static_graph())
      .timeout_s(o.timeout_s())
      .process_group_backend(o.process_group_backend())
      .broadcast_buffers(false);
}

// A per-parameter optimizer state with each tensor replaced by fn(tensor) where it has the
// parameter's shape (`from`); a copy, the optimizer's own left as it was.
std::unique_ptr<torch::optim::OptimizerParamState> mapped_state(
    const torch::optim::OptimizerParamState& state, c10::IntArrayRef from,
    const std::function<at::Tensor(const at::Tensor&)>& fn) {
  auto copy = state.clone();
  const bool known = detail::map_state_tensors(
      *copy, [&](const at::Tensor& t) { return t.sizes() == from ? fn(t) : t; });
  VOLT_ASSERT(known, kTag, " unknown optimizer state type (setup_optimizers admits it)");
  return copy;
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const ModelParallelStrategyOptions& o) {
  return os << "ModelParallelStrategyOptions(tensor_parallel_size=" << o.tensor_parallel_size()
            << ", "
            << TensorParallelOptions()
                   .plan(o.plan())
                   .injection_policy(o.injection_policy())
                   .partial_grads(o.partial_grads())
            << ", num_heads=" << o.num_heads() << ", bucket_cap_mb=" << o.bucket_cap_mb()
            << ", find_unused_parameters=" << (o.find_unused_parameters() ? "true" : "false")
            << ", static_graph=" << (o.static_graph() ? "true" : "false")
            << ", save_distributed_checkpoint="
            << (o.save_distributed_checkpoint() ? "true" : "false")
            << ", timeout_s=" << o.timeout_s()
            << ", process_group_backend=" << o.process_group_backend() << ")";
}

ModelParallelStrategy::ModelParallelStrategy(ModelParallelStrategyOptions options,
                                             std::shared_ptr<Accelerator> accelerator,
                                             std::shared_ptr<Precision> precision, int64_t devices,
                                             int64_t num_nodes,
                                             std::shared_ptr<CheckpointIO> checkpoint_io)
    : DdpStrategy(ddp_options(options), std::move(accelerator), std::move(precision), devices,
                  num_nodes, std::move(checkpoint_io)),
      options_(std::move(options)),
      devices_(devices) {
  VOLT_CHECK(!options_.plan().empty() || !options_.injection_policy().empty(), ConfigError, kTag,
             " neither a plan nor an injection_policy names a layer to split; give e.g. "
             "plan {\"fc1\": colwise, \"fc2\": rowwise} (module path -> style).");
}

ModelParallelStrategy::~ModelParallelStrategy() = default;

void ModelParallelStrategy::setup_environment() {
  DdpStrategy::setup_environment();
  if (tp_group_) return;  // the groups outlive an entry point, as the world's does
  const int64_t world = world_size();
  const int64_t tp = options_.tensor_parallel_size() == 0 ? std::min(devices_, world)
                                                          : options_.tensor_parallel_size();
  VOLT_CHECK(tp <= world && world % tp == 0, ConfigError, kTag, " tensor_parallel_size=", tp,
             " does not divide the ", world,
             " processes; use a divisor of the world size (the quotient is the data-parallel "
             "size), or 0 for the processes of one node.");
  // Consecutive ranks split the layers (their all-reduces run every layer), the same position
  // in every group averages gradients once per step.
  const detail::ReplicaMesh mesh =
      detail::make_replica_mesh(group_, tp, "tensor_parallel", "tensor_parallel_replicas");
  tp_size_ = mesh.inner;
  dp_size_ = mesh.replicas;
  dp_rank_ = mesh.replica;
  tp_group_ = mesh.inner_group;
  dp_group_ = mesh.replica_group;
  log_info("ModelParallelStrategy", std::to_string(dp_size_) + " data-parallel x " +
                                        std::to_string(tp_size_) + " tensor-parallel processes");
}

void ModelParallelStrategy::setup_module(Module& module) {
  VOLT_CHECK(dynamic_cast<const Fp8Precision*>(precision_.get()) == nullptr, ConfigError, kTag,
             " fp8 precision is not supported with tensor parallelism (its Linear kernels are "
             "not split); use bf16-mixed or 32-true.");
  VOLT_CHECK(engine_ == nullptr || module_ == &module, ConfigError, kTag,
             " a second module: the strategy splits one module per run; set up the others "
             "with another strategy.");
  if (engine_ != nullptr) return;
  Strategy::setup_module(module);
  broadcast_module_state(module);  // every rank splits the same weights
  engine_ =
      std::make_unique<TensorParallelEngine>(module, tp_group_,
                                             TensorParallelOptions()
                                                 .tp_size(tp_size_)
                                                 .plan(options_.plan())
                                                 .injection_policy(options_.injection_policy())
                                                 .num_heads(options_.num_heads())
                                                 .partial_grads(options_.partial_grads()));
  module_ = &module;
  whole_grads_checked_ = false;
  // The replicas of this rank's shards average their gradients during backward (DDP's buckets,
  // over the split parameters: the same shapes on every replica).
  if (dp_group_) build_reducer(module, dp_group_);
  // BatchNorm sees whole activations (a split layer's output has a share of the features, which
  // a BatchNorm over all of them refuses), the same batch on every rank of a tensor-parallel
  // group: the statistics are those of the replicas' batches.
  sync_batchnorm_over(module, sync_batchnorm() ? dp_group_ : nullptr);
  log_info("ModelParallelStrategy",
           "rank " + std::to_string(rank()) + ": " + std::to_string(engine_->layers().size()) +
               " layers split " + std::to_string(tp_size_) + " ways, holding " +
               std::to_string(engine_->parameter_bytes()) + " of " +
               std::to_string(engine_->full_parameter_bytes()) + " parameter bytes");
}

void ModelParallelStrategy::setup_optimizers(Module& module,
                                             std::vector<OptimizerConfig>& optimizers) {
  // Checkpoints gather and split each state tensor of the split weights: the optimizers whose
  // state types are known (torch::optim's and volt's fused ones, whose flat buffers are laid out
  // at their first step, after the split).
  for (const auto& config : optimizers) {
    auto probe = new_optimizer_param_state(*config.optimizer());
    VOLT_CHECK(detail::map_state_tensors(*probe, [](const at::Tensor& t) { return t; }),
               ConfigError, kTag,
               " this optimizer type is not supported with tensor parallelism (its state "
               "could not be split and joined in checkpoints); use torch::optim's SGD, Adam, "
               "AdamW, RMSprop or Adagrad, or volt's FusedSGD or FusedAdamW.");
  }
  DdpStrategy::setup_optimizers(module, optimizers);
}

void ModelParallelStrategy::teardown() {
  // After a normal end every rank gets the whole trained model (and a program's own forward
  // after fit runs unsplit); after a failed run the ranks are out of step: nothing collective.
  if (engine_ != nullptr && !run_failed()) engine_->restore();
  // The buckets were laid out for the shards (a next fit splits again and builds new ones).
  if (module_ != nullptr) drop_reducer(*module_);
  engine_.reset();
  module_ = nullptr;
  DdpStrategy::teardown();
}

std::shared_ptr<void> ModelParallelStrategy::training_forward_context(Module& module) {
  if (engine_ == nullptr) return nullptr;
  auto split = std::make_shared<TensorParallelEngine::Scope>(*engine_);
  std::shared_ptr<void> sync_bn = sync_batchnorm_scope(module);
  if (!sync_bn) return split;
  // Both while the context lives (each only includes the intercept key; their registries tell
  // the ops apart).
  return std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(
      std::move(split), std::move(sync_bn));
}

void ModelParallelStrategy::validation_step(Module& module, const Batch& batch, int64_t batch_idx) {
  auto scope = training_forward_context(module);
  DdpStrategy::validation_step(module, batch, batch_idx);
}

void ModelParallelStrategy::test_step(Module& module, const Batch& batch, int64_t batch_idx) {
  auto scope = training_forward_context(module);
  DdpStrategy::test_step(module, batch, batch_idx);
}

at::Tensor ModelParallelStrategy::predict_step(Module& module, const Batch& batch,
                                               int64_t batch_idx) {
  auto scope = training_forward_context(module);
  return DdpStrategy::predict_step(module, batch, batch_idx);
}

void ModelParallelStrategy::backward(const at::Tensor& loss, Module& module, bool sync_gradients) {
  // With replicas DDP's backward: the reducer over them arms its buckets (not when accumulating
  // without sync, as DDP's no_sync: the last micro-batch averages the sums).
  if (dp_group_) {
    DdpStrategy::backward(loss, module, sync_gradients);
  } else {
    Strategy::backward(loss, module, sync_gradients);
  }
}

void ModelParallelStrategy::backward_through(const at::Tensor& loss,
                                             const std::vector<Reached>& modules) {
  if (dp_group_) {
    DdpStrategy::backward_through(loss, modules);
  } else {
    Strategy::backward_through(loss, modules);
  }
}

void ModelParallelStrategy::trainable_parameters_changed(Module& module) {
  // The buckets hold the parameters that require a gradient (a callback froze or thawed some).
  if (dp_group_ && engine_ != nullptr) build_reducer(module, dp_group_);
  // A listed whole parameter thawed now gets its gradient summed from now on.
  if (engine_ != nullptr) engine_->track_partial_grads();
}

void ModelParallelStrategy::check_whole_grads() {
  if (whole_grads_checked_ || engine_ == nullptr || tp_size_ == 1) return;
  const auto differing = engine_->whole_grads_differing();
  if (!differing) return;  // a non-finite gradient (a step the scaler skips): a later step
  whole_grads_checked_ = true;
  std::string names;
  for (const auto& n : *differing) names += (names.empty() ? "'" : ", '") + n + "'";
  VOLT_CHECK(differing->empty(), ConfigError, kTag, " the gradients of the whole parameters ",
             names,
             " differ across the tensor-parallel group: they are used on split activations (a "
             "rank's heads or features), so each rank holds only its part of their gradient and "
             "their copies would drift apart. List them in partial_grads (their gradients are "
             "then summed over the group), or split the layers that use them.");
}

bool ModelParallelStrategy::optimizer_step(torch::optim::Optimizer& optimizer,
                                           c10::optional<double> clip_value,
                                           ClipAlgorithm algorithm, const ClipCall& clip) {
  // Strategy::optimizer_step's sequence, with the ranks agreeing on inf/NaN gradients: each
  // checked only its own shards, and a rank that skipped a step its group took would hold a
  // shard of another model.
  // A listed parameter thawed since the epoch began (or in a Fabric loop) gets its hook now.
  if (engine_ != nullptr) engine_->track_partial_grads();
  check_whole_grads();
  detail::unscale_agreeing_on_found_inf(*precision_, group(), optimizer);
  clip_for_step(optimizer, clip_value, algorithm, clip);
  return precision_->optimizer_step(optimizer);
}

at::Tensor ModelParallelStrategy::clip_gradients(torch::optim::Optimizer& optimizer, double value,
                                                 ClipAlgorithm algorithm) {
  if (algorithm != ClipAlgorithm::kNorm || engine_ == nullptr) {
    return Strategy::clip_gradients(optimizer, value, algorithm);  // elementwise: local
  }
  engine_->track_partial_grads();
  check_whole_grads();  // before a norm that would count the parts
  // The norm over the whole model: each split weight's shards once, the whole ones once (the
  // replicas hold the same, averaged, gradients).
  std::vector<at::Tensor> params;
  for (const auto& g : optimizer.param_groups()) {
    for (const auto& p : g.params()) params.push_back(p);
  }
  return at::scalar_tensor(engine_->clip_grad_norm_(params, value), at::kDouble);
}

bool ModelParallelStrategy::shards_checkpoints() const {
  return options_.save_distributed_checkpoint() && engine_ != nullptr && engine_->split();
}

std::string ModelParallelStrategy::split_difference(const Module& module,
                                                    torch::serialize::InputArchive& record) const {
  torch::serialize::InputArchive layouts = detail::read_sub(record, "layouts", "the record");
  for (const auto& item : module.named_parameters(true)) {
    const auto mine = engine_->split_layout(item.value());
    at::Tensor saved;
    const bool recorded = layouts.try_read(item.key(), saved);
    if (recorded != (mine.dim >= 0) ||
        (recorded && (saved[0].item<int64_t>() != mine.dim ||
                      (saved[1].item<int64_t>() != 0) != mine.packed))) {
      return item.key();
    }
  }
  return "";
}

void ModelParallelStrategy::save_model_state(const Module& module,
                                             torch::serialize::OutputArchive& ar) const {
  if (engine_ == nullptr || !engine_->split()) {
    Strategy::save_model_state(module, ar);
    return;
  }
  if (shards_checkpoints()) {
    // This rank's shards as they are, and how each is split (to join them without the group).
    Strategy::save_model_state(module, ar);
    torch::serialize::OutputArchive record, layouts;
    record.write("rank", c10::IValue(tp_group_->rank()));
    record.write("size", c10::IValue(tp_size_));
    for (const auto& item : module.named_parameters(true)) {
      const auto layout = engine_->split_layout(item.value());
      if (layout.dim < 0) continue;
      layouts.write(item.key(), torch::tensor({layout.dim, int64_t{layout.packed}}, torch::kLong));
    }
    record.write("layouts", layouts);
    ar.write(detail::kTpRecord, record);
    return;
  }
  // The whole weights (in the single-process format); the archive keeps what it is given until
  // it is written, and the joined tensors are new ones.
  for (const auto& item : module.named_parameters(true)) {
    ar.write(item.key(), engine_->gather_whole(item.value(), item.value().detach()));
  }
  for (const auto& item : module.named_buffers(true)) {
    ar.write(item.key(), item.value(), /*is_buffer=*/true);
  }
}

void ModelParallelStrategy::load_model_state(Module& module, torch::serialize::InputArchive& ar,
                                             bool strict) const {
  torch::serialize::InputArchive record;
  if (ar.try_read(detail::kTpRecord, record)) {
    // One rank's shards (load_checkpoint reads this rank's own from a folder of its size).
    const int64_t rank = detail::read_value(record, "rank", "the shard's record").toInt();
    const int64_t size = detail::read_value(record, "size", "the shard's record").toInt();
    VOLT_CHECK(
        engine_ != nullptr && engine_->split() && size == tp_size_ && rank == tp_group_->rank(),
        CheckpointError, kTag, " these weights are tensor-parallel rank ", rank, " of ", size,
        "'s shards, but this is rank ", engine_ != nullptr ? tp_group_->rank() : int64_t{0}, " of ",
        engine_ != nullptr && engine_->split() ? tp_size_ : int64_t{1},
        "; load the folder with the strategy's load_checkpoint (it consolidates the "
        "shards for another layout).");
    const std::string differs = split_difference(module, record);
    VOLT_CHECK(differs.empty(), CheckpointError, kTag, " '", differs,
               "' is split differently in the checkpoint than by this plan; load the folder with "
               "the strategy's load_checkpoint (it consolidates the shards then).");
    // The shapes being the shards'; the record is no weight.
    load_module_state(module, ar, strict, {detail::kTpRecord});
    return;
  }
  if (engine_ == nullptr || !engine_->split()) {
    Strategy::load_model_state(module, ar, strict);
    return;
  }
  // Whole for the strict load (every rank reads the same file), then split again: the same
  // TensorImpls, so the optimizer's state stays attached.
  engine_->restore();
  try {
    Strategy::load_model_state(module, ar, strict);
  } catch (...) {
    // A checkpoint that does not match leaves the model split as it was (its buckets and
    // optimizer state are the shards'), for a program that catches the error and goes on.
    engine_->reshard();
    throw;
  }
  engine_->reshard();
}

void ModelParallelStrategy::save_optimizer_state(const torch::optim::Optimizer& optimizer,
                                                 const Module& module,
                                                 torch::serialize::OutputArchive& ar) const {
  if (engine_ == nullptr || !engine_->split()) {
    Strategy::save_optimizer_state(optimizer, module, ar);
    return;
  }
  if (shards_checkpoints()) {
    // This rank's state as it is: the split weights' per-element state has their shards' shapes.
    Strategy::save_optimizer_state(optimizer, module, ar);
    ar.write(detail::kTpOptimizerRank, c10::IValue(tp_group_->rank()));
    ar.write(detail::kTpOptimizerSize, c10::IValue(tp_size_));
    return;
  }
  // The split weights' state joined whole (collective, in the optimizer's parameter order on
  // every rank), swapped in while the state is written, then the shards' put back.
  auto& state = const_cast<torch::optim::Optimizer&>(optimizer).state();
  std::vector<
      std::pair<detail::OptimizerStateKey, std::unique_ptr<torch::optim::OptimizerParamState>>>
      saved;
  // Before the gathers: one that fails (a peer gone) still leaves every state as it was.
  struct PutBack {
    decltype(state)& s;
    decltype(saved)& kept;
    ~PutBack() {
      for (auto& kv : kept) s[kv.first] = std::move(kv.second);
    }
  } put_back{state, saved};
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (!engine_->is_split(p)) continue;
      auto it = state.find(detail::state_key_for<detail::OptimizerStateKey>(p));
      // Every rank steps the same parameters, so each has state for the same ones.
      if (it == state.end()) continue;
      auto whole = mapped_state(*it->second, p.sizes(),
                                [&](const at::Tensor& t) { return engine_->gather_whole(p, t); });
      saved.emplace_back(it->first, std::move(it->second));
      it->second = std::move(whole);
    }
  }
  Strategy::save_optimizer_state(optimizer, module, ar);
}

void ModelParallelStrategy::load_optimizer_state(torch::optim::Optimizer& optimizer,
                                                 const Module& module,
                                                 torch::serialize::InputArchive& ar) const {
  c10::IValue rank;
  if (ar.try_read(detail::kTpOptimizerRank, rank)) {
    // This rank's own state from a folder of its size (load_checkpoint consolidates others).
    const int64_t size =
        detail::read_value(ar, detail::kTpOptimizerSize, "the optimizer shard").toInt();
    VOLT_CHECK(engine_ != nullptr && engine_->split() && size == tp_size_ &&
                   rank.toInt() == tp_group_->rank(),
               CheckpointError, kTag, " this optimizer state is tensor-parallel rank ",
               rank.toInt(), " of ", size,
               "'s shard, not this rank's; load the folder with the strategy's load_checkpoint "
               "(it consolidates the shards for another layout).");
    Strategy::load_optimizer_state(optimizer, module, ar);
    return;
  }
  Strategy::load_optimizer_state(optimizer, module, ar);
  if (engine_ == nullptr || !engine_->split()) return;
  // The checkpoint's state is whole: each rank keeps its shard's part.
  auto& state = optimizer.state();
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (!engine_->is_split(p)) continue;
      auto it = state.find(detail::state_key_for<detail::OptimizerStateKey>(p));
      if (it == state.end()) continue;
      it->second = mapped_state(*it->second, engine_->whole_sizes(p),
                                [&](const at::Tensor& t) { return engine_->shard_of(p, t); });
    }
  }
}

namespace {
// Beside the accumulated gradients: the layout (replicas, tensor-parallel ranks) whose ranks'
// partial sums the "rank<r>." entries hold.
constexpr const char* kLayoutKey = "__model_parallel_layout__";
}  // namespace

void ModelParallelStrategy::save_accumulated_gradients(const Module& module,
                                                       torch::serialize::OutputArchive& ar) const {
  if (engine_ == nullptr || !engine_->split()) {
    DdpStrategy::save_accumulated_gradients(module, ar);
    return;
  }
  // Each rank's partial sums made whole over its group, under "rank<r>.<name>" (a resume at the
  // same layout), and under the plain name the mean over the replicas: what one process on the
  // global batch would have accumulated.
  for (const auto& p : module.named_parameters(true)) {
    if (!p.value().requires_grad()) continue;
    const at::Tensor part =
        p.value().grad().defined() ? p.value().grad() : torch::zeros_like(p.value());
    const at::Tensor whole = engine_->gather_whole(p.value(), part.contiguous());
    const auto all = group().all_gather(whole.contiguous());
    for (size_t r = 0; r < all.size(); ++r) ar.write(detail::rank_key(r, p.key()), all[r]);
    std::vector<at::Tensor> replicas;
    for (int64_t d = 0; d < dp_size_; ++d) replicas.push_back(all[d * tp_size_]);
    ar.write(p.key(), replicas.size() == 1 ? replicas[0] : torch::stack(replicas).mean(0));
  }
  detail::write_rank_layout(ar, kLayoutKey, dp_size_, tp_size_);
}

void ModelParallelStrategy::load_accumulated_gradients(Module& module,
                                                       torch::serialize::InputArchive& ar) {
  // A rank's own "rank<r>." sums only under the layout (replicas x tensor-parallel ranks) that
  // wrote them: under another, rank r's entry is another replica's (2x2 read at 1x4 gave half
  // the ranks replica 1's sums) or misses the other replicas' (2x2 at 1x2), so every rank reads
  // the mean over the replicas, as one process on the global batch would hold.
  const auto layout = detail::read_rank_layout(ar, kLayoutKey, dp_size_, tp_size_);
  if (layout == detail::RankLayout::kNotRecorded && (engine_ == nullptr || !engine_->split())) {
    DdpStrategy::load_accumulated_gradients(module, ar);  // plain data parallel wrote it
    return;
  }
  const bool same_layout = layout == detail::RankLayout::kSame;
  for (auto& p : module.named_parameters(true)) {
    at::Tensor g;
    if ((same_layout && ar.try_read(detail::rank_key(rank(), p.key()), g)) ||
        ar.try_read(p.key(), g)) {
      g = engine_ != nullptr ? engine_->shard_of(p.value(), g) : g;
      p.value().mutable_grad() = g.to(p.value().device());
    }
  }
}

// ------------------------------------------------------------------ checkpoint folders

void ModelParallelStrategy::save_checkpoint(torch::serialize::OutputArchive& archive,
                                            const std::string& path) {
  if (!shards_checkpoints()) {
    DdpStrategy::save_checkpoint(archive, path);  // whole, rank 0 writes
    return;
  }
  // The first replica's ranks write their shards (the other replicas hold the same); every
  // rank's own generator states and partial gradient sums are in each (saved by rank).
  auto meta = detail::c_stream<std::ostringstream>();
  meta << "format 1\ntensor_parallel_size " << tp_size_ << "\nworld_size " << world_size() << "\n";
  detail::FolderSave save;
  save.path = path;
  save.shard = dp_rank_ == 0 ? detail::tp_shard_name(tp_group_->rank(), tp_size_) : "";
  for (int64_t t = 0; t < tp_size_; ++t) save.shards.push_back(detail::tp_shard_name(t, tp_size_));
  save.meta_file = detail::kTpMetaFile;
  save.meta = meta.str();
  save.tag = kTag;
  detail::save_checkpoint_folder(*this, archive, save);
}

torch::serialize::InputArchive ModelParallelStrategy::load_checkpoint(const std::string& path) {
  if (is_model_parallel_checkpoint(path) && engine_ != nullptr && engine_->split() &&
      module_ != nullptr && detail::tp_folder_size(path) == tp_size_) {
    // This tensor-parallel rank's file: its shards as they are, no rank joins the model. The
    // ranks agree on it: a plan that splits differently (e.g. the weights of a layer another
    // plan kept whole) makes every rank read the folder consolidated.
    // A shard this rank cannot read (missing, damaged) sends every rank to the consolidation,
    // which names it, instead of leaving the others waiting in the agreement.
    torch::serialize::InputArchive shard;
    bool fits = false;
    try {
      shard = checkpoint_io_->load(path + "/" + detail::tp_shard_name(tp_group_->rank(), tp_size_));
      torch::serialize::InputArchive dict, record;
      fits = shard.try_read("state_dict", dict) && dict.try_read(detail::kTpRecord, record) &&
             split_difference(*module_, record).empty();
    } catch (const std::exception&) {
      fits = false;
    }
    if (reduce_boolean_decision(fits, /*all=*/true)) {
      if (is_global_zero()) {
        log_info("ModelParallelStrategy", "each rank reads its own shards of '" + path +
                                              "' (tensor-parallel size " +
                                              std::to_string(tp_size_) + ")");
      }
      return shard;
    }
    if (is_global_zero()) {
      log_info("ModelParallelStrategy", "'" + path +
                                            "' does not fit this layout's shards (another plan, "
                                            "or a shard unreadable): reading it consolidated.");
    }
  }
  return DdpStrategy::load_checkpoint(path);  // a file, or a folder consolidated
}

}  // namespace volt
