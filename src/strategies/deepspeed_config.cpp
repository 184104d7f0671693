#include "volt/strategies/deepspeed_config.h"

#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>

#include "core/detail/input_limits.h"
#include "core/detail/numbers.h"
#include "volt/core/check.h"
#include "volt/core/registry.h"
#include "volt/kernels/fused_adamw.h"
#include "volt/optim/lr_scheduler.h"

namespace volt {
namespace {

using nlohmann::json;
constexpr const char* kTag = "[DeepSpeedConfig]";

// What volt reads, per object, and the DeepSpeed keys it knows but does not act on.
const std::vector<std::string> kTop = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16",
    "fp16", "zero_optimization", "optimizer", "scheduler", "gradient_clipping",
    "zero_allow_untested_optimizer",
    // DeepSpeed inference (init_inference's config)
    "tensor_parallel", "mp_size", "dtype", "injection_policy", "replace_with_kernel_inject",
    "enable_cuda_graph", "replace_method", "activation_checkpointing", "aio"};
const std::vector<std::string> kTopIgnored = {"steps_per_print",
                                              "wall_clock_breakdown",
                                              "dump_state",
                                              "prescale_gradients",
                                              "gradient_predivide_factor",
                                              "sparse_gradients",
                                              "communication_data_type",
                                              "zero_force_ds_cpu_optimizer",
                                              "flops_profiler",
                                              "tensorboard",
                                              "wandb",
                                              "csv_monitor",
                                              "comet",
                                              "amp",
                                              "elasticity",
                                              "comms_logger",
                                              "checkpoint",
                                              "data_types",
                                              "compression_training",
                                              "autotuning",
                                              "memory_breakdown",
                                              "disable_allgather",
                                              "timers",
                                              "torch_autocast",
                                              "data_efficiency",
                                              "curriculum_learning",
                                              "sparse_attention",
                                              "pipeline",
                                              "seq_parallel_communication_data_type",
                                              "seed"};
const std::vector<std::string> kZero = {"stage",
                                        "offload_optimizer",
                                        "offload_param",
                                        "overlap_comm",
                                        "reduce_bucket_size",
                                        "allgather_bucket_size",
                                        "contiguous_gradients",
                                        "stage3_prefetch_bucket_size",
                                        "stage3_param_persistence_threshold",
                                        "stage3_max_live_parameters",
                                        "reduce_scatter",
                                        "allgather_partitions",
                                        "sub_group_size",
                                        "ignore_unused_parameters"};
const std::vector<std::string> kZeroIgnored = {"stage3_max_reuse_distance",
                                               "stage3_gather_16bit_weights_on_model_save",
                                               "stage3_gather_fp16_weights_on_model_save",
                                               "round_robin_gradients",
                                               "elastic_checkpoint",
                                               "load_from_fp32_weights",
                                               "zero_hpz_partition_size",
                                               "zero_quantized_weights",
                                               "zero_quantized_gradients",
                                               "mics_shard_size",
                                               "memory_efficient_linear",
                                               "cpu_offload",
                                               "cpu_offload_params",
                                               "cpu_offload_use_pin_memory",
                                               "legacy_stage1",
                                               "use_multi_rank_bucket_allreduce",
                                               "log_trace_cache_warnings"};
// activation_checkpointing: cpu_checkpointing is acted on; partition_activations and
// contiguous_memory_optimization are refused when true; the rest tune DeepSpeed's own
// implementation (number_checkpoints sizes its contiguous buffers, synchronize_checkpoint_boundary
// is a CUDA synchronize, profile times its checkpoint calls; volt's recomputation always shows
// as "volt::checkpoint::recompute" in profiles).
const std::vector<std::string> kActivation = {"cpu_checkpointing", "partition_activations",
                                              "contiguous_memory_optimization"};
const std::vector<std::string> kActivationIgnored = {"number_checkpoints",
                                                     "synchronize_checkpoint_boundary", "profile"};
const std::vector<std::string> kOffload = {"device", "nvme_path", "pin_memory"};
const std::vector<std::string> kOffloadIgnored = {"buffer_count",  "buffer_size", "max_in_cpu",
                                                  "fast_init",     "ratio",       "pipeline_read",
                                                  "pipeline_write"};
// aio: volt's io_uring queue acts on block_size and queue_depth; the others tune DeepSpeed's
// own thread pool and libaio submission.
const std::vector<std::string> kAio = {"block_size", "queue_depth"};
const std::vector<std::string> kAioIgnored = {"thread_count", "single_submit", "overlap_events",
                                              "intra_op_parallelism", "use_gds"};
// fp16: enabled and the loss scaler's keys; bf16: enabled (DeepSpeed's bf16 has no loss scaler,
// so the fp16 scaler keys there are listed as ignored, as before volt read them).
const std::vector<std::string> kFp16 = {"enabled",           "loss_scale", "initial_scale_power",
                                        "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                                        "min_loss_scale"};
const std::vector<std::string> kFp16Ignored = {"auto_cast", "immediate_grad_update",
                                               "fp16_master_weights_and_grads"};
const std::vector<std::string> kBf16 = {"enabled"};
const std::vector<std::string> kBf16Ignored = {
    "loss_scale", "initial_scale_power",    "loss_scale_window",
    "hysteresis", "consecutive_hysteresis", "min_loss_scale",
    "auto_cast",  "immediate_grad_update",  "fp16_master_weights_and_grads"};
const std::vector<std::string> kTyped = {"type", "params"};
// "plan" is volt's: module path pattern -> colwise | colwise_qkv | rowwise | replicated.
const std::vector<std::string> kTensorParallel = {"tp_size", "enabled", "plan", "num_heads"};
const std::vector<std::string> kTensorParallelIgnored = {"tp_group", "mpu", "tp_grain_size"};
const std::vector<std::string> kOptimizers = {"Adam", "AdamW", "SGD"};
const std::vector<std::string> kSchedulers = {"WarmupLR", "WarmupDecayLR"};
const std::vector<std::string> kOptimizerParams = {
    "lr",        "betas",           "eps",      "weight_decay", "adam_w_mode",
    "amsgrad",   "bias_correction", "momentum", "dampening",    "nesterov",
    "torch_adam"};
const std::vector<std::string> kSchedulerParams = {"warmup_min_lr",    "warmup_max_lr",
                                                   "warmup_num_steps", "warmup_type",
                                                   "total_num_steps",  "last_batch_iteration"};

struct Reader {
  const DeepSpeedConfig& cfg;

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw ConfigError(detail::str_cat(kTag, " ", cfg.origin, ": \"", path, "\" ", what));
  }

  // Every key of `obj` is known: read, ignored (recorded), or an error naming the closest.
  void check_keys(const json& obj, const std::string& path, const std::vector<std::string>& known,
                  const std::vector<std::string>& ignored, std::vector<std::string>& out) const {
    if (!obj.is_object()) fail(path, "must be a JSON object");
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      const std::string key = it.key();
      const std::string full = path.empty() ? key : path + "." + key;
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      if (std::find(ignored.begin(), ignored.end(), key) != ignored.end()) {
        out.push_back(full);
        continue;
      }
      std::vector<std::string> all = known;
      all.insert(all.end(), ignored.begin(), ignored.end());
      fail(full, "is not a DeepSpeed key volt knows" + did_you_mean(key, all) +
                     "; remove it or fix its spelling.");
    }
  }

