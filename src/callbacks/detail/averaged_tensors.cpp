#include "callbacks/detail/averaged_tensors.h"

#include <torch/utils.h>

#include <unordered_set>

#include "distributed/detail/split_parameters.h"
#include "volt/core/check.h"
#include "volt/core/errors.h"
#include "volt/core/module.h"
#include "volt/core/run_context.h"
#include "volt/distributed/tensor_parallel.h"
#include "volt/nn/pipeline.h"

namespace volt {
namespace detail {

void AveragedTensors::bind(Module& module, bool buffers, c10::optional<c10::Device> device) {
  names_.clear();
  aliases_.clear();
  module_.clear();
  average_.clear();
  count_ = 0;
  device_ = device;
  pipelines_.clear();
  for (const auto& m : module.modules(/*include_self=*/false)) {
    auto pipe = std::dynamic_pointer_cast<const PipelineImpl>(m);
    if (pipe && pipe->distributed()) pipelines_.push_back(std::move(pipe));
  }
  // A tensor listed under two names (a layer registered twice, a tied weight) is followed once:
  // swapping it twice would leave the average in the module (torch's AveragedModel walks
  // parameters(), which lists it once).
  std::unordered_set<const c10::TensorImpl*> seen;
  const auto follow = [&](const std::string& name, const at::Tensor& t) {
    if (!seen.insert(t.unsafeGetTensorImpl()).second) {
      aliases_.push_back(name);
      return;
    }
    names_.push_back(name);
    module_.push_back(t);
  };
  for (const auto& p : module.named_parameters(true)) follow(p.key(), p.value());
  if (buffers) {
    for (const auto& b : module.named_buffers(true)) follow(b.key(), b.value());
  }
}

void AveragedTensors::update(const Fn& fn) {
  torch::NoGradGuard no_grad;
  if (count_ == 0) {
    average_.clear();
    for (const auto& t : module_) {
      average_.push_back(
          t.detach().to(device_.value_or(t.device()), /*non_blocking=*/false, /*copy=*/true));
    }
  } else {
    for (size_t i = 0; i < module_.size(); ++i) {
      at::Tensor& avg = average_[i];
      const at::Tensor current = module_[i].detach().to(avg.device());
      if (!at::isFloatingType(avg.scalar_type())) {
        avg.copy_(current);  // counts (BatchNorm's num_batches_tracked) follow the module
      } else if (fn) {
        avg.copy_(fn(avg, current, count_));
      } else {
        // torch.optim.swa_utils' default: averaged + (current - averaged) / (n + 1).
        avg.copy_(avg + (current - avg) / static_cast<double>(count_ + 1));
      }
    }
  }
  ++count_;
}

void AveragedTensors::copy_to_module() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < average_.size(); ++i) {
    module_[i].copy_(average_[i].to(module_[i].device()));
  }
}

void refuse_sharded_weights(const RunContext& run, const char* tag) {
  VOLT_CHECK(run.strategy_name() != "deepspeed", ConfigError, tag,
             " does not work with the deepspeed strategy: ZeRO shards the weights and keeps "
             "its own fp32 masters, so an average of the module's tensors would be incomplete "
             "or overwritten (Lightning refuses it too); use ddp or one process.");
}

void AveragedTensors::swap() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < average_.size(); ++i) {
    const at::Tensor held = module_[i].detach().clone();
    module_[i].copy_(average_[i].to(module_[i].device()));
    average_[i].copy_(held.to(average_[i].device()));
  }
}

void AveragedTensors::save(torch::serialize::OutputArchive& archive) const {
  if (average_.empty()) return;  // the same on every rank: they count the same updates
  std::vector<at::Tensor> whole = average_;
  // Gathered on the pipeline's first rank alone, where the strategy gathers the weights (the
  // writer is global rank 0): no other rank allocates another stage's average.
  for (const auto& pipe : pipelines_) {
    whole = pipe->gather_beside(module_, std::move(whole), /*dst=*/0);
  }
  // A tensor-parallel shard's average joined whole (collective over its group: every rank
  // saves the same tensors in the same order), as the strategy saves the weights.
  for (size_t i = 0; i < whole.size(); ++i) {
    if (const TensorParallelEngine* e = engine_splitting(module_[i])) {
      whole[i] = e->gather_whole(module_[i], whole[i].to(module_[i].device()));
    }
  }
  for (size_t i = 0; i < whole.size(); ++i) archive.write(names_[i], whole[i]);
}

std::map<std::string, at::Tensor> AveragedTensors::read(torch::serialize::InputArchive& archive) {
  std::map<std::string, at::Tensor> out;
  for (const auto& key : archive.keys()) {
    at::Tensor t;
    archive.read(key, t);
    out[key] = t;
  }
  return out;
}

void AveragedTensors::adopt(const std::map<std::string, at::Tensor>& saved, int64_t count,
                            const char* tag) {
  count_ = count;
  average_.clear();
  if (count == 0) return;
  for (size_t i = 0; i < names_.size(); ++i) {
    auto it = saved.find(names_[i]);
    VOLT_CHECK(it != saved.end(), CheckpointError, tag, " the checkpoint's average has no '",
               names_[i], "'; resume with the module it was saved from.");
    const TensorParallelEngine* split = engine_splitting(module_[i]);
    std::vector<int64_t> shape = split ? split->whole_sizes(module_[i]) : module_[i].sizes().vec();
    for (const auto& pipe : pipelines_) {
      auto whole = pipe->whole_shape(module_[i]);
      if (c10::IntArrayRef(whole) != module_[i].sizes()) shape = std::move(whole);
    }
    VOLT_CHECK(it->second.sizes() == shape, CheckpointError, tag, " the checkpoint's average of '",
               names_[i], "' has shape ", it->second.sizes(), " but the module's has ",
               c10::IntArrayRef(shape), "; resume with the module it was saved from.");
    const c10::Device device = device_.value_or(module_[i].device());
    if (split != nullptr) {  // saved whole: this rank's shard of it
      average_.push_back(
          split->shard_of(module_[i], it->second).to(device, module_[i].scalar_type()));
      continue;
    }
    // Another stage's freed weight: its average lives on that stage's rank.
    average_.push_back(module_[i].sizes() != it->second.sizes()
                           ? at::empty(module_[i].sizes(), module_[i].options().device(device))
                           : it->second.to(device, module_[i].scalar_type()));
  }
  // Checkpoints from before session 98 also hold a shared tensor's further names.
  size_t aliased = 0;
  for (const auto& a : aliases_) aliased += saved.count(a);
  VOLT_CHECK(saved.size() - aliased == names_.size(), CheckpointError, tag,
             " the checkpoint's average holds ", saved.size() - aliased,
             " tensors but the module has ", names_.size(),
             "; resume with the module it was saved from.");
}

}  // namespace detail
}  // namespace volt
