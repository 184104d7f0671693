#include "volt/strategies/strategy.h"

#include <sys/stat.h>

#include <torch/torch.h>

#include "core/detail/remove_tree.h"
#include "strategies/detail/checkpoint_folder.h"
#include "strategies/detail/read_checkpoint.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/io/state.h"
#include "volt/strategies/deepspeed.h"
#include "volt/strategies/model_parallel.h"

namespace volt {

Strategy::Strategy(std::shared_ptr<Accelerator> accelerator, std::shared_ptr<Precision> precision,
                   std::shared_ptr<CheckpointIO> checkpoint_io)
    : accelerator_(std::move(accelerator)),
      precision_(std::move(precision)),
      checkpoint_io_(checkpoint_io ? std::move(checkpoint_io)
                                   : std::make_shared<TorchCheckpointIO>()) {
  VOLT_CHECK(accelerator_ != nullptr, ConfigError, "[Strategy] accelerator is null.");
  VOLT_CHECK(precision_ != nullptr, ConfigError, "[Strategy] precision is null.");
}

void Strategy::setup_module(Module& module) {
  accelerator_->setup_device(root_device());
  module.to(root_device());
  precision_->setup(root_device());
  precision_->convert_module(module);
  if (sync_batchnorm_ && world_size() == 1) {
    log_info("Trainer",
             "sync_batchnorm changes nothing in one process (BatchNorm already sees the whole "
             "batch).");
  }
}

void Strategy::teardown() {
  precision_->teardown();
}

void Strategy::set_checkpoint_io(std::shared_ptr<CheckpointIO> checkpoint_io) {
  VOLT_CHECK(checkpoint_io != nullptr, ConfigError,
             "[Strategy] checkpoint_io is null; pass a CheckpointIO (e.g. TorchCheckpointIO).");
  checkpoint_io_ = std::move(checkpoint_io);
}

Batch Strategy::batch_to_device(const Batch& batch) const {
  const auto dev = root_device();
  auto here = [&](const at::Tensor& t) { return !t.defined() || t.device() == dev; };
  // (A combined loader's batch has its parts' tensors in `extra` and no input of its own.)
  bool all_here = here(batch.input) && here(batch.target);
  for (const auto& kv : batch.extra) all_here = all_here && here(kv.second);
  if (all_here) return batch;  // CPU training: no copy at all
  return batch.to(dev, /*non_blocking=*/true);
}

at::Tensor Strategy::training_step(Module& module, const Batch& batch, int64_t batch_idx) {
  auto context = training_forward_context(module);
  if (step_call_) return step_call_(module, batch, batch_idx);
  return module_training_step(module, batch, batch_idx);
}

at::Tensor Strategy::module_training_step(Module& module, const Batch& batch, int64_t batch_idx) {
  auto ctx = precision_->forward_context();
  return module.training_step(precision_->convert_input(batch), batch_idx);
}

void Strategy::validation_step(Module& module, const Batch& batch, int64_t batch_idx) {
  auto ctx = precision_->forward_context();
  module.validation_step(precision_->convert_input(batch), batch_idx);
}

void Strategy::test_step(Module& module, const Batch& batch, int64_t batch_idx) {
  auto ctx = precision_->forward_context();
  module.test_step(precision_->convert_input(batch), batch_idx);
}

at::Tensor Strategy::predict_step(Module& module, const Batch& batch, int64_t batch_idx) {
  auto ctx = precision_->forward_context();
  return module.predict_step(precision_->convert_input(batch), batch_idx);
}

void Strategy::backward(const at::Tensor& loss, Module& module, bool sync_gradients) {
  precision_->backward(loss, &module);
}

void Strategy::backward_through(const at::Tensor& loss, const std::vector<Reached>& modules) {
  if (modules.size() == 1) {
    backward(loss, *modules.front().module, modules.front().sync_gradients);
  } else {
    precision_->backward(loss, modules.empty() ? nullptr : modules.front().module);
  }
}

bool Strategy::optimizer_step(torch::optim::Optimizer& optimizer, c10::optional<double> clip_value,
                              ClipAlgorithm algorithm, const ClipCall& clip) {
  precision_->unscale_gradients(optimizer);
  clip_for_step(optimizer, clip_value, algorithm, clip);
  return precision_->optimizer_step(optimizer);
}

void Strategy::clip_for_step(torch::optim::Optimizer& optimizer, c10::optional<double> value,
                             ClipAlgorithm algorithm, const ClipCall& clip) {
  if (clip) {
    clip(value, algorithm);
  } else if (value && *value > 0) {
    clip_gradients(optimizer, *value, algorithm);
  }
}

at::Tensor Strategy::clip_gradients(torch::optim::Optimizer& optimizer, double value,
                                    ClipAlgorithm algorithm) {
  return precision_->clip_gradients(optimizer, value, algorithm);
}

void Strategy::zero_grad(torch::optim::Optimizer& optimizer) {
  volt::zero_grad(optimizer);
}

void Strategy::save_model_state(const Module& module, torch::serialize::OutputArchive& ar) const {
  save_module_state(module, ar);
}

void Strategy::load_model_state(Module& module, torch::serialize::InputArchive& ar,
                                bool strict) const {
  load_module_state(module, ar, strict);
}

void Strategy::save_optimizer_state(const torch::optim::Optimizer& optimizer, const Module& module,
                                    torch::serialize::OutputArchive& ar) const {
  volt::save_optimizer_state(optimizer, module, ar);
}

void Strategy::load_optimizer_state(torch::optim::Optimizer& optimizer, const Module& module,
                                    torch::serialize::InputArchive& ar) const {
  volt::load_optimizer_state(optimizer, module, ar);
}

void Strategy::save_accumulated_gradients(const Module& module,
                                          torch::serialize::OutputArchive& ar) const {
  for (const auto& p : module.named_parameters(true)) {
    if (p.value().grad().defined()) ar.write(p.key(), p.value().grad());
  }
}

void Strategy::load_accumulated_gradients(Module& module, torch::serialize::InputArchive& ar) {
  for (auto& p : module.named_parameters(true)) {
    at::Tensor g;
    if (ar.try_read(p.key(), g)) p.value().mutable_grad() = g.to(p.value().device());
  }
}

std::map<std::string, at::Tensor> Strategy::rng_states() const {
  std::map<std::string, at::Tensor> states = accelerator_->rng_states();
  states["torch_cpu"] = at::detail::getDefaultCPUGenerator().get_state();
  return states;
}

void Strategy::set_rng_states(const std::map<std::string, at::Tensor>& states) {
  auto it = states.find("torch_cpu");
  VOLT_CHECK(it != states.end(), CheckpointError,
             "[Strategy] the checkpoint has no torch_cpu generator state; it was not written by "
             "volt's Trainer.");
  // Generator is a refcounted handle; the default-generator accessor returns a const reference.
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  cpu.set_state(it->second);
  accelerator_->set_rng_states(states);
}

void Strategy::save_checkpoint(torch::serialize::OutputArchive& archive, const std::string& path) {
  if (is_global_zero()) checkpoint_io_->save(archive, path);
}

namespace detail {
torch::serialize::InputArchive read_checkpoint(const std::string& path, CheckpointIO& io,
                                               bool weights_only) {
  // A folder of shards (ZeRO's: every rank's; model_parallel's: every tensor-parallel rank's)
  // loads anywhere once consolidated.
  if (is_zero_checkpoint(path)) {
    return load_consolidated_zero_checkpoint(
        path, weights_only ? ZeroContents::kWeights : ZeroContents::kEverything);
  }
  if (is_model_parallel_checkpoint(path)) {
    return read_model_parallel_checkpoint(path, weights_only);
  }
  VOLT_CHECK(!is_directory(path), CheckpointError, "[Checkpoint] '", path,
             "' is a folder without its metadata file: an incomplete checkpoint folder (a save "
             "was interrupted); load the previous checkpoint.");
  return io.load(path);
}
}  // namespace detail

torch::serialize::InputArchive Strategy::load_checkpoint(const std::string& path) {
  // validate / test / predict read no optimizer state.
  return detail::read_checkpoint(path, *checkpoint_io_, /*weights_only=*/!loop_.fitting);
}

void Strategy::remove_checkpoint(const std::string& path) {
  if (!is_global_zero()) return;
  // A folder of shards (a ZeRO or model_parallel checkpoint) goes after every save issued before
  // it, as CheckpointIO::remove orders its removals; a failed save surfaces from that flush as
  // it would from the next save.
  const bool folder = detail::is_directory(path);
  if (folder) checkpoint_io_->flush();
  try {
    if (!folder) {
      checkpoint_io_->remove(path);
      return;
    }
    // Any other folder is not volt's to delete.
    VOLT_CHECK(detail::is_checkpoint_folder(path), CheckpointError, "[Checkpoint] '", path,
               "' is a folder that holds no volt checkpoint; it is not removed.");
    VOLT_CHECK(detail::remove_tree(path), CheckpointError, "[Checkpoint] removing '", path,
               "' left part of it behind; check the permissions of the files in it.");
  } catch (const Error& e) {
    // Rank 0 alone removes: throwing here would stop it while the other ranks go on into the
    // next collective. An old checkpoint that stays costs disk space, not the run.
    log_warning("Checkpoint", std::string(e.what()) + " The run goes on; delete it by hand.");
  }
}

void Strategy::link_checkpoint(const std::string& target, const std::string& path) {
  if (!is_global_zero()) return;
  // A folder of shards at `path` (a sharded last.ckpt written before) goes first, after the
  // saves before it (a failed one is thrown here, as from the next save: not a warning); a link
  // to a folder is replaced as a file is.
  struct stat st;
  const bool folder = ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  if (folder) checkpoint_io_->flush();
  try {
    if (folder) {
      VOLT_CHECK(detail::is_checkpoint_folder(path), CheckpointError, "[Checkpoint] '", path,
                 "' is a folder that holds no volt checkpoint; it is not replaced by a link. "
                 "Move it away, or give the checkpoints another folder.");
      VOLT_CHECK(detail::remove_tree(path), CheckpointError, "[Checkpoint] removing '", path,
                 "' left part of it behind; check the permissions of the files in it.");
    }
    checkpoint_io_->link(target, path);
  } catch (const Error& e) {
    // As remove_checkpoint: rank 0 alone links, and throwing would stop it alone.
    log_warning("Checkpoint", std::string(e.what()) + " The run goes on; '" + path +
                                  "' does not name the newest checkpoint.");
  }
}

void Strategy::flush_checkpoints() {
  checkpoint_io_->flush();
}

}  // namespace volt