  bool is_auto(const json& v) const { return v.is_string() && v.get<std::string>() == "auto"; }

  // An integer >= `min` (0 for counts that may be zero, 1 for sizes), or nullopt when absent.
  c10::optional<int64_t> positive_int(const json& obj, const std::string& key,
                                      const std::string& path, int64_t min = 0) const {
    if (!obj.contains(key) || obj[key].is_null() || is_auto(obj[key])) return c10::nullopt;
    const json& v = obj[key];
    const int64_t n = integer(v, path + key, "an integer or \"auto\"");
    if (n < min)
      fail(path + key, "must be >= " + std::to_string(min) + ", got " + std::to_string(n));
    return n;
  }

  // `v` as an int64: a JSON integer, or a float with an integral value, within int64's range
  // (a float such as 1e300 has no int64: casting it would be undefined behaviour).
  int64_t integer(const json& v, const std::string& path, const std::string& what) const {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}) {
      fail(path, "is outside the 64-bit integer range");
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    if (!v.is_number_float() || v.get<double>() != std::floor(v.get<double>())) {
      fail(path, "must be " + what);
    }
    const double d = v.get<double>();
    // 2^63 is exactly representable; every double below it (and >= -2^63) fits an int64.
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) {
      fail(path, "is outside the 64-bit integer range");
    }
    return static_cast<int64_t>(d);
  }

  c10::optional<bool> boolean(const json& obj, const std::string& key,
                              const std::string& path) const {
    if (!obj.contains(key) || is_auto(obj[key])) return c10::nullopt;
    if (!obj[key].is_boolean()) fail(path + key, "must be true or false");
    return obj[key].get<bool>();
  }

  double number(const json& v, const std::string& path) const {
    if (!v.is_number()) fail(path, "must be a number");
    return v.get<double>();  // finite: a literal beyond double's range is refused while parsing
  }

  std::string string(const json& obj, const std::string& key, const std::string& path) const {
    if (!obj[key].is_string()) fail(path + key, "must be a string");
    return obj[key].get<std::string>();
  }
};

