#include "volt/strategies/deepspeed.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/accumulate.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "core/detail/fp8_state.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "core/detail/remove_tree.h"
#include "core/detail/state_key.h"
#include "strategies/detail/agree.h"
#include "strategies/detail/checkpoint_folder.h"
#include "strategies/detail/optimizer_swapper.h"
#include "strategies/detail/replica_mesh.h"
#include "strategies/detail/sub_groups.h"
#include "volt/core/atomic_file.h"
#include "volt/core/check.h"
#include "volt/core/env.h"
#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/io/state.h"
#include "volt/kernels/fused_optimizer.h"
#include "volt/nn/checkpoint.h"
#include "volt/nn/kernel_injection.h"
#include "volt/nn/parameters.h"
#include "volt/precision/grad_scaler.h"
#include "volt/strategies/model_parallel.h"

namespace volt {
namespace {

namespace fs = std::filesystem;
using detail::archive_of;
using detail::ArchivePath;
using detail::dict_of_optimizer;
using detail::Entries;
using detail::entries_of;
using detail::is_directory;
using detail::read_sub;
using detail::read_value;
using detail::sub_at;
using detail::write_consolidated;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

constexpr const char* kTag = "[DeepSpeedStrategy]";
// Written by rank 0 after every shard, so a folder with it is complete.
constexpr const char* kMetaFile = detail::kZeroMetaFile;
constexpr int64_t kZeroFormat = 1;
// Master weights (bf16 with ZeRO) in a parameter's optimizer state: this rank's fp32 chunk in a
// shard, the whole fp32 tensor once consolidated.
constexpr const char* kMasterKey = "fp32_master";

DdpStrategyOptions ddp_options(const DeepSpeedStrategyOptions& o) {
  // DeepSpeed does not re-broadcast buffers every step; everything else is DDP's machinery.
  return DdpStrategyOptions()
      .timeout_s(o.timeout_s())
      .process_group_backend(o.process_group_backend())
      .broadcast_buffers(false);
}

std::string shard_file(const std::string& folder, int64_t rank, int64_t world) {
  return folder + "/rank_" + std::to_string(rank) + "_of_" + std::to_string(world) + ".ckpt";
}

// What a complete ZeRO folder's metadata file says (world_size 0: no such file).
struct FolderMeta {
  int64_t world_size = 0;
  int64_t stage = 0;
};

FolderMeta folder_meta(const std::string& folder) {
  auto f = detail::c_stream<std::ifstream>(folder + "/" + kMetaFile);
  if (!f) return {};
  std::string key;
  int64_t format = 0;
  FolderMeta m;
  while (f >> key) {
    if (key == "format") f >> format;
    if (key == "world_size") f >> m.world_size;
    if (key == "stage") f >> m.stage;
  }
  VOLT_CHECK(format == kZeroFormat && m.world_size >= 1, CheckpointError, kTag, " '", folder, "/",
             kMetaFile, "' is damaged or from another volt (format ", format, ", world_size ",
             m.world_size, "); re-save the checkpoint.");
  return m;
}

bool tested_optimizer(const torch::optim::Optimizer& o) {
  using namespace torch::optim;
  return dynamic_cast<const SGD*>(&o) || dynamic_cast<const Adam*>(&o) ||
         dynamic_cast<const AdamW*>(&o) || dynamic_cast<const RMSprop*>(&o) ||
         dynamic_cast<const Adagrad*>(&o) || dynamic_cast<const FusedOptimizer*>(&o);
}

}  // namespace

// ============================================================================ the strategy

DeepSpeedStrategy::DeepSpeedStrategy(DeepSpeedStrategyOptions options,
                                     std::shared_ptr<Accelerator> accelerator,
                                     std::shared_ptr<Precision> precision, int64_t devices,
                                     int64_t num_nodes, std::shared_ptr<CheckpointIO> checkpoint_io)
    : DdpStrategy(ddp_options(options), std::move(accelerator), std::move(precision),
                  options.parallel_devices() > 0 ? options.parallel_devices() : devices, num_nodes,
                  std::move(checkpoint_io)),
      options_(std::move(options)) {
  if (!options_.config().empty()) apply_config();
  VOLT_CHECK(options_.stage() >= 0 && options_.stage() <= 3, ConfigError, kTag,
             " stage=", options_.stage(), " is not a ZeRO stage; use 1, 2 or 3.");
  VOLT_CHECK(!precision_ || precision_->compute_dtype() != c10::kDouble, ConfigError, kTag,
             " precision \"", precision_->name(),
             "\" (float64) is not supported: ZeRO's partitions, fp32 masters and offload buffers "
             "are built for fp32, bf16 and fp16 weights (as DeepSpeed's). Train in float64 with "
             "strategy=\"ddp\", or keep ZeRO with precision 32-true or bf16-mixed.");
  VOLT_CHECK(!options_.offload_parameters() || options_.stage() == 3, ConfigError, kTag,
             " offload_parameters needs stage 3 (only stage 3 partitions parameters); got stage ",
             options_.stage(), ".");
  if (options_.offload_parameters() && accelerator_->name() != "cpu") {
    VOLT_CHECK(options_.offload_optimizer(), ConfigError, kTag,
               " offload_parameters with parameters on ", accelerator_->name(),
               " needs offload_optimizer=true too (the optimizer steps the host copies of the "
               "parameter chunks; deepspeed_stage_3_offload sets both).");
    VOLT_CHECK(options_.offload_parameters_device() == "cpu", NotAvailable, kTag,
               " offload_parameters_device=\"", options_.offload_parameters_device(),
               "\" with parameters on ", accelerator_->name(),
               " is not built yet (issue #12); use \"cpu\" (pinned host memory).");
  }
  VOLT_CHECK(
      options_.param_persistence_threshold() >= 0 && options_.max_live_parameters() >= 0,
      ConfigError, kTag, " param_persistence_threshold=", options_.param_persistence_threshold(),
      " and max_live_parameters=", options_.max_live_parameters(), " must be >= 0 (elements).");
  VOLT_CHECK(options_.prefetch_bucket_size() >= 0, ConfigError, kTag,
             " prefetch_bucket_size=", options_.prefetch_bucket_size(),
             " must be >= 0 (elements; 0 turns stage 3 prefetching off).");
  VOLT_CHECK(options_.parallel_devices() >= 0, ConfigError, kTag,
             " parallel_devices=", options_.parallel_devices(),
             " must be >= 0 (0 takes the Trainer's devices).");
  VOLT_CHECK(options_.reduce_bucket_size() > 0 && options_.allgather_bucket_size() > 0, ConfigError,
             kTag, " reduce_bucket_size=", options_.reduce_bucket_size(),
             " and allgather_bucket_size=", options_.allgather_bucket_size(),
             " must be > 0 (elements).");
  const TensorParallelOptions& tp = options_.tensor_parallel();
  VOLT_CHECK(tp.tp_size() >= 1, ConfigError, kTag, " tensor_parallel.tp_size=", tp.tp_size(),
             " must be >= 1 (1: off).");
  VOLT_CHECK(options_.dtype() == "float32" || options_.dtype() == "bfloat16", ConfigError, kTag,
             " dtype=\"", options_.dtype(), "\"; use \"float32\" or \"bfloat16\".");
  VOLT_CHECK(!options_.enable_cuda_graph(), NotAvailable, kTag,
             " enable_cuda_graph: the DeepSpeed inference path does not capture graphs yet (issue "
             "#15); set it to false, and wrap the model's forward with volt::wrap_in_graph in "
             "predict_step / test_step instead (docs/CUDA_GRAPHS.md).");
  VOLT_CHECK(options_.replace_method() == "auto", ConfigError, kTag, " replace_method=\"",
             options_.replace_method(), "\"; DeepSpeed's only value is \"auto\".");
  configure_loss_scaling();
  const std::string& dev = options_.offload_optimizer_device();
  VOLT_CHECK(dev == "cpu" || dev == "nvme", ConfigError, kTag, " offload_optimizer_device=\"", dev,
             "\" is not a device; use \"cpu\" or \"nvme\".");
  const std::string& pdev = options_.offload_parameters_device();
  VOLT_CHECK(pdev == "cpu" || pdev == "nvme", ConfigError, kTag, " offload_parameters_device=\"",
             pdev, "\" is not a device; use \"cpu\" or \"nvme\".");
  VOLT_CHECK(!options_.offload_parameters() || pdev == "cpu" || options_.stage() == 3, ConfigError,
             kTag, " offload_parameters_device=\"nvme\" needs stage 3 (stage ", options_.stage(),
             " keeps whole parameters on every rank); set stage=3.");
  // The NVMe sizes are checked even when nothing goes to NVMe: a value that means nothing should
  // not pass silently in one config and fail once offload is switched on.
  // A block is one read or write: Linux moves at most 0x7ffff000 bytes in one, and io_uring
  // takes a 32-bit length (a block of 2^32 bytes became 0-byte requests: "the file ends first").
  constexpr int64_t kMaxAioBlock = 0x7ffff000;
  VOLT_CHECK(options_.sub_group_size() > 0 && options_.aio_block_size() > 0 &&
                 options_.aio_block_size() <= kMaxAioBlock && options_.aio_queue_depth() > 0 &&
                 options_.aio_queue_depth() <= 4096,
             ConfigError, kTag, " sub_group_size=", options_.sub_group_size(),
             ", aio_block_size=", options_.aio_block_size(),
             " and aio_queue_depth=", options_.aio_queue_depth(),
             " must be > 0 (block size at most 2147479552, Linux's largest single read; queue "
             "depth at most 4096); DeepSpeed's defaults are 1e9, 1048576 and 8.");
  VOLT_CHECK(tp.num_heads() >= 0, ConfigError, kTag, " tensor_parallel.num_heads=", tp.num_heads(),
             " must be >= 0 (0: unknown; set it to the model's attention head count).");
  if ((options_.offload_optimizer() && dev == "nvme") ||
      (options_.offload_parameters() && pdev == "nvme")) {
    const std::string& path = options_.nvme_path();
    struct stat st;
    VOLT_CHECK(::stat(path.c_str(), &st) == 0, ConfigError, kTag, " nvme_path='", path,
               "' does not exist; create it (on a fast local disk) or set nvme_path to an "
               "existing folder.");
    VOLT_CHECK(S_ISDIR(st.st_mode), ConfigError, kTag, " nvme_path='", path,
               "' is not a folder; set nvme_path to a folder on a fast local disk.");
    VOLT_CHECK(::access(path.c_str(), W_OK | X_OK) == 0, ConfigError, kTag, " nvme_path='", path,
               "' is not writable by this user; fix its permissions or choose another folder.");
  }
}

// DeepSpeed's fp16 loss scaler for precision "16-mixed" (other precisions keep their own
// scaler settings): a static scale when loss_scale > 0, else DeepSpeed's DynamicLossScaler
// (factor 2 up and down, hysteresis, a floor that stops a diverging run).
void DeepSpeedStrategy::configure_loss_scaling() {
  const DeepSpeedStrategyOptions& o = options_;
  VOLT_CHECK(std::isfinite(o.loss_scale()) && o.loss_scale() >= 0, ConfigError, kTag,
             " loss_scale=", o.loss_scale(), " must be >= 0 (0: dynamic loss scaling).");
  VOLT_CHECK(o.initial_scale_power() >= 0 && o.initial_scale_power() <= 127, ConfigError, kTag,
             " initial_scale_power=", o.initial_scale_power(),
             " must be in [0, 127] (the scale 2^power stays within float32's range; DeepSpeed's "
             "default is 16).");
  VOLT_CHECK(o.loss_scale_window() >= 1 && o.hysteresis() >= 1, ConfigError, kTag,
             " loss_scale_window=", o.loss_scale_window(), " and hysteresis=", o.hysteresis(),
             " must be >= 1 (DeepSpeed's defaults are 1000 and 2).");
  const double initial = std::ldexp(1.0, static_cast<int>(o.initial_scale_power()));
  VOLT_CHECK(std::isfinite(o.min_loss_scale()) && o.min_loss_scale() > 0 &&
                 (o.loss_scale() > 0 || o.min_loss_scale() <= initial),
             ConfigError, kTag, " min_loss_scale=", o.min_loss_scale(),
             " must be > 0 and at most the initial scale 2^", o.initial_scale_power(), " = ",
             initial, " (DeepSpeed's default is 1).");
  if (!precision_ || precision_->name() != "16-mixed" || !precision_->scales_loss()) return;
  if (o.loss_scale() > 0) {
    precision_->configure_loss_scaler(
        GradScalerOptions().init_scale(o.loss_scale()).dynamic(false));
    return;
  }
  precision_->configure_loss_scaler(GradScalerOptions()
                                        .init_scale(initial)
                                        .growth_factor(2.0)
                                        .backoff_factor(0.5)
                                        .growth_interval(o.loss_scale_window())
                                        .hysteresis(o.hysteresis())
                                        .consecutive_hysteresis(o.consecutive_hysteresis())
                                        .min_scale(o.min_loss_scale())
                                        .error_at_min_scale(true));
}

DeepSpeedStrategy::~DeepSpeedStrategy() {
  remove_nvme_files();
  engines_.clear();
}

// ------------------------------------------------------------------ NVMe swap folders
// The swap files are scratch: resume always comes from a checkpoint, never from them. Each run
// swaps into its own folder, nvme_path/volt-nvme-<rank 0's pid>-<its clock>/rank<R>/, so that
// two runs (or two ranks on one node) never share a file; teardown removes it. A run that dies
// (SIGKILL, power loss) cannot: each rank holds an flock on rank<R>/owner.lock while its folder
// is in use (the kernel drops it when the process dies), and every run first removes the rank
// folders under nvme_path whose lock it can take. Creating a folder and sweeping are serialized
// by an flock on nvme_path itself, so a sweep never takes a folder being created.

namespace {

// Removes nvme_path/volt-nvme-*/rank*/ folders whose owner.lock no live process holds, then
// their run folders once empty. Best effort: whatever cannot be removed stays.
void remove_stale_swap_folders(const std::string& nvme_path) noexcept {
  std::error_code ec;
  for (const auto& run : fs::directory_iterator(nvme_path, ec)) {
    const std::string name = run.path().filename().string();
    if (name.rfind("volt-nvme-", 0) != 0 || !run.is_directory(ec)) continue;
    for (const auto& rank : fs::directory_iterator(run.path(), ec)) {
      const std::string lock = (rank.path() / "owner.lock").string();
      const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) continue;  // not one of ours, or from before owner locks: left alone
      const bool dead = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
      if (dead) {
        detail::remove_tree(rank.path().string());
        log_info("DeepSpeedStrategy",
                 "removed the NVMe swap folder of a run that died: '" + rank.path().string() + "'");
      }
      ::close(fd);
    }
    ::rmdir(run.path().c_str());  // only when empty
  }
}

}  // namespace

