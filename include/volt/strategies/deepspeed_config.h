#pragma once
/// DeepSpeedConfig: the DeepSpeed JSON configuration (a ds_config file or inline JSON), checked
/// and typed. Keys volt acts on are fields; DeepSpeed keys volt does not act on are listed in
/// `ignored`; any other key is a ConfigError naming the closest valid one.

#include <c10/util/Optional.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace volt {

class LRScheduler;

struct DeepSpeedConfig {
  /// Where it came from (a file path or "inline JSON"), for messages.
  std::string origin;
  /// Global batch = micro batch x accumulation x world size; "auto" or absent: unset.
  c10::optional<int64_t> train_batch_size;
  c10::optional<int64_t> train_micro_batch_size_per_gpu;
  c10::optional<int64_t> gradient_accumulation_steps;
  /// bf16.enabled, fp16.enabled.
  bool bf16 = false;
  bool fp16 = false;
  /// fp16's loss-scaling keys (absent: nullopt; DeepSpeed's defaults apply when fp16 is on).
  c10::optional<double> loss_scale;
  c10::optional<int64_t> initial_scale_power;
  c10::optional<int64_t> loss_scale_window;
  c10::optional<int64_t> hysteresis;
  c10::optional<bool> consecutive_hysteresis;
  c10::optional<double> min_loss_scale;
  /// Gradient-norm clipping; absent or 0: none.
  c10::optional<double> gradient_clipping;
  c10::optional<bool> zero_allow_untested_optimizer;
  /// zero_optimization: present at all, and its keys.
  bool zero = false;
  int64_t stage = 0;
  /// offload_optimizer.device / offload_param.device: "none", "cpu" or "nvme".
  std::string offload_optimizer_device = "none";
  std::string offload_param_device = "none";
  std::string nvme_path;
  bool pin_memory = false;
  c10::optional<int64_t> reduce_bucket_size;
  c10::optional<int64_t> allgather_bucket_size;
  c10::optional<bool> overlap_comm;
  c10::optional<bool> contiguous_gradients;
  c10::optional<int64_t> stage3_prefetch_bucket_size;
  c10::optional<int64_t> stage3_param_persistence_threshold;
  c10::optional<int64_t> stage3_max_live_parameters;
  /// zero_optimization.ignore_unused_parameters (DeepSpeed's default: true).
  c10::optional<bool> ignore_unused_parameters;
  /// zero_optimization.sub_group_size (NVMe offload: elements stepped together).
  c10::optional<int64_t> sub_group_size;
  /// aio.block_size, aio.queue_depth (NVMe offload's asynchronous I/O; the section's other keys
  /// are ignored).
  c10::optional<int64_t> aio_block_size;
  c10::optional<int64_t> aio_queue_depth;
  /// activation_checkpointing.cpu_checkpointing (the section's other keys: see the parser).
  bool cpu_checkpointing = false;
  /// optimizer.type ("" = none) and optimizer.params (numbers; "betas" holds two).
  std::string optimizer_type;
  std::map<std::string, std::vector<double>> optimizer_params;
  /// scheduler.type ("" = none) and scheduler.params (numbers; warmup_type apart).
  std::string scheduler_type;
  std::map<std::string, double> scheduler_params;
  std::string warmup_type = "log";
  // DeepSpeed inference: tensor_parallel.tp_size (or mp_size), volt's tensor_parallel.plan and
  // num_heads, dtype ("float32" | "bfloat16", "" when unset), injection_policy,
  // replace_with_kernel_inject, enable_cuda_graph, replace_method ("" when unset).
  c10::optional<int64_t> tp_size;
  c10::optional<int64_t> tp_num_heads;
  std::vector<std::pair<std::string, std::string>> tp_plan;
  std::vector<std::pair<std::string, std::vector<std::string>>> injection_policy;
  std::string dtype;
  c10::optional<bool> replace_with_kernel_inject;
  c10::optional<bool> enable_cuda_graph;
  std::string replace_method;
  /// DeepSpeed keys present that volt does not act on (dotted paths), listed once as ignored.
  std::vector<std::string> ignored;
};

/// Parses DeepSpeed JSON text. `origin` names it in errors. Throws ConfigError for malformed
/// JSON, a value of the wrong type, an unknown key (with the closest valid one) or an unknown
/// optimizer / scheduler type.
DeepSpeedConfig parse_deepspeed_config(const std::string& text, const std::string& origin);

/// `config` is inline JSON (starts with '{') or the path of a JSON file.
DeepSpeedConfig load_deepspeed_config(const std::string& config);

/// The batch sizes a job runs with, DeepSpeed's arithmetic: given any two of global batch,
/// micro batch and accumulation (and the world size) the third follows; all three must satisfy
/// train_batch_size = micro x accumulation x world_size. `trainer_accumulation` is the
/// Trainer's accumulate_grad_batches, which the JSON must not contradict.
struct DeepSpeedBatch {
  int64_t train_batch_size = 0;
  int64_t micro_batch_size = 0;
  int64_t accumulation = 1;
};
c10::optional<DeepSpeedBatch> resolve_deepspeed_batch(const DeepSpeedConfig& config,
                                                      int64_t world_size,
                                                      int64_t trainer_accumulation);

/// The optimizer the JSON names, over `params` ("Adam"/"AdamW" are DeepSpeed's Adam: AdamW
/// unless adam_w_mode is false, run by volt's FusedAdamW; "SGD"); nullptr when none is named.
std::shared_ptr<torch::optim::Optimizer> make_deepspeed_optimizer(
    const DeepSpeedConfig& config, const std::vector<at::Tensor>& params);

/// The scheduler the JSON names for `optimizer` (WarmupLR, WarmupDecayLR), stepped after every
/// optimizer step as DeepSpeed does; nullptr when none is named.
std::shared_ptr<LRScheduler> make_deepspeed_scheduler(const DeepSpeedConfig& config,
                                                      torch::optim::Optimizer& optimizer);

}  // namespace volt