void read_offload(const Reader& r, const json& obj, const std::string& path, std::string& device,
                  DeepSpeedConfig& cfg) {
  r.check_keys(obj, path, kOffload, kOffloadIgnored, cfg.ignored);
  if (obj.contains("device")) {
    device = obj["device"].is_null() ? "none" : r.string(obj, "device", path + ".");
    if (device != "none" && device != "cpu" && device != "nvme") {
      r.fail(path + ".device", "is \"" + device + "\"; use \"none\", \"cpu\" or \"nvme\"");
    }
  }
  if (obj.contains("nvme_path")) cfg.nvme_path = r.string(obj, "nvme_path", path + ".");
  if (auto b = r.boolean(obj, "pin_memory", path + ".")) cfg.pin_memory = *b;
}

// fp16: enabled and DeepSpeed's dynamic loss scaler (its keys, checked as DeepSpeed's
// DynamicLossScaler needs them).
void read_fp16(const Reader& r, const json& obj, DeepSpeedConfig& cfg) {
  r.check_keys(obj, "fp16", kFp16, kFp16Ignored, cfg.ignored);
  cfg.fp16 = r.boolean(obj, "enabled", "fp16.").value_or(false);
  const auto number = [&](const char* key) -> c10::optional<double> {
    if (!obj.contains(key) || obj[key].is_null() || r.is_auto(obj[key])) return c10::nullopt;
    return r.number(obj[key], std::string("fp16.") + key);
  };
  if (auto v = number("loss_scale")) {
    if (*v < 0) r.fail("fp16.loss_scale", "must be >= 0 (0: dynamic loss scaling)");
    cfg.loss_scale = *v;
  }
  cfg.initial_scale_power = r.positive_int(obj, "initial_scale_power", "fp16.", 0);
  // 2^127 is the largest power of two a float32 loss can be multiplied by.
  if (cfg.initial_scale_power && *cfg.initial_scale_power > 127) {
    r.fail("fp16.initial_scale_power",
           "is " + std::to_string(*cfg.initial_scale_power) +
               "; the scale 2^power must stay within float32's range: use at most 127 (DeepSpeed's "
               "default is 16)");
  }
  cfg.loss_scale_window = r.positive_int(obj, "loss_scale_window", "fp16.", 1);
  cfg.hysteresis = r.positive_int(obj, "hysteresis", "fp16.", 1);
  cfg.consecutive_hysteresis = r.boolean(obj, "consecutive_hysteresis", "fp16.");
  if (auto v = number("min_loss_scale")) {
    if (!(*v > 0)) r.fail("fp16.min_loss_scale", "must be > 0 (DeepSpeed's default is 1)");
    cfg.min_loss_scale = *v;
  }
}

void read_typed(const Reader& r, const json& obj, const std::string& path,
                const std::vector<std::string>& types, const std::vector<std::string>& params,
                std::string& type, std::vector<std::pair<std::string, json>>& out,
                std::vector<std::string>& ignored) {
  r.check_keys(obj, path, kTyped, {}, ignored);
  if (!obj.contains("type")) r.fail(path, "needs a \"type\"");
  type = r.string(obj, "type", path + ".");
  if (std::find(types.begin(), types.end(), type) == types.end()) {
    auto os = detail::c_stream<std::ostringstream>();
    os << "type \"" << type << "\" is not supported" << did_you_mean(type, types) << "; use one of";
    for (const auto& t : types) os << " " << t;
    r.fail(path + ".type", os.str());
  }
  if (!obj.contains("params")) return;
  const json& p = obj["params"];
  r.check_keys(p, path + ".params", params, {}, ignored);
  for (auto it = p.begin(); it != p.end(); ++it) out.emplace_back(it.key(), it.value());
}