void DeepSpeedStrategy::make_nvme_folder() {
  remove_nvme_files();
  nvme_files_ = 0;
  at::Tensor id = torch::zeros({2}, torch::kLong);
  if (rank() == 0) {
    id[0] = static_cast<int64_t>(::getpid());
    id[1] = static_cast<int64_t>(std::chrono::steady_clock::now().time_since_epoch().count() &
                                 0x7fffffffffffLL);
  }
  if (world_size() > 1) group().broadcast_(id, 0);
  nvme_run_dir_ = options_.nvme_path() + "/volt-nvme-" + std::to_string(id[0].item<int64_t>()) +
                  "-" + std::to_string(id[1].item<int64_t>());
  nvme_rank_dir_ = nvme_run_dir_ + "/rank" + std::to_string(rank());
  // The folder itself is the sweep lock (flock works on directories): nothing is left behind.
  const int sweep_fd = ::open(options_.nvme_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  VOLT_CHECK(sweep_fd >= 0, ConfigError, kTag, " cannot open nvme_path='", options_.nvme_path(),
             "' (", std::strerror(errno), "); set nvme_path to a readable folder.");
  ::flock(sweep_fd, LOCK_EX);  // held for a directory scan and a mkdir: never long
  remove_stale_swap_folders(options_.nvme_path());
  std::error_code ec;
  fs::create_directories(nvme_rank_dir_, ec);
  if (!ec) {
    const std::string lock = nvme_rank_dir_ + "/owner.lock";
    nvme_lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (nvme_lock_fd_ >= 0) ::flock(nvme_lock_fd_, LOCK_EX | LOCK_NB);  // a new file: free
  }
  ::close(sweep_fd);
  VOLT_CHECK(!ec, ConfigError, kTag, " cannot create the NVMe swap folder '", nvme_rank_dir_, "' (",
             ec.message(), "); check that nvme_path is writable and has space.");
  VOLT_CHECK(nvme_lock_fd_ >= 0, ConfigError, kTag, " cannot create '", nvme_rank_dir_,
             "/owner.lock' (", std::strerror(errno), "); check that nvme_path is writable.");
}

void DeepSpeedStrategy::remove_nvme_files() noexcept {
  swappers_.clear();  // each removes its file
  if (nvme_rank_dir_.empty()) return;
  detail::remove_tree(nvme_rank_dir_);
  ::rmdir(nvme_run_dir_.c_str());  // the last rank on this node removes the run's folder
  if (nvme_lock_fd_ >= 0) ::close(nvme_lock_fd_);  // after the folder is gone: no sweep races
  nvme_lock_fd_ = -1;
  nvme_rank_dir_.clear();
  nvme_run_dir_.clear();
}

ZeroMemory DeepSpeedStrategy::memory(const torch::optim::Optimizer& optimizer) const {
  ZeroMemory m = engine_for(optimizer).memory();
  auto it = swappers_.find(&optimizer);
  if (it != swappers_.end()) m.optimizer_state_in_files = it->second->file_bytes();
  return m;
}

void DeepSpeedStrategy::apply_config() {
  config_ = load_deepspeed_config(options_.config());
  const DeepSpeedConfig& c = *config_;
  // The JSON is the whole configuration (DeepSpeed's semantics): no zero_optimization, no ZeRO.
  options_.zero_optimization(c.zero && c.stage > 0).stage(c.stage);
  options_.offload_optimizer(c.offload_optimizer_device != "none");
  if (c.offload_optimizer_device != "none") {
    options_.offload_optimizer_device(c.offload_optimizer_device);
  }
  if (!c.nvme_path.empty()) options_.nvme_path(c.nvme_path);
  if (c.sub_group_size) options_.sub_group_size(*c.sub_group_size);
  if (c.aio_block_size) options_.aio_block_size(*c.aio_block_size);
  if (c.aio_queue_depth) options_.aio_queue_depth(*c.aio_queue_depth);
  if (c.reduce_bucket_size) options_.reduce_bucket_size(*c.reduce_bucket_size);
  if (c.allgather_bucket_size) options_.allgather_bucket_size(*c.allgather_bucket_size);
  if (c.zero_allow_untested_optimizer) {
    options_.zero_allow_untested_optimizer(*c.zero_allow_untested_optimizer);
  }
  clip_ = c.gradient_clipping;
  if (c.fp16) {
    // The JSON's fp16 section is the whole loss-scaling configuration (DeepSpeed's defaults, the
    // options' own, for the keys it leaves out), as Lightning passes its own arguments only
    // without one.
    const DeepSpeedStrategyOptions d;
    options_.loss_scale(c.loss_scale.value_or(d.loss_scale()))
        .initial_scale_power(c.initial_scale_power.value_or(d.initial_scale_power()))
        .loss_scale_window(c.loss_scale_window.value_or(d.loss_scale_window()))
        .hysteresis(c.hysteresis.value_or(d.hysteresis()))
        .consecutive_hysteresis(c.consecutive_hysteresis.value_or(d.consecutive_hysteresis()))
        .min_loss_scale(c.min_loss_scale.value_or(d.min_loss_scale()));
  }
  options_.cpu_checkpointing(c.cpu_checkpointing);
  options_.offload_parameters(c.offload_param_device != "none");
  if (c.offload_param_device != "none") options_.offload_parameters_device(c.offload_param_device);
  if (c.stage3_param_persistence_threshold) {
    options_.param_persistence_threshold(*c.stage3_param_persistence_threshold);
  }
  if (c.stage3_max_live_parameters) options_.max_live_parameters(*c.stage3_max_live_parameters);
  if (c.ignore_unused_parameters) options_.ignore_unused_parameters(*c.ignore_unused_parameters);
  if (c.overlap_comm) options_.overlap_comm(*c.overlap_comm);
  if (c.stage3_prefetch_bucket_size) {
    options_.prefetch_bucket_size(*c.stage3_prefetch_bucket_size);
  }
  // Inference keys: the JSON's values replace the options' where it has them.
  TensorParallelOptions tp = options_.tensor_parallel();
  if (c.tp_size) tp.tp_size(*c.tp_size);
  if (c.tp_num_heads) tp.num_heads(*c.tp_num_heads);
  if (!c.tp_plan.empty()) {
    TpPlan plan;
    for (const auto& kv : c.tp_plan) plan.emplace_back(kv.first, parse_tp_style(kv.second));
    tp.plan(plan);
  }
  if (!c.injection_policy.empty()) tp.injection_policy(c.injection_policy);
  options_.tensor_parallel(tp);
  if (!c.dtype.empty()) options_.dtype(c.dtype);
  if (c.replace_with_kernel_inject)
    options_.replace_with_kernel_inject(*c.replace_with_kernel_inject);
  if (c.enable_cuda_graph) options_.enable_cuda_graph(*c.enable_cuda_graph);
  if (!c.replace_method.empty()) options_.replace_method(c.replace_method);
  const std::string p = precision_->name();
  VOLT_CHECK(!c.bf16 || p == "bf16-mixed" || p == "bf16-true", ConfigError, kTag, " ", c.origin,
             " enables bf16 but the Trainer's precision is \"", p,
             "\"; set precision=\"bf16-mixed\" (or disable bf16 in the JSON).");
  VOLT_CHECK(!c.fp16 || p == "16-mixed", ConfigError, kTag, " ", c.origin,
             " enables fp16 but the Trainer's precision is \"", p,
             "\"; set precision=\"16-mixed\" (or disable fp16 in the JSON).");
  if (!c.ignored.empty()) {
    std::string keys;
    for (const auto& k : c.ignored) keys += (keys.empty() ? "" : ", ") + k;
    log_warning("DeepSpeedStrategy",
                c.origin + ": DeepSpeed keys volt does not act on, ignored: " + keys + ".");
  }
}

void DeepSpeedStrategy::setup_environment() {
  DdpStrategy::setup_environment();
  checkpoint_defaults_.reset();
  if (options_.cpu_checkpointing()) {
    checkpoint_defaults_ =
        std::make_unique<CheckpointDefaultsGuard>(checkpoint_defaults().cpu_checkpointing(true));
  }
  if (!config_) return;
  if (auto b = resolve_deepspeed_batch(*config_, world_size(), loop_.accumulate_grad_batches)) {
    micro_batch_ = b->micro_batch_size;
  }
  VOLT_CHECK(!clip_ || !loop_.gradient_clip_val || *loop_.gradient_clip_val == *clip_, ConfigError,
             kTag, " ", config_->origin, ": gradient_clipping=", *clip_,
             " but the Trainer's gradient_clip_val=",
             loop_.gradient_clip_val ? *loop_.gradient_clip_val : 0.0, "; set one of them.");
}

at::Tensor DeepSpeedStrategy::training_step(Module& module, const Batch& batch, int64_t batch_idx) {
  if (micro_batch_ > 0) {
    VOLT_CHECK(batch.size() == micro_batch_, ConfigError, kTag, " ", config_->origin,
               ": train_micro_batch_size_per_gpu=", micro_batch_,
               " but the training loader's "
               "batches hold ",
               batch.size(), " samples; make them agree.");
    micro_batch_ = 0;  // only the first batch: an epoch's last batch may be smaller
  }
  return Strategy::training_step(module, batch, batch_idx);  // holds training_forward_context
}

std::shared_ptr<void> DeepSpeedStrategy::training_forward_context(Module& module) {
  struct Both {
    std::vector<std::unique_ptr<ZeroEngine::Scope>> zero;
    std::shared_ptr<void> ddp;  // closes first
  };
  auto both = std::make_shared<Both>();
  both->zero = scopes();
  both->ddp = DdpStrategy::training_forward_context(module);
  return both;
}

std::vector<std::unique_ptr<ZeroEngine::Scope>> DeepSpeedStrategy::scopes() {
  std::vector<std::unique_ptr<ZeroEngine::Scope>> out;
  for (auto& kv : engines_) out.push_back(std::make_unique<ZeroEngine::Scope>(*kv.second));
  return out;
}

void DeepSpeedStrategy::validation_step(Module& module, const Batch& batch, int64_t batch_idx) {
  auto open = scopes();
  std::unique_ptr<TensorParallelEngine::Scope> tp;
  if (tp_) tp = std::make_unique<TensorParallelEngine::Scope>(*tp_);
  DdpStrategy::validation_step(module, batch, batch_idx);
}

void DeepSpeedStrategy::test_step(Module& module, const Batch& batch, int64_t batch_idx) {
  auto open = scopes();
  std::unique_ptr<TensorParallelEngine::Scope> tp;
  if (tp_) tp = std::make_unique<TensorParallelEngine::Scope>(*tp_);
  DdpStrategy::test_step(module, batch, batch_idx);
}

at::Tensor DeepSpeedStrategy::predict_step(Module& module, const Batch& batch, int64_t batch_idx) {
  auto open = scopes();
  if (tp_) {
    TensorParallelEngine::Scope tp(*tp_);
    return DdpStrategy::predict_step(module, batch, batch_idx);
  }
  return DdpStrategy::predict_step(module, batch, batch_idx);
}

DataShard DeepSpeedStrategy::data_shard() const {
  DataShard s = DdpStrategy::data_shard();
  if (tp_on()) {
    const int64_t tp = options_.tensor_parallel().tp_size();
    s = DataShard{rank() / tp, std::max<int64_t>(world_size() / tp, 1)};
  }
  // Stage 3's forward gathers the parameters from every data-parallel rank.
  s.lockstep = options_.stage() == 3;
  return s;
}

Batch DeepSpeedStrategy::batch_to_device(const Batch& batch) const {
  Batch b = DdpStrategy::batch_to_device(batch);
  if (options_.dtype() != "bfloat16" && master_casts_.empty()) return b;
  auto cast = [](at::Tensor& t) {
    if (t.defined() && t.is_floating_point()) t = t.to(at::kBFloat16);
  };
  cast(b.input);
  // A combined loader's batch: each part's input (the extra entries `<part>/input`).
  const std::string suffix = "/input";
  for (auto& kv : b.extra) {
    const std::string& k = kv.first;
    if (k.size() > suffix.size() && k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0)
      cast(kv.second);
  }
  return b;
}

void DeepSpeedStrategy::teardown() {
  injection_.reset();  // the original modules back before the layers are gathered
  // After a failed run (the Trainer's error handler, a Fabric destroyed by an exception) the
  // ranks are out of step: a gather would meet another rank's collective of the loop (or wait
  // for it until the timeout). Nothing collective runs; the module keeps its partitions (the
  // last checkpoint has the whole state).
  const bool collectives = !run_failed() || world_size() == 1;
  if (!collectives && (!engines_.empty() || tp_)) {
    log_warning("DeepSpeedStrategy",
                "the run failed, so nothing is gathered: a stage-3 module keeps only this rank's "
                "partition, tensor-parallel layers their slices, bf16 weights their roundings of "
                "the fp32 masters; the last checkpoint has the whole state.");
  }
  if (tp_) {
    try {
      if (collectives) tp_->restore();
    } catch (const std::exception& e) {
      log_error("DeepSpeedStrategy", std::string("could not gather the tensor-parallel slices "
                                                 "at the end of the run (layers stay split): ") +
                                         e.what());
    }
    tp_.reset();
  }
  // NVMe: the optimizer leaves the run with its state in memory, and the swap files go.
  for (auto& kv : swappers_) {
    try {
      kv.second->swap_in_all();
    } catch (const std::exception& e) {
      log_error("DeepSpeedStrategy",
                std::string("could not read the optimizer state back from NVMe at the end of "
                            "the run (it is lost; the last checkpoint has it): ") +
                    e.what());
    }
  }
  // Stage 3: the module leaves the run whole (every rank gathers every parameter; NVMe
  // parameter chunks are read from their files).
  for (auto& kv : engines_) {
    if (!collectives) break;
    try {
      kv.second->restore_parameters();
    } catch (const std::exception& e) {
      log_error("DeepSpeedStrategy", std::string("could not gather the partitioned parameters "
                                                 "at the end of the run (they hold NaN): ") +
                                         e.what());
    }
  }
  remove_nvme_files();
  if (cast_back_) {
    if (cast_module_ != nullptr) cast_module_->to(*cast_back_);
    cast_module_ = nullptr;
    cast_back_.reset();
  }
  // After a failed run a stage-3 module keeps its partition, which cannot be converted (its
  // parameters are read only inside a step): it stays bf16, as the warning above says.
  const bool convertible = collectives || !partitions_parameters();
  for (auto& [module, dtype] : master_casts_) {
    if (convertible) module->to(dtype);
    if (!collectives) continue;
    // bf16-mixed: the module gets the fp32 masters, not their bf16 roundings.
    for (ZeroEngine* e : engines_of(*module)) {
      try {
        e->write_master_weights();
      } catch (const std::exception& err) {
        log_error("DeepSpeedStrategy",
                  std::string("could not gather the fp32 master weights at the end of the "
                              "run (the module keeps their bf16 roundings): ") +
                      err.what());
      }
    }
  }
  master_casts_.clear();
  modules_.clear();  // the next setup_module starts a new run
  checkpoint_defaults_.reset();
  DdpStrategy::teardown();
}

ZeroEngine* DeepSpeedStrategy::Engines::find(const void* key) const {
  for (const auto& item : items_) {
    if (item.first == key) return item.second.get();
  }
  return nullptr;
}

void DeepSpeedStrategy::Engines::put(const void* key, std::unique_ptr<ZeroEngine> engine) {
  erase(key);
  items_.emplace_back(key, std::move(engine));
}

void DeepSpeedStrategy::Engines::erase(const void* key) {
  items_.erase(std::remove_if(items_.begin(), items_.end(),
                              [key](const Item& item) { return item.first == key; }),
               items_.end());
}

std::vector<ZeroEngine*> DeepSpeedStrategy::engines_of(const Module& module) const {
  std::vector<ZeroEngine*> out;
  for (const auto& kv : engines_) {
    auto it = owners_.find(kv.first);
    if (it != owners_.end() && it->second == &module) out.push_back(kv.second.get());
  }
  return out;
}

ZeroEngine* DeepSpeedStrategy::engine(const torch::optim::Optimizer& optimizer) const {
  return engines_.find(&optimizer);
}

ZeroEngine& DeepSpeedStrategy::engine_for(const torch::optim::Optimizer& optimizer) const {
  ZeroEngine* e = engine(optimizer);
  VOLT_CHECK(e != nullptr, ConfigError, kTag,
             " this optimizer was not set up by the strategy; step only the optimizers "
             "configure_optimizers returned.");
  return *e;
}

void DeepSpeedStrategy::set_sync_batchnorm(bool on) {
  VOLT_CHECK(!on, ConfigError,
             "[DeepSpeedStrategy] sync_batchnorm is not supported with ZeRO (its stage-3 "
             "parameter gathering and BatchNorm's synchronisation would meet at the same "
             "dispatcher hook); train BatchNorm models with strategy=\"ddp\", or drop "
             "sync_batchnorm.");
}

void DeepSpeedStrategy::check_accumulation_change(int64_t accumulate_grad_batches) const {
  VOLT_CHECK(accumulate_grad_batches == loop_.accumulate_grad_batches, ConfigError,
             "[DeepSpeedStrategy] the gradient accumulation factor cannot change during fit (",
             loop_.accumulate_grad_batches, " -> ", accumulate_grad_batches,
             "): DeepSpeed's batch arithmetic (train_batch_size = micro batch x accumulation x "
             "processes) fixes it, as in Lightning; drop the GradientAccumulationScheduler and "
             "set accumulate_grad_batches, or train with strategy=\"ddp\".");
}

void DeepSpeedStrategy::trainable_parameters_changed(Module& module) {
  int64_t now = 0;
  for (const auto& p : module.parameters(true)) now += p.requires_grad() ? 1 : 0;
  throw ConfigError(
      "[DeepSpeedStrategy] the parameters that require a gradient changed during fit (now " +
      std::to_string(now) +
      " tensors; a callback such as BackboneFinetuning froze or unfroze layers), but ZeRO "
      "partitions the trainable parameters and their optimizer state once, when fit starts. "
      "Use strategy \"ddp\" for this fit, or train each phase in a fit of its own with the "
      "layers frozen before it starts.");
}

void DeepSpeedStrategy::setup_module(Module& module) {
  // The first module of a run (or one set up again) starts afresh; a Fabric loop's further
  // modules join the run's (each with its own engines).
  const bool again = std::find(modules_.begin(), modules_.end(), &module) != modules_.end();
  if (modules_.empty() || again) {
    modules_.clear();
    engines_.clear();
    owners_.clear();
    names_.clear();
    tp_.reset();
    injection_.reset();
  }
  VOLT_CHECK(modules_.empty() || !inference_only(), ConfigError, kTag,
             " a second module under DeepSpeed inference settings (tensor_parallel, dtype, "
             "replace_with_kernel_inject) that split or convert one model; put the models in "
             "one module.");
  modules_.push_back(&module);
  if (inference_only()) {
    // Inference: every rank starts from rank 0's weights, then keeps its slice of each split
    // layer. No reducer: nothing is trained.
    Strategy::setup_module(module);
    broadcast_module_state(module);
    if (options_.dtype() == "bfloat16") {
      for (const auto& p : module.parameters()) {
        if (p.is_floating_point()) {
          cast_back_ = p.scalar_type();
          break;
        }
      }
      module.to(at::kBFloat16);
      cast_module_ = &module;
    }
    if (tp_on()) {
      const int64_t tp = options_.tensor_parallel().tp_size(), world = world_size();
      VOLT_CHECK(tp <= world, ConfigError, kTag, " tensor_parallel.tp_size=", tp,
                 " is larger than the world (", world, " processes); use at most ", world,
                 " or start more processes.");
      VOLT_CHECK(world % tp == 0, ConfigError, kTag, " the world (", world,
                 " processes) is not a multiple of tensor_parallel.tp_size=", tp,
                 "; every tensor-parallel group needs tp_size ranks.");
      std::shared_ptr<ProcessGroup> tp_group = group_;
      if (tp < world) {
        // Consecutive ranks form a group (on one node when devices is a multiple of tp_size);
        // the groups are data-parallel replicas reading different batches (data_shard()).
        std::vector<int64_t> ranks;
        for (int64_t r = rank() / tp * tp; r < rank() / tp * tp + tp; ++r) ranks.push_back(r);
        tp_group = group().new_group(ranks, "tp" + std::to_string(++tp_groups_made_));
      }
      tp_ = std::make_unique<TensorParallelEngine>(module, tp_group, options_.tensor_parallel());
      log_info("DeepSpeedStrategy",
               "tensor parallel over " + std::to_string(world_size()) +
                   " ranks: " + std::to_string(tp_->layers().size()) +
                   " layers split, parameters " + std::to_string(tp_->parameter_bytes()) + " of " +
                   std::to_string(tp_->full_parameter_bytes()) + " bytes on this rank.");
    }
    if (options_.replace_with_kernel_inject()) {
      // After the split: the fused modules hold the same (now sliced) parameter tensors.
      injection_ = std::make_unique<KernelInjection>(module);
      std::string what;
      for (const auto& r : injection_->replaced()) what += (what.empty() ? "" : ", ") + r;
      if (what.empty()) {
        log_warning("DeepSpeedStrategy",
                    "replace_with_kernel_inject found no block it knows (Sequential entries: "
                    "Linear followed by ReLU/GELU/SiLU, TransformerEncoderLayer); the model "
                    "runs unchanged.");
      } else {
        log_info("DeepSpeedStrategy", "kernel injection: " + what);
      }
    }
    return;
  }
  if (!zero_on()) {
    DdpStrategy::setup_module(module);
    return;
  }
  Strategy::setup_module(module);
  broadcast_module_state(module);
  auto& names = names_[&module];
  names.clear();
  for (const auto& p : module.named_parameters(true)) {
    names.emplace(p.value().unsafeGetTensorImpl(), p.key());
  }
  // validate / test / predict (or a Fabric module without optimizers): no optimizer will come,
  // so stage 3 partitions the weights now.
  if (!loop_.fitting && options_.stage() == 3) setup_inference_engine(module);
}

void DeepSpeedStrategy::setup_inference_engine(Module& module) {
  // This module's engine from an earlier call goes.
  engines_.erase(&module);
  owners_.erase(&module);
  const bool offload_to_host = options_.offload_parameters() && accelerator_->name() != "cpu";
  if (world_size() == 1 && !nvme_parameters() && !offload_to_host) {
    log_info("DeepSpeedStrategy",
             "stage 3 at one rank without an optimizer: the weights stay whole (partitioning "
             "them would only add a copy); offload_parameters to \"nvme\" streams them from "
             "files.");
    return;
  }
  // One dtype per engine: the weights in the first floating-point parameter's dtype are
  // partitioned, any other stays whole (as do non-contiguous ones).
  std::vector<at::Tensor> params;
  int64_t whole = 0;
  c10::optional<at::ScalarType> dtype;
  for (const auto& p : distinct_parameters(module)) {
    if (!p.is_floating_point()) continue;
    if (!dtype) dtype = p.scalar_type();
    if (p.scalar_type() == *dtype && p.is_contiguous() && !p.is_sparse()) {
      params.push_back(p);
    } else {
      ++whole;
    }
  }
  if (params.empty()) return;
  if (whole > 0) {
    log_info("DeepSpeedStrategy", std::to_string(whole) + " parameter(s) in another dtype than " +
                                      c10::toString(*dtype) + " or not contiguous stay whole.");
  }
  if (nvme_parameters() && nvme_rank_dir_.empty()) make_nvme_folder();
  auto engine = std::make_unique<ZeroEngine>(
      params, group_, engine_options().stage(3).offload_parameters(offload_to_host),
      names_[&module]);
  ++nvme_files_;
  const ZeroMemory m = engine->memory();
  int64_t full = 0;
  for (const auto& c : engine->chunks()) full += c.numel * c.parameter.element_size();
  log_info("DeepSpeedStrategy",
           "ZeRO-Inference (stage 3 without an optimizer): parameters " +
               std::to_string(m.parameters) + " bytes in memory" +
               (m.parameters_in_files > 0 ? " and " + std::to_string(m.parameters_in_files) +
                                                " in '" + nvme_rank_dir_ + "'"
                                          : std::string()) +
               " of " + std::to_string(full) +
               " on this rank; each module's weights are gathered while it runs.");
  engines_.put(&module, std::move(engine));
  owners_[&module] = &module;
}

ZeroEngineOptions DeepSpeedStrategy::engine_options() const {
  return ZeroEngineOptions()
      .stage(options_.stage())
      .reduce_bucket_size(options_.reduce_bucket_size())
      .allgather_bucket_size(options_.allgather_bucket_size())
      .param_persistence_threshold(options_.param_persistence_threshold())
      .max_live_parameters(options_.max_live_parameters())
      .master_weights(options_.master_weights())
      .ignore_unused_parameters(options_.ignore_unused_parameters())
      .overlap_comm(options_.overlap_comm())
      .prefetch_bucket_size(options_.prefetch_bucket_size())
      .param_swap_file(nvme_parameters()
                           ? nvme_rank_dir_ + "/parameters" + std::to_string(nvme_files_) + ".swp"
                           : "")
      .aio_block_size(options_.aio_block_size())
      .aio_queue_depth(options_.aio_queue_depth())
      .aio_use_uring(options_.aio_use_uring());
}

ZeroEngine* DeepSpeedStrategy::inference_engine(const Module& module) const {
  return engines_.find(&module);
}

void DeepSpeedStrategy::setup_optimizers(Module& module, std::vector<OptimizerConfig>& optimizers) {
  // A Fabric module set up without optimizers (setup_module partitioned it for inference).
  if (!loop_.fitting && optimizers.empty()) return;
  VOLT_CHECK(!inference_only(), NotAvailable, kTag,
             " tensor_parallel (tp_size=", options_.tensor_parallel().tp_size(), "), dtype=\"",
             options_.dtype(),
             "\" and replace_with_kernel_inject=", options_.replace_with_kernel_inject(),
             " are DeepSpeed inference settings: use them with predict, validate or test; "
             "train with tp_size 1, dtype \"float32\", no kernel injection, and "
             "precision=\"bf16-mixed\" for bf16; to train tensor-parallel use strategy "
             "\"model_parallel\" (tensor_parallel_size, tp_plan / injection_policy).");
  if (config_) {
    // configure_optimizers wins over the JSON (the reference's note), item by item.
    if (optimizers.empty()) {
      std::vector<at::Tensor> params;
      for (const auto& p : distinct_parameters(module)) {
        if (p.requires_grad()) params.push_back(p);
      }
      auto opt = make_deepspeed_optimizer(*config_, params);
      VOLT_CHECK(opt != nullptr, ConfigError, kTag,
                 " configure_optimizers() returned no optimizer and ", config_->origin,
                 " names none; return one or add an \"optimizer\" section.");
      optimizers.emplace_back(opt);
    } else if (!config_->optimizer_type.empty()) {
      log_info("DeepSpeedStrategy",
               "the optimizer from configure_optimizers() is used; the "
               "JSON's \"" +
                   config_->optimizer_type + "\" is ignored.");
    }
    if (!config_->scheduler_type.empty()) {
      OptimizerConfig& first = optimizers.front();
      if (first.scheduler()) {
        log_info("DeepSpeedStrategy",
                 "the LR scheduler from configure_optimizers() is used; the "
                 "JSON's \"" +
                     config_->scheduler_type + "\" is ignored.");
      } else {
        // DeepSpeed steps its scheduler after every optimizer step.
        first.scheduler(make_deepspeed_scheduler(*config_, *first.optimizer()))
            .interval(Interval::kStep)
            .frequency(1);
      }
    }
  }
  if (!zero_on()) return;
  // Loss scaling ("16-mixed", or any precision with a GradScaler): each rank unscales and checks
  // only its chunks, and the ranks agree on the finding before the step (optimizer_step). The
  // scaler updates once per step, so the NVMe paths, which step sub-group by sub-group, refuse.
  VOLT_CHECK(!precision_->scales_loss() || !(nvme_optimizer() || nvme_parameters()), NotAvailable,
             kTag, " precision \"", precision_->name(),
             "\" scales the loss (dynamic loss scaling), which is not built with NVMe offload yet "
             "(the step runs sub-group by sub-group there); offload to \"cpu\", or use "
             "\"bf16-mixed\" without loss scaling.");
  const bool cast_already =
      std::any_of(master_casts_.begin(), master_casts_.end(),
                  [&](const std::pair<Module*, at::ScalarType>& c) { return c.first == &module; });
  if (options_.master_weights() && precision_->name() == "bf16-mixed" && !cast_already) {
    // DeepSpeed's bf16 mode (Lightning casts the module for it): bf16 weights and gradients,
    // fp32 masters in the engines; teardown writes the masters back in the module's dtype.
    for (const auto& p : module.parameters()) {
      if (!p.is_floating_point()) continue;
      if (p.scalar_type() != at::kBFloat16) {
        master_casts_.emplace_back(&module, p.scalar_type());
        module.to(at::kBFloat16);
      }
      break;
    }
  }
  // ZeRO-Offload on an accelerator: the engine keeps pinned host copies of its chunks (fp32
  // masters for 16-bit parameters) that the optimizer steps on the CPU, so the optimizer state
  // is made in host memory too. On a CPU run everything is in host memory already.
  const bool offload_to_host = options_.offload_optimizer() && accelerator_->name() != "cpu";
  if (!offload_to_host && ((options_.offload_optimizer() && !nvme_optimizer()) ||
                           (options_.offload_parameters() && !nvme_parameters()))) {
    log_info("DeepSpeedStrategy",
             "offload_optimizer / offload_parameters: on a CPU run the parameters, gradients and "
             "optimizer state are in host memory already; nothing moves.");
  }
  // Stage 3 at one rank: this rank's chunks are the whole parameters, so partitioning would keep
  // a second full copy in the same memory and regather each module on every read. It saves
  // memory only when the chunks live elsewhere (offload_parameters from an accelerator to host
  // memory, or to NVMe); otherwise the parameters stay whole (stage 3 then runs like stage 2,
  // and checkpoints hold whole weights, which load at any world size).
  const bool parameters_to_host = offload_to_host && options_.offload_parameters();
  const bool whole_at_one_rank =
      options_.stage() == 3 && world_size() == 1 && !nvme_parameters() && !parameters_to_host;
  if (whole_at_one_rank) {
    log_info("DeepSpeedStrategy",
             "stage 3 at one rank: the parameters stay whole (partitioning them would only add a "
             "copy); offload_parameters to \"cpu\" (on an accelerator) or \"nvme\" partitions "
             "them.");
  }
  // This module's engines from an earlier call go (the other modules' stay).
  for (auto it = owners_.begin(); it != owners_.end();) {
    if (it->second != &module) {
      ++it;
      continue;
    }
    engines_.erase(it->first);
    swappers_.erase(static_cast<const torch::optim::Optimizer*>(it->first));
    it = owners_.erase(it);
  }
  if ((nvme_optimizer() || nvme_parameters()) && nvme_rank_dir_.empty()) make_nvme_folder();
  const int64_t first_file = nvme_files_;
  for (auto& config : optimizers) {
    auto& opt = *config.optimizer();
    if (!tested_optimizer(opt)) {
      VOLT_CHECK(options_.zero_allow_untested_optimizer(), ConfigError, kTag, " optimizer '",
                 typeid(opt).name(),
                 "' is untested with ZeRO; set zero_allow_untested_optimizer=true if its step "
                 "acts on each element independently, or use SGD, Adam, AdamW, RMSprop, Adagrad, "
                 "FusedSGD or FusedAdamW.");
      warn_once("zero_untested_optimizer", "DeepSpeedStrategy",
                "optimizer '" + std::string(typeid(opt).name()) +
                    "' is untested with ZeRO: the partitioned step equals "
                    "the unpartitioned one only for elementwise updates.");
    }
    ZeroEngineOptions o = engine_options();
    if (whole_at_one_rank) o.param_persistence_threshold(std::numeric_limits<int64_t>::max());
    engines_.put(&opt,
                 std::make_unique<ZeroEngine>(
                     opt, group_,
                     o.offload_optimizer(offload_to_host).offload_parameters(parameters_to_host),
                     names_[&module]));
    owners_[&opt] = &module;
    ++nvme_files_;
  }
  if (nvme_parameters()) {
    log_info(
        "DeepSpeedStrategy",
        "offload_parameters to nvme: stage 3's parameter chunks swap to '" + nvme_rank_dir_ + "'.");
  }
  if (nvme_optimizer()) {
    int64_t i = first_file;
    for (auto& config : optimizers) {
      auto& opt = *config.optimizer();
      // The fp32 masters (bf16 runs) swap with their state, as DeepSpeed's swapper does.
      const ZeroEngine* e = engine(opt);
      swappers_[&opt] = std::make_unique<detail::OptimizerSwapper>(
          opt, nvme_rank_dir_ + "/optimizer" + std::to_string(i++) + ".swp",
          detail::AioOptions()
              .block_size(options_.aio_block_size())
              .queue_depth(options_.aio_queue_depth())
              .use_uring(options_.aio_use_uring()),
          options_.sub_group_size(), /*swap_parameters=*/e != nullptr && e->has_master_weights());
    }
    log_info("DeepSpeedStrategy", "offload_optimizer to nvme: optimizer state swaps to '" +
                                      nvme_rank_dir_ + "' (sub_group_size " +
                                      std::to_string(options_.sub_group_size()) + ").");
  }
}

void DeepSpeedStrategy::backward(const at::Tensor& loss, Module& module, bool sync_gradients) {
  backward_through(loss, {{&module, sync_gradients}});
}

void DeepSpeedStrategy::backward_through(const at::Tensor& loss,
                                         const std::vector<Reached>& modules) {
  if (engines_.empty()) {
    DdpStrategy::backward_through(loss, modules);
    return;
  }
  // The reached modules' engines, each arming its hooks around the next one's; the innermost
  // runs the backward. A module without engines (set up without an optimizer) has nothing to
  // reduce.
  std::vector<std::pair<ZeroEngine*, bool>> chain;
  for (const Reached& r : modules) {
    for (ZeroEngine* e : engines_of(*r.module)) {
      // A ZeRO-Inference engine (a module set up without optimizers) reduces nothing.
      if (e->trains()) chain.emplace_back(e, r.sync_gradients);
    }
  }
  auto open = scopes();
  Module* hook = modules.empty() ? nullptr : modules.front().module;
  std::function<void(size_t)> run = [&](size_t i) {
    if (i == chain.size()) {
      precision_->backward(loss, hook);
      return;
    }
    chain[i].first->backward([&] { run(i + 1); }, chain[i].second);
  };
  run(0);
  agree_on_precision_state();
}

bool DeepSpeedStrategy::optimizer_step(torch::optim::Optimizer& optimizer,
                                       c10::optional<double> clip_value, ClipAlgorithm algorithm,
                                       const ClipCall& clip) {
  // The set-up checked that the values agree (the Trainer's algorithm reaches the strategy only
  // here, before anything of the step ran); DeepSpeed's gradient_clipping is a norm clip.
  VOLT_CHECK(!clip_ || !clip_value || algorithm == ClipAlgorithm::kNorm, ConfigError, kTag, " ",
             config_->origin, ": gradient_clipping=", *clip_,
             " clips the gradients' norm but the Trainer clips by value "
             "(gradient_clip_algorithm=value); drop the Trainer's gradient_clip_val, or the "
             "JSON's gradient_clipping.");
  ZeroEngine* e = engine(optimizer);
  auto sw = swappers_.find(&optimizer);
  const bool swapped_state = sw != swappers_.end();
  // Master weights: fp32 gradients for clip and step. NVMe parameters come in sub-group by
  // sub-group (with their state when that is on NVMe too) instead of the whole shard at once.
  const bool by_sub_group = swapped_state || (e != nullptr && nvme_parameters());
  if (e != nullptr) e->prepare_step(by_sub_group);
  if (!clip_value && clip_) {
    clip_value = clip_;  // the JSON's gradient_clipping: a norm, as in DeepSpeed
    algorithm = ClipAlgorithm::kNorm;
  }
  bool stepped;
  if (e == nullptr && !by_sub_group) {
    stepped = Strategy::optimizer_step(optimizer, clip_value, algorithm, clip);
  } else {
    // Strategy::optimizer_step's sequence, with the ranks agreeing on inf/NaN gradients between
    // the unscale and the step (each one checked only its own chunks, and a rank that skipped
    // the step while the others gathered would break the collectives), and with the step run
    // once per sub-group when state or parameters swap (its state swapped in when on NVMe).
    detail::unscale_agreeing_on_found_inf(*precision_, *group_, optimizer);
    clip_for_step(optimizer, clip_value, algorithm, clip);
    if (!by_sub_group) {
      stepped = precision_->optimizer_step(optimizer);
    } else {
      detail::SubGroupHooks hooks;
      if (e != nullptr) {
        hooks.read = [e](const std::vector<at::Tensor>& g) { e->read_step_chunks(g); };
        hooks.ready = [e](const std::vector<at::Tensor>&) { e->hold_step_chunks(); };
        hooks.after = [e](const std::vector<at::Tensor>& g) {
          e->round_masters(g);
          e->write_step_chunks(g);
        };
      }
      const auto step = [&] { return precision_->optimizer_step(optimizer); };
      try {
        stepped = swapped_state ? sw->second->step(step, hooks)
                                : detail::step_by_sub_groups(optimizer, options_.sub_group_size(),
                                                             step, hooks);
      } catch (...) {
        // Nothing held stays pointed at a buffer; the step's own error is the one reported.
        try {
          if (e != nullptr) e->finish_step_chunks();
        } catch (const std::exception& cleanup) {
          log_error("DeepSpeedStrategy",
                    std::string("after a failed optimizer step, writing the parameter chunks "
                                "back failed too: ") +
                        cleanup.what());
        }
        throw;
      }
    }
  }
  if (e != nullptr && stepped) e->gather_parameters();
  if (e != nullptr) e->end_window();
  return stepped;
}

at::Tensor DeepSpeedStrategy::clip_gradients(torch::optim::Optimizer& optimizer, double value,
                                             ClipAlgorithm algorithm) {
  ZeroEngine* e = engine(optimizer);
  // The norm spans every rank's chunks (the engine reduces it on the host); clipping by value
  // is elementwise.
  if (e != nullptr && algorithm == ClipAlgorithm::kNorm) {
    return at::scalar_tensor(e->clip_grad_norm(value, 2.0), at::TensorOptions().dtype(at::kDouble));
  }
  return Strategy::clip_gradients(optimizer, value, algorithm);
}

void DeepSpeedStrategy::zero_grad(torch::optim::Optimizer& optimizer) {
  if (ZeroEngine* e = engine(optimizer)) {
    e->zero_grad();
  } else {
    DdpStrategy::zero_grad(optimizer);
  }
}

// ------------------------------------------------------------------ model state (stage 3)
// Stage 3 keeps no whole copy of a partitioned parameter: each rank writes its chunk under the
// parameter's name and the full shapes under kStage3Shapes; consolidation concatenates them.

constexpr const char* kStage3Shapes = "__zero_stage3__";

const ZeroChunk* DeepSpeedStrategy::chunk_of(const c10::TensorImpl* impl) const {
  for (const auto& kv : engines_) {
    for (const auto& c : kv.second->chunks()) {
      if (c.partitioned && c.parameter.unsafeGetTensorImpl() == impl) return &c;
    }
  }
  return nullptr;
}

bool DeepSpeedStrategy::partitions_parameters() const {
  for (const auto& kv : engines_) {
    for (const auto& c : kv.second->chunks()) {
      if (c.partitioned) return true;
    }
  }
  return false;
}

void DeepSpeedStrategy::save_model_state(const Module& module, OutputArchive& ar) const {
  if (!partitions_parameters()) {
    Strategy::save_model_state(module, ar);
    return;
  }
  OutputArchive shapes;
  const auto in_memory = resident();  // NVMe parameter chunks, read in for the save
  for (const auto& p : module.named_parameters(true)) {
    if (const ZeroChunk* c = chunk_of(p.value().unsafeGetTensorImpl())) {
      ar.write(p.key(), c->length > 0
                            ? c->view.clone()
                            : torch::empty({0}, c->parameter.options().requires_grad(false)));
      shapes.write(p.key(), torch::tensor(p.value().sizes().vec(), torch::kLong));
    } else {
      ar.write(p.key(), p.value());
    }
  }
  for (const auto& b : module.named_buffers(true)) ar.write(b.key(), b.value(), /*is_buffer=*/true);
  ar.write(kStage3Shapes, shapes);
}

void DeepSpeedStrategy::load_model_state(Module& module, InputArchive& ar, bool strict) const {
  if (tp_) {
    // Checkpoints hold whole weights: gather, load, split again (every rank loads the same).
    tp_->restore();
    Strategy::load_model_state(module, ar, strict);
    tp_->reshard();
    return;
  }
  if (!partitions_parameters()) {
    Strategy::load_model_state(module, ar, strict);
    load_master_weights(module, ar, /*chunks=*/false);
    return;
  }
  // This rank's chunks (a stage-3 folder at this world size) or whole tensors (anything else).
  InputArchive shapes;
  const bool chunks = ar.try_read(kStage3Shapes, shapes);
  torch::NoGradGuard no_grad;
  const auto in_memory = resident();  // NVMe parameter chunks: loaded, then written out
  std::vector<std::string> problems;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // made once everything matched
  detail::Fp8StateCrossing fp8(ar.keys(), module);        // a plain checkpoint into an fp8 model
  auto load = [&](const std::string& name, at::Tensor target, bool buffer) {
    at::Tensor saved;
    if (!ar.try_read(name, saved, buffer)) {
      if (!fp8.skip_missing(name)) problems.push_back("missing '" + name + "'");
      return;
    }
    if (const ZeroChunk* c = buffer ? nullptr : chunk_of(target.unsafeGetTensorImpl())) {
      if (c->length == 0) return;
      // A chunk (this rank's of a stage-3 shard) or the whole tensor: weights that were frozen
      // in training are whole in a shard that ZeRO-Inference reads, and partitioned here.
      const bool whole = saved.numel() == c->numel;
      const at::Tensor mine =
          whole ? saved.reshape({-1}).narrow(0, c->start, c->length) : saved.reshape({-1});
      if (mine.numel() != c->length || (!chunks && !whole)) {
        problems.push_back("size of '" + name + "'");
        return;
      }
      copies.emplace_back(c->view, mine);
      return;
    }
    if (!saved.sizes().equals(target.sizes())) {
      problems.push_back("shape of '" + name + "'");
      return;
    }
    copies.emplace_back(target, saved);
  };
  for (auto& p : module.named_parameters(true)) load(p.key(), p.value(), false);
  for (auto& b : module.named_buffers(true)) load(b.key(), b.value(), true);
  fp8.log("DeepSpeed");
  if (strict && !problems.empty()) {
    auto os = detail::c_stream<std::ostringstream>();
    os << kTag << " the checkpoint does not match the model: ";
    for (size_t i = 0; i < problems.size(); ++i) os << (i ? "; " : "") << problems[i];
    os << ". Load a checkpoint written by the same model.";
    throw CheckpointError(os.str());
  }
  for (auto& [target, saved] : copies) target.copy_(saved);
  load_master_weights(module, ar, chunks);
}

std::vector<std::unique_ptr<ZeroEngine::Resident>> DeepSpeedStrategy::resident() const {
  std::vector<std::unique_ptr<ZeroEngine::Resident>> out;
  for (auto& kv : engines_) out.push_back(std::make_unique<ZeroEngine::Resident>(*kv.second));
  return out;
}

void DeepSpeedStrategy::load_master_weights(const Module& module, InputArchive& ar,
                                            bool chunks) const {
  const auto in_memory = resident();
  for (const auto& kv : swappers_) kv.second->swap_in_all();  // NVMe: the masters come back
  // The masters start from the checkpoint's weights at the precision it holds them in (fp32
  // from a consolidated or fp32 checkpoint); a shard's optimizer state then sets them exactly.
  torch::NoGradGuard no_grad;
  for (const ZeroEngine* e : engines_of(module)) {  // names are the module's own
    for (const auto& c : e->chunks()) {
      if (!c.master.defined()) continue;
      at::Tensor saved;
      if (!ar.try_read(c.name, saved)) {
        c.master.copy_(c.view);
      } else if (chunks && c.partitioned && saved.numel() != c.numel) {
        c.master.copy_(saved.reshape({-1}));  // this rank's chunk
      } else {
        // The whole tensor: a consolidated checkpoint's, or a shard's weight that was whole
        // there (kept whole by a persistence threshold, or frozen) and is partitioned now, as
        // load_model_state reads it (the whole copied into the chunk failed on its size).
        c.master.copy_(saved.reshape({-1}).narrow(0, c.start, c.length));
      }
    }
  }
}

// ------------------------------------------------------------------ optimizer state

void DeepSpeedStrategy::save_optimizer_state(const torch::optim::Optimizer& optimizer,
                                             const Module& module, OutputArchive& ar) const {
  const ZeroEngine* e = engine(optimizer);
  if (e == nullptr) {
    Strategy::save_optimizer_state(optimizer, module, ar);
    return;
  }
  // NVMe: the state is read in for the save and written out again after it.
  auto sw = swappers_.find(&optimizer);
  detail::OptimizerSwapper* swapper = sw == swappers_.end() ? nullptr : sw->second.get();
  if (swapper != nullptr) swapper->swap_in_all();
  // The full format of volt::save_optimizer_state, with this rank's chunks as the tensors.
  ar.write("zero_world_size", c10::IValue(e->world_size()));
  ar.write("zero_rank", c10::IValue(e->rank()));
  // Each parameter's whole shape, so consolidation needs no state dict beside the shards.
  OutputArchive shapes;
  for (const auto& c : e->chunks()) {
    shapes.write(c.name, torch::tensor(c.parameter.sizes().vec(), torch::kLong));
  }
  ar.write("zero_shapes", shapes);
  const auto& groups = optimizer.param_groups();
  ar.write("num_groups", c10::IValue(static_cast<int64_t>(groups.size())));
  const auto& state = optimizer.state();
  for (size_t g = 0; g < groups.size(); ++g) {
    OutputArchive group_ar, options_ar, states_ar;
    groups[g].options().serialize(options_ar);
    group_ar.write("options", options_ar);
    c10::List<std::string> names;
    for (const auto& c : e->chunks()) {
      if (c.group != static_cast<int64_t>(g)) continue;
      names.push_back(c.name);
      if (c.length == 0) continue;
      auto it = state.find(detail::state_key_for<detail::OptimizerStateKey>(c.stepped()));
      // The fp32 master is state the optimizer steps, like its moments (a 1-D chunk); it is
      // saved also for an optimizer that keeps none of its own (SGD without momentum), whose
      // masters were lost (DeepSpeed saves them apart from the optimizer's state).
      if (it == state.end() && !c.master.defined()) continue;
      OutputArchive one;
      if (it != state.end()) it->second->serialize(one);
      if (c.master.defined()) one.write(kMasterKey, c.master.clone());
      states_ar.write(c.name, one);
    }
    group_ar.write("params", c10::IValue(names));
    group_ar.write("state", states_ar);
    ar.write("group_" + std::to_string(g), group_ar);
  }
  // The archive refers to the state tensors until it is written: they stay in memory until the
  // next step swaps them out again, sub-group by sub-group.
  (void)swapper;
}

void DeepSpeedStrategy::load_optimizer_state(torch::optim::Optimizer& optimizer,
                                             const Module& module, InputArchive& ar) const {
  ZeroEngine* e = engine(optimizer);
  if (e == nullptr) {
    Strategy::load_optimizer_state(optimizer, module, ar);
    return;
  }
  // NVMe: swapped masters come back before the checkpoint's values are copied into them (the
  // loaded state is written out afresh below).
  auto swapped = swappers_.find(&optimizer);
  if (swapped != swappers_.end()) swapped->second->swap_in_all();
  // Either this rank's own shard (same world size), or the full state of a consolidated, DDP or
  // one-process checkpoint, from which this rank takes its chunks.
  c10::IValue world;
  const bool shard = ar.try_read("zero_world_size", world);
  if (shard) {
    VOLT_CHECK(world.toInt() == e->world_size() &&
                   read_value(ar, "zero_rank", "the optimizer shard").toInt() == e->rank(),
               CheckpointError, kTag, " the optimizer shard was written by rank ",
               read_value(ar, "zero_rank", "the optimizer shard").toInt(), " of ", world.toInt(),
               " but this is rank ", e->rank(), " of ", e->world_size(),
               "; load the folder with DeepSpeedStrategy::load_checkpoint (it consolidates).");
  }
  auto& groups = optimizer.param_groups();
  const int64_t num_groups = read_value(ar, "num_groups", "the optimizer state").toInt();
  VOLT_CHECK(num_groups == static_cast<int64_t>(groups.size()), CheckpointError, kTag,
             " the checkpoint's optimizer has ", num_groups,
             " param groups but configure_"
             "optimizers built ",
             groups.size(), "; resume with the same optimizer setup.");
  auto& state = optimizer.state();
  for (size_t g = 0; g < groups.size(); ++g) {
    InputArchive group_ar = read_sub(ar, "group_" + std::to_string(g), "the optimizer state");
    InputArchive options_ar = read_sub(group_ar, "options", "an optimizer group");
    groups[g].options().serialize(options_ar);
    InputArchive states_ar = read_sub(group_ar, "state", "an optimizer group");
    for (const auto& c : e->chunks()) {
      if (c.group != static_cast<int64_t>(g) || c.length == 0) continue;
      // The checkpoint's state replaces the optimizer's, as torch's load_state_dict does: a
      // chunk it has none for (never stepped when it was written) starts afresh, not from the
      // moments of steps taken since.
      state.erase(detail::state_key_for<detail::OptimizerStateKey>(c.stepped()));
      InputArchive one;
      if (!states_ar.try_read(c.name, one)) continue;  // never stepped
      Entries entries = entries_of(one);
      for (auto& [key, v] : entries) {
        if (!v.isTensor()) continue;
        const at::Tensor t = v.toTensor();
        // Per-element state has the parameter's shape (full) or is this rank's 1-D chunk;
        // anything else (a 0-dim step count) is per-parameter and kept as it is.
        if (shard) {
          VOLT_CHECK(t.dim() != 1 || t.numel() == c.length, CheckpointError, kTag,
                     " optimizer state '", key, "' of '", c.name, "' holds ", t.numel(),
                     " elements but this rank's chunk has ", c.length,
                     "; resume with the same model.");
        } else if (t.sizes().equals(c.parameter.sizes())) {
          v = t.reshape({-1}).narrow(0, c.start, c.length).clone();
        } else {
          VOLT_CHECK(t.dim() == 0, CheckpointError, kTag, " optimizer state '", key, "' of '",
                     c.name, "' has shape ", t.sizes(), " but the parameter ", c.parameter.sizes(),
                     "; resume with the same model.");
        }
        // Per-element state lives where the optimizer steps: with the chunk on the device, or
        // in host memory under offload_optimizer, whichever way the checkpoint was written.
        const at::Tensor& now = v.toTensor();
        if (now.dim() >= 1 && now.device() != c.stepped().device()) {
          v = now.to(c.stepped().device());
        }
      }
      bool optimizer_state = false;  // beside the master (an optimizer keeping none has none)
      for (auto& [key, v] : entries) {
        if (key == kMasterKey && c.master.defined()) c.master.copy_(v.toTensor().reshape({-1}));
        optimizer_state = optimizer_state || key != kMasterKey;
      }
      if (!optimizer_state) continue;
      InputArchive chunk_ar = archive_of(entries);
      auto st = new_optimizer_param_state(optimizer);
      st->serialize(chunk_ar);
      state[detail::state_key_for<detail::OptimizerStateKey>(c.stepped())] = std::move(st);
    }
  }
  // NVMe: the loaded state objects are new; they go to the swap file (a fresh layout).
  auto sw = swappers_.find(&optimizer);
  if (sw != swappers_.end()) sw->second->swap_out_all(/*relayout=*/true);
}

// ------------------------------------------------------------------ accumulated gradients

void DeepSpeedStrategy::save_accumulated_gradients(const Module& module, OutputArchive& ar) const {
  if (engines_.empty() || options_.stage() == 1) {
    // Stage 1 (and plain data parallel) accumulate full local gradients, as DDP does.
    DdpStrategy::save_accumulated_gradients(module, ar);
    return;
  }
  // Stage 2 reduces every micro-batch: each rank holds the mean's chunks. The full mean is what
  // one process on the global batch would hold.
  for (const ZeroEngine* engine : engines_of(module)) {
    const ZeroEngine& e = *engine;
    for (size_t i = 0; i < e.chunks().size(); ++i) {
      const auto& c = e.chunks()[i];
      // Gathered as fp32 (Gloo has no bf16; the round trip is exact), saved in the grads' dtype.
      at::Tensor mine = torch::zeros({c.chunk}, c.parameter.options().dtype(torch::kFloat));
      if (c.length > 0) mine.narrow(0, 0, c.length).copy_(e.gradient_chunk(i));
      const at::Tensor full = group().all_gather_flat(mine).narrow(0, 0, c.numel);
      ar.write(c.name, full.reshape(c.parameter.sizes()).to(c.parameter.scalar_type()).clone());
    }
  }
}

void DeepSpeedStrategy::load_accumulated_gradients(Module& module, InputArchive& ar) {
  if (engines_.empty() || options_.stage() == 1) {
    DdpStrategy::load_accumulated_gradients(module, ar);
    return;
  }
  torch::NoGradGuard no_grad;
  for (ZeroEngine* engine : engines_of(module)) {
    ZeroEngine& e = *engine;
    for (size_t i = 0; i < e.chunks().size(); ++i) {
      const auto& c = e.chunks()[i];
      at::Tensor g;
      if (c.length == 0 || !ar.try_read(c.name, g)) continue;
      VOLT_CHECK(g.numel() == c.numel, CheckpointError, kTag, " accumulated gradient of '", c.name,
                 "' has ", g.numel(), " elements, the parameter ", c.numel, ".");
      e.gradient_chunk(i).copy_(g.reshape({-1}).narrow(0, c.start, c.length));
    }
  }
}

// ------------------------------------------------------------------ checkpoint folders

void DeepSpeedStrategy::save_checkpoint(OutputArchive& archive, const std::string& path) {
  if (engines_.empty()) {
    DdpStrategy::save_checkpoint(archive, path);
    return;
  }
  // Every rank writes its shard; `path` holds a complete checkpoint at every moment.
  const int64_t world = world_size();
  auto meta = detail::c_stream<std::ostringstream>();
  meta << "format " << kZeroFormat << "\nworld_size " << world << "\nstage " << options_.stage()
       << "\n";
  detail::FolderSave save;
  save.path = path;
  save.shard = fs::path(shard_file(path, rank(), world)).filename().string();
  for (int64_t r = 0; r < world; ++r) {
    save.shards.push_back(fs::path(shard_file(path, r, world)).filename().string());
  }
  save.meta_file = kMetaFile;
  save.meta = meta.str();
  save.tag = kTag;
  detail::save_checkpoint_folder(*this, archive, save);
}

namespace {
// Why this rank's shard of a same-world stage-3 folder cannot serve ZeRO-Inference as it is
// ("" when it can). `partitioned`: the names and dtypes of the weights partitioned now.
std::string unfit_shard(InputArchive& shard,
                        const std::map<std::string, at::ScalarType>& partitioned, bool inference);
}  // namespace

InputArchive DeepSpeedStrategy::load_checkpoint(const std::string& path) {
  if (!is_zero_checkpoint(path)) {
    VOLT_CHECK(!is_directory(path) || is_model_parallel_checkpoint(path), CheckpointError, kTag,
               " '", path, "' is a folder without ", kMetaFile,
               ": an incomplete ZeRO checkpoint (a save was interrupted); load the previous one.");
    return Strategy::load_checkpoint(path);
  }
  const FolderMeta meta = folder_meta(path);
  // This rank's own shard at the same world size, unless it holds stage-3 weight chunks and
  // nothing partitions the weights now (another stage, or one process), or its optimizer state
  // is chunks and a fit without ZeRO (no engine trains) would take them for whole tensors; else
  // the full state, from which this rank takes its chunks.
  const bool inference = std::any_of(engines_.begin(), engines_.end(),
                                     [](const auto& kv) { return !kv.second->trains(); });
  const bool training = std::any_of(engines_.begin(), engines_.end(),
                                    [](const auto& kv) { return kv.second->trains(); });
  // Each rank reads its own shard; they agree on it, so that a shard one rank cannot read is a
  // CheckpointError on every rank at once (the others went on into collectives it never joined).
  auto own_shard = [&] {
    InputArchive shard;
    VOLT_CHECK(
        detail::run_agreeing(
            *this, true,
            [&] { shard = checkpoint_io_->load(shard_file(path, rank(), meta.world_size)); }),
        CheckpointError, kTag, " another rank could not read its shard of '", path,
        "' (its error says which and why).");
    return shard;
  };
  if (meta.world_size == world_size() && meta.stage < 3 && (training || !loop_.fitting)) {
    return own_shard();
  }
  const bool own_stage3 = meta.world_size == world_size() && meta.stage == 3 &&
                          ((partitions_parameters() && !inference) || (inference && !training));
  if (own_stage3) {
    // A stage-3 folder of this world size: this rank's shard holds the chunks it needs (weights
    // whole there, such as those frozen in training or kept whole by a persistence threshold,
    // are narrowed on load), unless a weight partitioned there is whole here (a raised
    // param_persistence_threshold), or, for ZeRO-Inference, the shard's weights are rounded
    // copies of fp32 masters the inference weights are wider than. Consolidating materialises
    // every rank's weights and optimizer state on each rank: only then.
    std::map<std::string, at::ScalarType> partitioned;
    for (const auto& kv : engines_) {
      for (const auto& c : kv.second->chunks()) {
        if (c.partitioned) partitioned.emplace(c.name, c.parameter.scalar_type());
      }
    }
    InputArchive shard = own_shard();
    const std::string unfit = unfit_shard(shard, partitioned, inference);
    if (unfit.empty()) return shard;
    log_info("DeepSpeedStrategy", std::string(inference ? "ZeRO-Inference reads '" : "reads '") +
                                      path + "' consolidated: " + unfit + ".");
  }
  // validate / test / predict read no optimizer state: the weights alone are consolidated.
  return load_consolidated_zero_checkpoint(
      path, loop_.fitting || training ? ZeroContents::kEverything : ZeroContents::kWeights);
}

// ============================================================================ consolidation

InputArchive load_consolidated_zero_checkpoint(const std::string& folder, ZeroContents contents) {
  // Consolidated into a private temporary file in TMPDIR (/tmp without it), read back like any
  // full checkpoint.
  const std::string dir = env_value("TMPDIR").value_or("/tmp");
  std::string tmpl = dir + "/volt-zero-XXXXXX";
  const int fd = ::mkstemp(tmpl.data());
  VOLT_CHECK(fd >= 0, CheckpointError, kTag, " cannot create a temporary file in '", dir,
             "' to consolidate '", folder, "' (", std::strerror(errno),
             "); point TMPDIR at a folder with room for the whole checkpoint.");
  ::close(fd);
  const std::string tmp = tmpl;
  try {
    consolidate_zero_checkpoint(folder, tmp, contents);
    InputArchive in = TorchCheckpointIO().load(tmp);
    std::remove(tmp.c_str());
    return in;
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

bool is_zero_checkpoint(const std::string& path) {
  return detail::is_complete_folder(path, kMetaFile);
}

namespace {

// The places of rank 0's tree (`at` below `path`) holding stage 3's chunked weights (with
// kStage3Shapes) and partitioned optimizer states (with zero_world_size): the Trainer's
// "state_dict" and "optimizers/optimizer_<i>", a Fabric checkpoint's modules and optimizers.
void find_partitioned(InputArchive& at, const ArchivePath& path, std::vector<ArchivePath>& dicts,
                      std::vector<ArchivePath>& optimizers) {
  detail::find_sharded_places(at, path, kStage3Shapes, "zero_world_size", dicts, optimizers);
}

// Calls `fn(name, master)` for each fp32 master chunk among an optimizer shard's states (a
// bf16 run's), by parameter name, until `fn` returns false.
template <typename Fn>
void for_each_master(InputArchive& opt, Fn fn) {
  const int64_t groups = read_value(opt, "num_groups", "an optimizer shard").toInt();
  for (int64_t g = 0; g < groups; ++g) {
    InputArchive group = read_sub(opt, "group_" + std::to_string(g), "an optimizer shard");
    InputArchive states = read_sub(group, "state", "an optimizer group");
    for (const auto& name : states.keys()) {
      InputArchive one;
      at::Tensor master;
      if (states.try_read(name, one) && one.try_read(kMasterKey, master) && !fn(name, master)) {
        return;
      }
    }
  }
}

std::string unfit_shard(InputArchive& shard,
                        const std::map<std::string, at::ScalarType>& partitioned, bool inference) {
  std::vector<ArchivePath> dict_paths, optimizer_paths;
  find_partitioned(shard, {}, dict_paths, optimizer_paths);
  // bf16 training: the shard's weights are roundings of fp32 masters (a fit restores the masters
  // from the optimizer state; inference has only the weights).
  bool masters = false;
  for (const auto& path : inference ? optimizer_paths : std::vector<ArchivePath>{}) {
    InputArchive opt = sub_at(shard, path);
    for_each_master(opt, [&](const std::string&, const at::Tensor&) {
      masters = true;
      return false;
    });
  }
  for (const auto& path : dict_paths) {
    InputArchive dict = sub_at(shard, path);
    InputArchive shapes = read_sub(dict, kStage3Shapes, "a stage-3 shard");
    for (const auto& name : shapes.keys()) {
      const auto it = partitioned.find(name);
      if (it == partitioned.end()) {
        return "'" + name + "' is partitioned in the checkpoint but whole here (another " +
               "param_persistence_threshold, or a weight frozen now)";
      }
      at::Tensor chunk;
      if (masters && dict.try_read(name, chunk) && chunk.scalar_type() != it->second) {
        return "its weights are " + std::string(c10::toString(chunk.scalar_type())) +
               " roundings of fp32 masters and the weights here are " + c10::toString(it->second);
      }
    }
  }
  return "";
}

// A chunked state dict made whole: its tensors by name, in the shards' order.
Entries whole_weights(std::vector<InputArchive>& dicts) {
  InputArchive stage3;
  const bool chunked = dicts[0].try_read(kStage3Shapes, stage3);
  std::map<std::string, at::Tensor> full;  // partitioned weights, whole again
  if (chunked) {
    for (const auto& name : stage3.keys()) {
      at::Tensor shape;
      stage3.read(name, shape);
      std::vector<int64_t> sizes(shape.data_ptr<int64_t>(),
                                 shape.data_ptr<int64_t>() + shape.numel());
      std::vector<at::Tensor> pieces;
      for (auto& d : dicts) {
        at::Tensor piece;
        VOLT_CHECK(d.try_read(name, piece), CheckpointError, kTag, " a shard lacks its chunk of '",
                   name, "'; the folder mixes checkpoints.");
        pieces.push_back(piece.reshape({-1}));
      }
      const at::Tensor whole = torch::cat(pieces);
      const int64_t numel = c10::multiply_integers(sizes);
      VOLT_CHECK(whole.numel() == numel, CheckpointError, kTag, " the chunks of '", name, "' hold ",
                 whole.numel(), " elements, its shape ", numel, "; a shard is from another run.");
      full[name] = whole.reshape(sizes);
    }
  }
  Entries weights;
  for (const auto& key : dicts[0].keys()) {
    if (key == kStage3Shapes) continue;
    auto it = full.find(key);
    c10::IValue v;
    if (it != full.end()) {
      v = it->second;
    } else if (!dicts[0].try_read(key, v) || !v.isTensor()) {
      continue;
    }
    weights.emplace_back(key, v);
  }
  return weights;
}

// Every rank's shard of one optimizer's state (`parts`) as the full one-process state; its
// parameters' shapes from `shape_of`; each parameter's fp32 master, when it has one, into
// `masters`.
void whole_optimizer_state(std::vector<InputArchive>& parts, int64_t world,
                           const std::function<std::vector<int64_t>(const std::string&)>& shape_of,
                           OutputArchive& full, std::map<std::string, at::Tensor>& masters) {
  detail::join_optimizer_state(
      parts, full,
      [&](const std::string& name, std::vector<InputArchive>& states) -> c10::optional<Entries> {
        const std::vector<int64_t> sizes = shape_of(name);
        const int64_t numel = c10::multiply_integers(sizes);
        // Each rank's chunk state in rank order: 1-D tensors of that rank's chunk length are
        // concatenated; anything else (a 0-dim step count) is the same everywhere.
        const int64_t chunk = (numel + world - 1) / world;
        std::vector<std::pair<int64_t, Entries>> per_rank;  // (chunk length, entries)
        for (int64_t r = 0; r < world; ++r) {
          InputArchive one;
          if (states[r].try_read(name, one)) {
            per_rank.emplace_back(std::max<int64_t>(0, std::min(chunk, numel - r * chunk)),
                                  entries_of(one));
          }
        }
        if (per_rank.empty()) return c10::nullopt;  // never stepped
        Entries merged = per_rank.front().second;
        for (auto& [k, v] : merged) {
          if (!v.isTensor()) continue;
          std::vector<at::Tensor> pieces;
          bool chunked = true;
          for (auto& [length, e] : per_rank) {
            for (auto& [k2, v2] : e) {
              if (k2 != k) continue;
              const at::Tensor t = v2.toTensor();
              chunked = chunked && t.dim() == 1 && t.numel() == length;
              pieces.push_back(t);
            }
          }
          if (!chunked) continue;
          at::Tensor cat = torch::cat(pieces);
          VOLT_CHECK(cat.numel() == numel, CheckpointError, kTag, " the chunks of '", k, "' for '",
                     name, "' add up to ", cat.numel(), " elements, not ", numel,
                     "; a shard is from another run.");
          v = cat.reshape(sizes);
        }
        bool optimizer_state = false;
        for (auto& [k, v] : merged) {
          if (k == kMasterKey && v.isTensor()) masters[name] = v.toTensor();
          optimizer_state = optimizer_state || k != kMasterKey;
        }
        // A master alone: the optimizer keeps no state of its own for this parameter.
        if (!optimizer_state) return c10::nullopt;
        return merged;
      });
}

// ZeroContents::kWeights: rank 0's tree without the optimizers' partitioned states, its weights
// whole (stage 3's chunks joined; the fp32 masters where a bf16 run kept them). The shards are
// read one at a time, rank 0's last: its tree, the pieces and one other shard are in memory.
void consolidate_weights(const std::string& folder, int64_t world, const std::string& out) {
  TorchCheckpointIO io;
  // By state dict place and name, in the order the shards are read: each rank's chunk of a
  // partitioned weight, and of an fp32 master.
  std::map<ArchivePath, std::map<std::string, std::vector<at::Tensor>>> chunks, masters;
  std::vector<ArchivePath> dict_paths, optimizer_paths;
  const auto take = [&](InputArchive& shard) {
    dict_paths.clear();
    optimizer_paths.clear();
    find_partitioned(shard, {}, dict_paths, optimizer_paths);
    for (const auto& path : dict_paths) {
      InputArchive dict = sub_at(shard, path);
      InputArchive shapes = read_sub(dict, kStage3Shapes, "a stage-3 shard");
      for (const auto& name : shapes.keys()) {
        at::Tensor piece;
        VOLT_CHECK(dict.try_read(name, piece), CheckpointError, kTag,
                   " a shard lacks its chunk of '", name, "'; the folder mixes checkpoints.");
        chunks[path][name].push_back(piece.reshape({-1}));
      }
    }
    for (const auto& path : optimizer_paths) {
      InputArchive opt = sub_at(shard, path);
      const ArchivePath dict = dict_of_optimizer(opt);
      for_each_master(opt, [&](const std::string& name, const at::Tensor& master) {
        masters[dict][name].push_back(master.reshape({-1}));
        return true;
      });
    }
  };
  for (int64_t r = 1; r < world; ++r) {
    InputArchive shard = io.load(shard_file(folder, r, world));
    take(shard);
  }
  InputArchive first = io.load(shard_file(folder, 0, world));
  take(first);
  // Rank 0's piece came last (a rank whose chunk is empty has no master: the order holds).
  const auto joined = [&](std::vector<at::Tensor>& pieces, const std::string& name,
                          c10::IntArrayRef sizes) {
    std::rotate(pieces.begin(), pieces.end() - 1, pieces.end());
    const at::Tensor whole = torch::cat(pieces);
    pieces.clear();
    const int64_t numel = c10::multiply_integers(sizes);
    VOLT_CHECK(whole.numel() == numel, CheckpointError, kTag, " the chunks of '", name, "' hold ",
               whole.numel(), " elements, its shape ", numel, "; a shard is from another run.");
    return whole.reshape(sizes);
  };
  std::set<ArchivePath> places(dict_paths.begin(), dict_paths.end());
  for (const auto& kv : masters) places.insert(kv.first);
  std::map<ArchivePath, Entries> weights;
  for (const auto& path : places) {
    InputArchive dict;
    try {
      dict = sub_at(first, path);
    } catch (const CheckpointError&) {
      continue;  // the optimizer's module was not saved beside it
    }
    InputArchive shapes;
    const bool chunked = dict.try_read(kStage3Shapes, shapes);
    auto& my_chunks = chunks[path];
    auto& my_masters = masters[path];
    Entries& entries = weights[path];
    for (const auto& key : dict.keys()) {
      if (key == kStage3Shapes) continue;
      c10::IValue v;
      if (!dict.try_read(key, v) || !v.isTensor()) continue;
      std::vector<int64_t> sizes = v.toTensor().sizes().vec();
      at::Tensor shape;
      if (chunked && shapes.try_read(key, shape)) {
        sizes.assign(shape.data_ptr<int64_t>(), shape.data_ptr<int64_t>() + shape.numel());
      }
      // bf16 runs: the weights are the fp32 masters (as the full consolidation's).
      auto m = my_masters.find(key);
      auto c = my_chunks.find(key);
      if (m != my_masters.end() && !m->second.empty()) {
        v = joined(m->second, key, sizes);
      } else if (c != my_chunks.end() && !c->second.empty()) {
        v = joined(c->second, key, sizes);
      }
      entries.emplace_back(key, v);
    }
  }
  chunks.clear();
  masters.clear();
  OutputArchive root;
  const std::set<ArchivePath> drop(optimizer_paths.begin(), optimizer_paths.end());
  write_consolidated(first, {}, root, weights, {}, drop);
  io.save(root, out);
}

}  // namespace

void consolidate_zero_checkpoint(const std::string& folder, const std::string& out,
                                 ZeroContents contents) {
  VOLT_CHECK(is_zero_checkpoint(folder), CheckpointError, kTag, " '", folder,
             "' is not a complete ZeRO checkpoint folder (no ", kMetaFile, ").");
  const int64_t world = folder_meta(folder).world_size;
  TorchCheckpointIO io;
  for (int64_t r = 0; r < world; ++r) {
    const std::string file = shard_file(folder, r, world);
    struct stat st;
    VOLT_CHECK(::stat(file.c_str(), &st) == 0, CheckpointError, kTag, " '", folder,
               "' lacks the shard of rank ", r, " ('", file, "'); the checkpoint is incomplete.");
  }
  if (contents == ZeroContents::kWeights) {
    consolidate_weights(folder, world, out);
    return;
  }
  std::vector<InputArchive> shards;
  for (int64_t r = 0; r < world; ++r) shards.push_back(io.load(shard_file(folder, r, world)));
  // Everything but the partitioned entries comes from rank 0 (the ranks hold the same full
  // weights below stage 3, loop state and callbacks; their generator states are all in every
  // shard). The partitioned entries are found wherever the checkpoint keeps them: the Trainer's
  // "state_dict" and "optimizers", each module and optimizer of a Fabric state.
  std::vector<ArchivePath> dict_paths, optimizer_paths;
  find_partitioned(shards[0], {}, dict_paths, optimizer_paths);
  const auto across_ranks = [&](const ArchivePath& path) {
    std::vector<InputArchive> at;
    for (auto& sh : shards) at.push_back(sub_at(sh, path));
    return at;
  };
  // Whole weights, by the state dict's place: stage 3's chunks joined, or rank 0's whole
  // tensors (stages 1 and 2). weights_at reads one on first use (nullptr where rank 0 has none).
  std::map<ArchivePath, Entries> weights;
  const auto weights_at = [&](const ArchivePath& path) -> Entries* {
    if (auto w = weights.find(path); w != weights.end()) return &w->second;
    try {
      sub_at(shards[0], path);
    } catch (const CheckpointError&) {
      return nullptr;  // the optimizer's module was not saved beside it
    }
    auto dicts = across_ranks(path);
    return &weights.emplace(path, whole_weights(dicts)).first->second;
  };
  for (const auto& path : dict_paths) weights_at(path);
  std::map<ArchivePath, std::string> optimizers;  // whole states, serialized, by place
  for (const auto& path : optimizer_paths) {
    auto parts = across_ranks(path);
    const ArchivePath dict = dict_of_optimizer(parts[0]);
    // Parameter shapes: from the shard (written since session 66), else from the state dict.
    InputArchive shapes;
    const bool own_shapes = parts[0].try_read("zero_shapes", shapes);
    const auto shape_of = [&](const std::string& name) -> std::vector<int64_t> {
      at::Tensor t;
      if (own_shapes && shapes.try_read(name, t)) {
        return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
      }
      if (const Entries* w = weights_at(dict)) {
        for (const auto& [k, v] : *w) {
          if (k == name) return v.toTensor().sizes().vec();
        }
      }
      VOLT_CHECK(false, CheckpointError, kTag, " the weights lack '", name,
                 "' which the optimizer state names.");
      return {};
    };
    OutputArchive full;
    std::map<std::string, at::Tensor> masters;
    whole_optimizer_state(parts, world, shape_of, full, masters);
    auto bytes = detail::c_stream<std::ostringstream>();
    full.save_to(bytes);
    optimizers[path] = bytes.str();
    // bf16 runs with master weights: the weights are the fp32 masters (DeepSpeed's
    // zero_to_fp32); loading them into the bf16 module rounds them to exactly the weights it
    // trained with.
    Entries* w = masters.empty() ? nullptr : weights_at(dict);
    if (w == nullptr) continue;
    for (auto& [name, v] : *w) {
      auto m = masters.find(name);
      if (m != masters.end()) v = m->second;
    }
  }
  OutputArchive root;
  write_consolidated(shards[0], {}, root, weights, optimizers);
  io.save(root, out);
}

std::ostream& operator<<(std::ostream& os, const DeepSpeedStrategyOptions& o) {
  return os << "DeepSpeedStrategyOptions("
            << "zero_optimization=" << o.zero_optimization() << ", stage=" << o.stage()
            << ", offload_optimizer=" << o.offload_optimizer()
            << ", offload_optimizer_device=" << detail::quoted(o.offload_optimizer_device())
            << ", offload_parameters=" << o.offload_parameters()
            << ", param_persistence_threshold=" << o.param_persistence_threshold()
            << ", max_live_parameters=" << o.max_live_parameters()
            << ", offload_parameters_device=" << detail::quoted(o.offload_parameters_device())
            << ", nvme_path=" << detail::quoted(o.nvme_path())
            << ", sub_group_size=" << o.sub_group_size()
            << ", aio_block_size=" << o.aio_block_size()
            << ", aio_queue_depth=" << o.aio_queue_depth()
            << ", aio_use_uring=" << o.aio_use_uring()
            << ", cpu_checkpointing=" << o.cpu_checkpointing()
            << ", reduce_bucket_size=" << o.reduce_bucket_size()
            << ", allgather_bucket_size=" << o.allgather_bucket_size()
            << ", overlap_comm=" << o.overlap_comm()
            << ", prefetch_bucket_size=" << o.prefetch_bucket_size()
            << ", zero_allow_untested_optimizer=" << o.zero_allow_untested_optimizer()
            << ", master_weights=" << o.master_weights() << ", loss_scale=" << o.loss_scale()
            << ", initial_scale_power=" << o.initial_scale_power()
            << ", loss_scale_window=" << o.loss_scale_window() << ", hysteresis=" << o.hysteresis()
            << ", consecutive_hysteresis=" << o.consecutive_hysteresis()
            << ", min_loss_scale=" << o.min_loss_scale()
            << ", ignore_unused_parameters=" << o.ignore_unused_parameters()
            << ", config=" << detail::quoted(o.config())
            << ", parallel_devices=" << o.parallel_devices() << ", timeout_s=" << o.timeout_s()
            << ", process_group_backend=" << detail::quoted(o.process_group_backend())
            << ", tensor_parallel=" << o.tensor_parallel()
            << ", dtype=" << detail::quoted(o.dtype())
            << ", replace_with_kernel_inject=" << o.replace_with_kernel_inject()
            << ", enable_cuda_graph=" << o.enable_cuda_graph()
            << ", replace_method=" << detail::quoted(o.replace_method()) << ")";
}

}  // namespace volt