// DeepSpeed inference's keys: tensor_parallel {tp_size} (or the older mp_size), dtype,
// injection_policy {module: member or [members]}, replace_with_kernel_inject,
// enable_cuda_graph, replace_method.
void read_inference(const Reader& r, const json& root, DeepSpeedConfig& cfg) {
  if (root.contains("tensor_parallel")) {
    const json& tp = root["tensor_parallel"];
    r.check_keys(tp, "tensor_parallel", kTensorParallel, kTensorParallelIgnored, cfg.ignored);
    const bool enabled = r.boolean(tp, "enabled", "tensor_parallel.").value_or(true);
    if (auto n = r.positive_int(tp, "tp_size", "tensor_parallel.", 1)) {
      if (enabled) cfg.tp_size = *n;
    }
    cfg.tp_num_heads = r.positive_int(tp, "num_heads", "tensor_parallel.");
    if (tp.contains("plan")) {
      const json& plan = tp["plan"];
      if (!plan.is_object()) r.fail("tensor_parallel.plan", "must be an object {pattern: style}");
      for (auto it = plan.begin(); it != plan.end(); ++it) {
        if (!it.value().is_string()) {
          r.fail("tensor_parallel.plan." + it.key(),
                 "must be \"colwise\", \"colwise_qkv\", \"rowwise\" or \"replicated\"");
        }
        cfg.tp_plan.emplace_back(it.key(), it.value().get<std::string>());
      }
    }
  }
  if (auto n = r.positive_int(root, "mp_size", "", 1)) {
    if (cfg.tp_size && *cfg.tp_size != *n) {
      r.fail("mp_size", "is " + std::to_string(*n) + " but tensor_parallel.tp_size is " +
                            std::to_string(*cfg.tp_size) + "; keep one (mp_size is the old name)");
    }
    cfg.tp_size = *n;
  }
  if (root.contains("dtype")) {
    const std::string d = r.string(root, "dtype", "");
    static const std::set<std::string> f32 = {"float32", "fp32", "float", "torch.float",
                                              "torch.float32"};
    static const std::set<std::string> bf16 = {"bfloat16", "bf16", "torch.bfloat16"};
    if (f32.count(d) != 0) {
      cfg.dtype = "float32";
    } else if (bf16.count(d) != 0) {
      cfg.dtype = "bfloat16";
    } else {
      r.fail("dtype", "is \"" + d +
                          "\"; volt's inference runs \"float32\" or \"bfloat16\" (float16 and "
                          "int8 weights are not built)");
    }
  }
  if (root.contains("injection_policy")) {
    const json& pol = root["injection_policy"];
    if (!pol.is_object()) {
      r.fail("injection_policy", "must be an object {\"ModuleType\": [\"member\", ...]}");
    }
    for (auto it = pol.begin(); it != pol.end(); ++it) {
      std::vector<std::string> members;
      const std::string path = "injection_policy." + it.key();
      if (it.value().is_string()) {
        members.push_back(it.value().get<std::string>());
      } else if (it.value().is_array()) {
        for (const json& m : it.value()) {
          if (!m.is_string()) r.fail(path, "must list member names (strings)");
          members.push_back(m.get<std::string>());
        }
      } else {
        r.fail(path, "must be a member name or a list of member names");
      }
      if (members.empty()) r.fail(path, "lists no member; name the row-parallel Linears");
      cfg.injection_policy.emplace_back(it.key(), members);
    }
  }
  cfg.replace_with_kernel_inject = r.boolean(root, "replace_with_kernel_inject", "");
  cfg.enable_cuda_graph = r.boolean(root, "enable_cuda_graph", "");
  if (root.contains("replace_method")) cfg.replace_method = r.string(root, "replace_method", "");
}

}  // namespace

DeepSpeedConfig parse_deepspeed_config(const std::string& text, const std::string& origin) {
  DeepSpeedConfig cfg;
  cfg.origin = origin;
  const json root = detail::parse_json_bounded(text, "DeepSpeedConfig", origin);
  const Reader r{cfg};
  r.check_keys(root, "", kTop, kTopIgnored, cfg.ignored);
  cfg.train_batch_size = r.positive_int(root, "train_batch_size", "", 1);
  cfg.train_micro_batch_size_per_gpu =
      r.positive_int(root, "train_micro_batch_size_per_gpu", "", 1);
  cfg.gradient_accumulation_steps = r.positive_int(root, "gradient_accumulation_steps", "", 1);
  if (root.contains("bf16")) {
    r.check_keys(root["bf16"], "bf16", kBf16, kBf16Ignored, cfg.ignored);
    cfg.bf16 = r.boolean(root["bf16"], "enabled", "bf16.").value_or(false);
  }
  if (root.contains("fp16")) read_fp16(r, root["fp16"], cfg);
  if (cfg.bf16 && cfg.fp16) r.fail("fp16", "and bf16 are both enabled; enable one");
  if (root.contains("gradient_clipping") && !r.is_auto(root["gradient_clipping"])) {
    const double c = r.number(root["gradient_clipping"], "gradient_clipping");
    if (c < 0) r.fail("gradient_clipping", "must be >= 0");
    if (c > 0) cfg.gradient_clipping = c;
  }
  cfg.zero_allow_untested_optimizer = r.boolean(root, "zero_allow_untested_optimizer", "");
  if (root.contains("activation_checkpointing")) {
    const json& a = root["activation_checkpointing"];
    const std::string p = "activation_checkpointing.";
    r.check_keys(a, "activation_checkpointing", kActivation, kActivationIgnored, cfg.ignored);
    cfg.cpu_checkpointing = r.boolean(a, "cpu_checkpointing", p).value_or(false);
    VOLT_CHECK(!r.boolean(a, "partition_activations", p).value_or(false), NotAvailable, kTag, " ",
               origin,
               ": \"activation_checkpointing.partition_activations\" splits checkpointed "
               "activations across model-parallel ranks, and volt trains without model "
               "parallelism; set it to false (cpu_checkpointing moves them off the device "
               "instead).");
    VOLT_CHECK(!r.boolean(a, "contiguous_memory_optimization", p).value_or(false), NotAvailable,
               kTag, " ", origin,
               ": \"activation_checkpointing.contiguous_memory_optimization\" "
               "(DeepSpeed copying checkpoints into one preallocated buffer against "
               "fragmentation) is not built in volt; set it to false.");
    for (const char* k : {"number_checkpoints", "synchronize_checkpoint_boundary", "profile"}) {
      if (!a.contains(k) || a[k].is_null()) continue;
      const bool ok =
          std::string(k) == "number_checkpoints" ? a[k].is_number_integer() : a[k].is_boolean();
      if (!ok) {
        r.fail(p + k, std::string(k) == "number_checkpoints" ? "must be an integer"
                                                             : "must be true or false");
      }
    }
  }

  if (root.contains("aio")) {
    const json& a = root["aio"];
    r.check_keys(a, "aio", kAio, kAioIgnored, cfg.ignored);
    cfg.aio_block_size = r.positive_int(a, "block_size", "aio.", 1);
    cfg.aio_queue_depth = r.positive_int(a, "queue_depth", "aio.", 1);
  }

  if (root.contains("zero_optimization")) {
    const json& z = root["zero_optimization"];
    cfg.zero = true;
    r.check_keys(z, "zero_optimization", kZero, kZeroIgnored, cfg.ignored);
    const std::string p = "zero_optimization.";
    if (auto s = r.positive_int(z, "stage", p)) cfg.stage = *s;
    if (cfg.stage > 3)
      r.fail(p + "stage", "is " + std::to_string(cfg.stage) + "; use 0, 1, 2 or 3");
    if (z.contains("offload_optimizer")) {
      read_offload(r, z["offload_optimizer"], p + "offload_optimizer", cfg.offload_optimizer_device,
                   cfg);
    }
    if (z.contains("offload_param")) {
      read_offload(r, z["offload_param"], p + "offload_param", cfg.offload_param_device, cfg);
    }
    cfg.reduce_bucket_size = r.positive_int(z, "reduce_bucket_size", p, 1);
    cfg.sub_group_size = r.positive_int(z, "sub_group_size", p, 1);
    cfg.allgather_bucket_size = r.positive_int(z, "allgather_bucket_size", p, 1);
    cfg.overlap_comm = r.boolean(z, "overlap_comm", p);
    cfg.ignore_unused_parameters = r.boolean(z, "ignore_unused_parameters", p);
    cfg.contiguous_gradients = r.boolean(z, "contiguous_gradients", p);
    cfg.stage3_prefetch_bucket_size = r.positive_int(z, "stage3_prefetch_bucket_size", p);
    cfg.stage3_param_persistence_threshold =
        r.positive_int(z, "stage3_param_persistence_threshold", p);
    cfg.stage3_max_live_parameters = r.positive_int(z, "stage3_max_live_parameters", p);
    for (const char* k : {"reduce_scatter", "allgather_partitions"}) r.boolean(z, k, p);
  }

  read_inference(r, root, cfg);

  if (root.contains("optimizer")) {
    std::vector<std::pair<std::string, json>> params;
    read_typed(r, root["optimizer"], "optimizer", kOptimizers, kOptimizerParams, cfg.optimizer_type,
               params, cfg.ignored);
    for (const auto& [k, v] : params) {
      const std::string path = "optimizer.params." + k;
      if (k == "betas") {
        if (!v.is_array() || v.size() != 2) r.fail(path, "must be a list of two numbers");
        cfg.optimizer_params[k] = {r.number(v[0], path), r.number(v[1], path)};
      } else if (v.is_boolean()) {
        cfg.optimizer_params[k] = {v.get<bool>() ? 1.0 : 0.0};
      } else {
        cfg.optimizer_params[k] = {r.number(v, path)};
      }
    }
  }
  if (root.contains("scheduler")) {
    std::vector<std::pair<std::string, json>> params;
    read_typed(r, root["scheduler"], "scheduler", kSchedulers, kSchedulerParams, cfg.scheduler_type,
               params, cfg.ignored);
    for (const auto& [k, v] : params) {
      const std::string path = "scheduler.params." + k;
      if (k == "warmup_type") {
        if (!v.is_string() || (v != "log" && v != "linear")) {
          r.fail(path, "must be \"log\" or \"linear\"");
        }
        cfg.warmup_type = v.get<std::string>();
      } else if (k == "warmup_num_steps" || k == "total_num_steps") {
        const int64_t n = r.integer(v, path, "an integer");
        if (n < 0) r.fail(path, "must be >= 0, got " + std::to_string(n));
        // Kept as a double like the other parameters: exact up to 2^53 steps.
        if (n > (int64_t{1} << 53)) r.fail(path, "is too large: at most 2^53");
        cfg.scheduler_params[k] = static_cast<double>(n);
      } else {
        cfg.scheduler_params[k] = r.number(v, path);
      }
    }
    if (cfg.scheduler_type == "WarmupDecayLR" && !cfg.scheduler_params.count("total_num_steps")) {
      r.fail("scheduler.params.total_num_steps", "is required by WarmupDecayLR");
    }
  }
  return cfg;
}

DeepSpeedConfig load_deepspeed_config(const std::string& config) {
  size_t first = config.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && config[first] == '{') {
    return parse_deepspeed_config(config, "inline JSON");
  }
  auto in = detail::c_stream<std::ifstream>(config, std::ios::binary);
  VOLT_CHECK(in.good(), ConfigError, kTag, " cannot read the DeepSpeed config file '", config,
             "'; pass an existing JSON file or inline JSON starting with '{'.");
  return parse_deepspeed_config(detail::read_bounded(in, "DeepSpeedConfig", config), config);
}

c10::optional<DeepSpeedBatch> resolve_deepspeed_batch(const DeepSpeedConfig& c, int64_t world,
                                                      int64_t trainer_accumulation) {
  VOLT_CHECK(
      !c.gradient_accumulation_steps || *c.gradient_accumulation_steps == trainer_accumulation,
      ConfigError, kTag, " ", c.origin,
      ": gradient_accumulation_steps=", *c.gradient_accumulation_steps,
      " but the Trainer's accumulate_grad_batches=", trainer_accumulation,
      "; set one of them (Lightning takes it from the Trainer: drop it from the JSON).");
  const int64_t gas = trainer_accumulation;
  const auto tb = c.train_batch_size;
  auto mb = c.train_micro_batch_size_per_gpu;
  if (!tb && !mb) return c10::nullopt;
  // The products below, checked: sizes from a JSON file can be anything up to int64's limit.
  auto product = [&](int64_t a, int64_t b, const char* what) {
    int64_t out = 0;
    VOLT_CHECK(!__builtin_mul_overflow(a, b, &out), ConfigError, kTag, " ", c.origin, ": ", what,
               " overflows a 64-bit integer (", a, " x ", b, "); use realistic batch sizes.");
    return out;
  };
  const int64_t gas_world = product(gas, world, "accumulation x world size");
  if (tb && !mb) {
    VOLT_CHECK(*tb % gas_world == 0, ConfigError, kTag, " ", c.origin, ": train_batch_size=", *tb,
               " is not divisible by accumulation ", gas, " x world size ", world,
               "; use a multiple of ", gas_world, ".");
    mb = *tb / gas_world;
  }
  const int64_t global =
      product(*mb, gas_world, "train_micro_batch_size_per_gpu x accumulation x world size");
  DeepSpeedBatch b{tb ? *tb : global, *mb, gas};
  VOLT_CHECK(b.train_batch_size == global, ConfigError, kTag, " ", c.origin,
             ": train_batch_size=", b.train_batch_size,
             " must equal train_micro_batch_size_per_gpu (", b.micro_batch_size,
             ") x gradient accumulation (", gas, ") x world size (", world, ") = ", global,
             "; fix one of them.");
  return b;
}

std::shared_ptr<torch::optim::Optimizer> make_deepspeed_optimizer(
    const DeepSpeedConfig& c, const std::vector<at::Tensor>& params) {
  if (c.optimizer_type.empty()) return nullptr;
  auto get = [&](const char* k, double def) {
    auto it = c.optimizer_params.find(k);
    return it == c.optimizer_params.end() ? def : it->second.front();
  };
  if (c.optimizer_type == "SGD") {
    const auto o = torch::optim::SGDOptions(get("lr", 1e-3))
                       .momentum(get("momentum", 0))
                       .dampening(get("dampening", 0))
                       .weight_decay(get("weight_decay", 0))
                       .nesterov(get("nesterov", 0) != 0);
    // torch::optim::SGD's own checks throw c10::Error: say it as a ConfigError with the key.
    auto check = [&](bool ok, const char* key, double value, const char* rule) {
      VOLT_CHECK(ok, ConfigError, kTag, " ", c.origin, ": \"optimizer.params.", key, "\" ", value,
                 " ", rule, ".");
    };
    check(o.lr() >= 0, "lr", o.lr(), "must be >= 0");
    check(o.momentum() >= 0, "momentum", o.momentum(), "must be >= 0");
    check(o.weight_decay() >= 0, "weight_decay", o.weight_decay(), "must be >= 0");
    check(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0), "nesterov", 1.0,
          "needs momentum > 0 and dampening 0");
    return std::make_shared<torch::optim::SGD>(params, o);
  }
  // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false (its FusedAdam / CPU-Adam).
  FusedAdamWOptions o(get("lr", 1e-3));
  auto betas = c.optimizer_params.find("betas");
  if (betas != c.optimizer_params.end()) {
    o.betas(std::make_tuple(betas->second[0], betas->second[1]));
  }
  o.eps(get("eps", 1e-8))
      .weight_decay(get("weight_decay", 0))
      .amsgrad(get("amsgrad", 0) != 0)
      .bias_correction(get("bias_correction", 1) != 0)
      .adam_w_mode(c.optimizer_type == "AdamW" || get("adam_w_mode", 1) != 0);
  return std::make_shared<FusedAdamW>(params, o);
}

std::shared_ptr<LRScheduler> make_deepspeed_scheduler(const DeepSpeedConfig& c,
                                                      torch::optim::Optimizer& optimizer) {
  if (c.scheduler_type.empty()) return nullptr;
  auto get = [&](const char* k, double def) {
    auto it = c.scheduler_params.find(k);
    return it == c.scheduler_params.end() ? def : it->second;
  };
  WarmupLROptions o;
  o.warmup_min_lr(get("warmup_min_lr", 0.0))
      .warmup_max_lr(get("warmup_max_lr", 0.001))
      .warmup_num_steps(static_cast<int64_t>(get("warmup_num_steps", 1000)))
      .warmup_type(c.warmup_type == "linear" ? WarmupType::kLinear : WarmupType::kLog)
      .total_num_steps(static_cast<int64_t>(get("total_num_steps", 0)));
  if (c.scheduler_type == "WarmupDecayLR") return std::make_shared<WarmupDecayLR>(optimizer, o);
  return std::make_shared<WarmupLR>(optimizer, o);
}

}  // namespace volt
