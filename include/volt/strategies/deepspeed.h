#pragma once
/// DeepSpeedStrategy: DeepSpeed-style sharded data parallelism in C++ ("deepspeed",
/// "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
/// "deepspeed_stage_3_offload", "deepspeed_stage_3_offload_nvme"): ZeRO stage 1 partitions the
/// optimizer state across ranks, stage 2 the gradients too, stage 3 the parameters too
/// (ZeroEngine), on the same c10d process groups, launcher and cluster environments as DdpStrategy.

#include <torch/arg.h>
#include <iosfwd>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "volt/distributed/tensor_parallel.h"
#include "volt/distributed/zero_engine.h"
#include "volt/strategies/ddp.h"
#include "volt/strategies/deepspeed_config.h"

namespace volt {

struct DeepSpeedStrategyOptions {
  /// Shard with ZeRO; false trains as plain data parallel (gradients all-reduced). Default: true.
  TORCH_ARG(bool, zero_optimization) = true;
  /// ZeRO stage: 1 (optimizer state), 2 (and gradients) or 3 (and parameters). At one rank,
  /// stage 3 keeps the parameters whole unless they are offloaded (to host memory from an
  /// accelerator, or to NVMe): there a rank's chunks are the whole parameters, and partitioning
  /// would only add a copy and regathers. Default: 2.
  TORCH_ARG(int64_t, stage) = 2;
  /// ZeRO-Offload: optimizer state and step in host memory. With CUDA parameters each rank's
  /// chunks have pinned host copies (fp32 masters under bf16-mixed) that the optimizer steps on
  /// the CPU; gradients come to the host and stepped chunks go back with asynchronous copies,
  /// once per step (ZeroEngineOptions::offload_optimizer). Parameters on the CPU are in host
  /// memory already, so on CPU runs nothing moves. Default: false.
  TORCH_ARG(bool, offload_optimizer) = false;
  /// "cpu" or "nvme" (ZeRO-Infinity: between steps the optimizer state lives in files under
  /// nvme_path, swapped in sub-group by sub-group with asynchronous I/O). Default: "cpu".
  TORCH_ARG(std::string, offload_optimizer_device) = "cpu";
  /// Stage 3 with parameters in host memory (ZeRO-Offload's offload_param). On CPU runs that is
  /// where they are. With CUDA parameters each rank's chunks of the partitioned parameters live
  /// in pinned host memory and are copied to the GPU when gathered, so the GPU holds only the
  /// modules in use; needs offload_optimizer (deepspeed_stage_3_offload sets both) and device
  /// "cpu" ("nvme" with CUDA parameters is NotAvailable). Default: false.
  TORCH_ARG(bool, offload_parameters) = false;
  /// Stage 3: parameters of at most this many elements stay whole on every rank. Default: 1e5.
  TORCH_ARG(int64_t, param_persistence_threshold) = 100000;
  /// Stage 3: most parameter elements gathered at once (the least recently gathered are
  /// released first). Default: 1e9.
  TORCH_ARG(int64_t, max_live_parameters) = 1000000000;
  /// "cpu" or "nvme" (ZeRO-Infinity's offload_param: stage 3's parameter chunks in a file
  /// under nvme_path, read when gathered). Default: "cpu".
  TORCH_ARG(std::string, offload_parameters_device) = "cpu";
  /// Folder of the NVMe swap files (ZeRO-Infinity): an existing, writable folder; each run
  /// swaps into its own sub-folder and removes it at the end. Default: "/local_nvme".
  TORCH_ARG(std::string, nvme_path) = "/local_nvme";
  /// NVMe offload: elements of optimizer parameters stepped together (DeepSpeed's
  /// sub_group_size); only about three sub-groups' state is in memory during a step. Default: 1e9.
  TORCH_ARG(int64_t, sub_group_size) = 1000000000;
  /// NVMe offload: bytes per asynchronous I/O request (DeepSpeed's aio.block_size). Default: 1 MiB.
  TORCH_ARG(int64_t, aio_block_size) = 1048576;
  /// NVMe offload: I/O requests in flight (DeepSpeed's aio.queue_depth). Default: 8.
  TORCH_ARG(int64_t, aio_queue_depth) = 8;
  /// NVMe offload: io_uring (true) or the synchronous pread/pwrite reference path. Default: true.
  TORCH_ARG(bool, aio_use_uring) = true;
  /// DeepSpeed's cpu_checkpointing: volt::checkpoint keeps the inputs it saves in host memory
  /// for this run (checkpoint_defaults()); the model must use activation checkpointing
  /// (volt::checkpoint or the ActivationCheckpointing callback). Default: false.
  TORCH_ARG(bool, cpu_checkpointing) = false;
  /// Gradient elements per reduce-scatter. Default: 2e8 (Lightning's DeepSpeed default).
  TORCH_ARG(int64_t, reduce_bucket_size) = 200000000;
  /// Parameter elements per all-gather after the step. Default: 2e8.
  TORCH_ARG(int64_t, allgather_bucket_size) = 200000000;
  /// Reduce gradient buckets while backward goes on (at most two in flight); false blocks
  /// backward on each. Same results either way. Default: true (Lightning's DeepSpeed default).
  TORCH_ARG(bool, overlap_comm) = true;
  /// Stage 3: elements of the parameters read next (in the order recorded in earlier steps)
  /// gathered ahead of their read (DeepSpeed's stage3_prefetch_bucket_size); 0: gather on read
  /// only. Default: 5e7 (DeepSpeed's).
  TORCH_ARG(int64_t, prefetch_bucket_size) = 50000000;
  /// Accept optimizers ZeRO has not been tested with (anything but SGD, Adam, AdamW, RMSprop,
  /// Adagrad, FusedSGD, FusedAdamW): they must act on each element independently, or the
  /// partitioned step differs from the unpartitioned one. Default: true (as Lightning).
  TORCH_ARG(bool, zero_allow_untested_optimizer) = true;
  /// bf16 with ZeRO, as DeepSpeed's BF16Optimizer: the module's weights and gradients are bf16
  /// and each rank keeps fp32 master weights of its chunks, which the optimizer steps (memory
  /// 2Ψ + 2Ψ + 12Ψ/N in stage 1 for Adam). Precision "bf16-true" converts the module itself;
  /// with "bf16-mixed" the strategy stores the module in bf16 for the run (autocast still runs
  /// the fp32 ops in fp32; floating inputs are cast to bf16) and at the end writes the fp32
  /// masters back into the module in its own dtype, as Lightning's DeepSpeed precision does.
  /// false: "bf16-true" steps the bf16 weights themselves, "bf16-mixed" autocasts over fp32
  /// weights with fp32 optimizer state. Default: true.
  TORCH_ARG(bool, master_weights) = true;
  /// A parameter the forward did not use (its gradient never came): true counts it as a zero
  /// gradient, DeepSpeed's default, so the optimizer still steps it (weight decay moves it; DDP
  /// and single-process training leave its gradient undefined and skip it); false stops the run
  /// with a ValueError naming it. JSON: zero_optimization.ignore_unused_parameters.
  /// Default: true.
  TORCH_ARG(bool, ignore_unused_parameters) = true;
  // DeepSpeed's fp16 loss scaling (Lightning's DeepSpeedStrategy arguments, DeepSpeed's
  // defaults): with precision "16-mixed" the strategy sets the precision's loss scaler from
  // these. A JSON config with an "fp16" section replaces them all (DeepSpeed's defaults for the
  // keys it leaves out), as Lightning passes them only when the JSON has none.
  /// A static loss scale; 0: dynamic. Default: 0.
  TORCH_ARG(double, loss_scale) = 0.0;
  /// The dynamic scale starts at 2^initial_scale_power. Default: 16.
  TORCH_ARG(int64_t, initial_scale_power) = 16;
  /// Steps with finite gradients before the dynamic scale doubles. Default: 1000.
  TORCH_ARG(int64_t, loss_scale_window) = 1000;
  /// Steps with inf/NaN gradients before the scale halves; the ones before only skip.
  /// Default: 2.
  TORCH_ARG(int64_t, hysteresis) = 2;
  /// true: the hysteresis counts consecutive inf/NaN steps (refilled after every finite one);
  /// false: refilled only when the scale grows. Default: false.
  TORCH_ARG(bool, consecutive_hysteresis) = false;
  /// Floor of the dynamic scale; an inf/NaN step at the floor stops the run with a ValueError,
  /// as DeepSpeed raises there. Default: 1.
  TORCH_ARG(double, min_loss_scale) = 1.0;
  /// A DeepSpeed JSON config: a file path, or inline JSON starting with '{'. When set it is the
  /// whole configuration, as in DeepSpeed: its zero_optimization (absent: no ZeRO), buckets,
  /// offload, gradient_clipping, batch sizes, optimizer and scheduler replace the options above.
  /// Default: "" (none).
  TORCH_ARG(std::string, config) = "";
  /// Number of processes per node; 0 takes the Trainer's `devices`. Default: 0.
  TORCH_ARG(int64_t, parallel_devices) = 0;
  /// Bound on rendezvous and on every collective, in seconds. Default: 60.
  TORCH_ARG(double, timeout_s) = 60.0;
  /// "auto" (gloo on CPU, nccl on CUDA), "gloo" or "nccl". Default: "auto".
  TORCH_ARG(std::string, process_group_backend) = "auto";

  // DeepSpeed inference (predict, validate and test; fit raises NotAvailable when tp_size > 1).
  /// Tensor parallelism: tp_size (dividing the world: consecutive ranks form a group, groups
  /// split the data), and the plan or injection_policy naming the Linear layers to split
  /// (TensorParallelEngine). Default: tp_size 1 (off).
  TORCH_ARG(TensorParallelOptions, tensor_parallel) = {};
  /// Weights' dtype for inference: "float32" or "bfloat16" (the module is cast for the run and
  /// back to its dtype after it, keeping the bfloat16-rounded values, as DeepSpeed converts a
  /// model in place; floating inputs are cast to match). Default: "float32".
  TORCH_ARG(std::string, dtype) = "float32";
  /// DeepSpeed's kernel injection for inference: recognised blocks (Sequential entries: Linear
  /// followed by ReLU/GELU/SiLU, libtorch's TransformerEncoderLayer) run volt's fused kernels
  /// for the run (KernelInjection); other modules run unchanged. Default: false.
  TORCH_ARG(bool, replace_with_kernel_inject) = false;
  /// Capture inference in a CUDA graph: not built until graph capture lands (issue #15); true
  /// raises NotAvailable. Default: false.
  TORCH_ARG(bool, enable_cuda_graph) = false;
  /// DeepSpeed's replace_method; only "auto" exists. Default: "auto".
  TORCH_ARG(std::string, replace_method) = "auto";
};

std::ostream& operator<<(std::ostream& os, const DeepSpeedStrategyOptions& o);

/// Lightning's DeepSpeedStrategy without Python DeepSpeed: the optimizer returned by
/// configure_optimizers is partitioned in place (its parameters become this rank's chunks), so
/// its type, hyper-parameters and LR schedulers stay the user's. Checkpoints are folders: every
/// rank writes its own shard file (weights, its optimizer chunks, loop state) and rank 0 a
/// metadata file, and the folder replaces the previous one atomically. The same world size
/// resumes exactly; another world size, a plain DdpStrategy or one process loads the folder
/// through consolidate_zero_checkpoint (also `volt zero-to-fp32`).
class CheckpointDefaultsGuard;
class KernelInjection;
namespace detail {
class OptimizerSwapper;
}

class DeepSpeedStrategy : public DdpStrategy {
 public:
  DeepSpeedStrategy(DeepSpeedStrategyOptions options, std::shared_ptr<Accelerator> accelerator,
                    std::shared_ptr<Precision> precision, int64_t devices, int64_t num_nodes = 1,
                    std::shared_ptr<CheckpointIO> checkpoint_io = nullptr);
  ~DeepSpeedStrategy() override;
  std::string name() const override { return "deepspeed"; }
  const DeepSpeedStrategyOptions& deepspeed_options() const { return options_; }

  void setup_environment() override;
  void teardown() override;
  /// sync_batchnorm is not supported with ZeRO: ConfigError when on (use "ddp").
  void set_sync_batchnorm(bool on) override;
  void check_accumulation_change(int64_t accumulate_grad_batches) const override;
  void setup_module(Module& module) override;
  /// ConfigError: ZeRO partitions the trainable parameters once, at setup.
  void trainable_parameters_changed(Module& module) override;
  void setup_optimizers(Module& module, std::vector<OptimizerConfig>& optimizers) override;
  void backward(const at::Tensor& loss, Module& module, bool sync_gradients) override;
  /// Each module keeps its own engines (one per optimizer set up with it): the engines of the
  /// modules `modules` names arm their gradient hooks around one backward (with each module's
  /// sync flag), the others take no part, as DDP's per-module reducers.
  void backward_through(const at::Tensor& loss, const std::vector<Reached>& modules) override;
  bool optimizer_step(torch::optim::Optimizer& optimizer, c10::optional<double> clip_value,
                      ClipAlgorithm algorithm, const ClipCall& clip) override;
  at::Tensor clip_gradients(torch::optim::Optimizer& optimizer, double value,
                            ClipAlgorithm algorithm) override;
  void zero_grad(torch::optim::Optimizer& optimizer) override;
  at::Tensor training_step(Module& module, const Batch& batch, int64_t batch_idx) override;
  /// ZeRO's scopes (stage 3 gathers partitioned parameters as the forward reads them), then
  /// DdpStrategy's (buffers, SyncBatchNorm).
  std::shared_ptr<void> training_forward_context(Module& module) override;
  void validation_step(Module& module, const Batch& batch, int64_t batch_idx) override;
  void test_step(Module& module, const Batch& batch, int64_t batch_idx) override;
  at::Tensor predict_step(Module& module, const Batch& batch, int64_t batch_idx) override;
  void save_model_state(const Module& module, torch::serialize::OutputArchive& ar) const override;
  void load_model_state(Module& module, torch::serialize::InputArchive& ar,
                        bool strict) const override;

  void save_optimizer_state(const torch::optim::Optimizer& optimizer, const Module& module,
                            torch::serialize::OutputArchive& ar) const override;
  void load_optimizer_state(torch::optim::Optimizer& optimizer, const Module& module,
                            torch::serialize::InputArchive& ar) const override;
  void save_accumulated_gradients(const Module& module,
                                  torch::serialize::OutputArchive& ar) const override;
  void load_accumulated_gradients(Module& module, torch::serialize::InputArchive& ar) override;
  void save_checkpoint(torch::serialize::OutputArchive& archive, const std::string& path) override;
  torch::serialize::InputArchive load_checkpoint(const std::string& path) override;

  /// The parsed DeepSpeed JSON (nullptr without `config`).
  const DeepSpeedConfig* config() const { return config_ ? &*config_ : nullptr; }
  /// The engine partitioning `optimizer` (nullptr without ZeRO or before setup_optimizers).
  ZeroEngine* engine(const torch::optim::Optimizer& optimizer) const;
  /// ZeRO-Inference: the engine partitioning `module`'s weights without an optimizer (stage 3
  /// in validate / test / predict, or a module given to Fabric::setup without optimizers), or
  /// nullptr.
  ZeroEngine* inference_engine(const Module& module) const;
  /// The engine's memory() for `optimizer`, plus the optimizer state its NVMe swap file holds.
  ZeroMemory memory(const torch::optim::Optimizer& optimizer) const;
  /// The folder of this rank's NVMe swap files in the current run ("" without NVMe offload).
  const std::string& nvme_folder() const { return nvme_rank_dir_; }
  /// The tensor-parallel engine of the current run (nullptr when tp_size is 1 or outside a run).
  TensorParallelEngine* tensor_parallel_engine() const { return tp_.get(); }
  /// The kernel injection of the current run (nullptr without replace_with_kernel_inject or
  /// outside a run).
  const KernelInjection* kernel_injection() const { return injection_.get(); }
  Batch batch_to_device(const Batch& batch) const override;
  /// With tensor parallelism the ranks of one tensor-parallel group read the same batches (they
  /// split layers, not data); groups (world / tp_size of them) read different ones.
  DataShard data_shard() const override;

 private:
  ZeroEngine& engine_for(const torch::optim::Optimizer& optimizer) const;
  void apply_config();
  void configure_loss_scaling();
  /// The engine options these settings give (the next NVMe swap file's name included); the
  /// callers set what differs by engine (offload, persistence at one rank, stage).
  ZeroEngineOptions engine_options() const;
  /// Stage 3 without an optimizer (ZeRO-Inference): partitions `module`'s weights.
  void setup_inference_engine(Module& module);
  /// Stage 3 scopes of every engine (gathering allowed while they live).
  std::vector<std::unique_ptr<ZeroEngine::Scope>> scopes();
  // NVMe parameter offload: every engine's chunks in memory while the guards live.
  std::vector<std::unique_ptr<ZeroEngine::Resident>> resident() const;
  /// Whether some engine keeps parameters partitioned (stage 3).
  bool partitions_parameters() const;
  /// Master weights: sets the masters of `module`'s engines from the weights just loaded from
  /// `ar` (whole tensors, or this rank's chunks of stage 3's partitioned ones when `chunks`).
  void load_master_weights(const Module& module, torch::serialize::InputArchive& ar,
                           bool chunks) const;
  /// The engines of the optimizers set up with `module`.
  std::vector<ZeroEngine*> engines_of(const Module& module) const;
  /// The chunk of parameter `impl` in some engine, or nullptr.
  const ZeroChunk* chunk_of(const c10::TensorImpl* impl) const;
  bool zero_on() const { return options_.zero_optimization() && options_.stage() > 0; }
  bool tp_on() const { return options_.tensor_parallel().tp_size() > 1; }
  // Options that make the run inference only (no reducer, no ZeRO).
  bool inference_only() const {
    return tp_on() || options_.dtype() != "float32" || options_.replace_with_kernel_inject();
  }
  std::unique_ptr<TensorParallelEngine> tp_;
  std::unique_ptr<KernelInjection> injection_;  // replace_with_kernel_inject's swaps, this run
  c10::optional<at::ScalarType> cast_back_;  // the module's dtype before a bfloat16 inference run
  Module* cast_module_ = nullptr;
  // bf16-mixed with master weights: the modules setup_optimizers cast to bf16, and their dtype
  // before (teardown casts them back and writes their engines' fp32 masters into them).
  std::vector<std::pair<Module*, at::ScalarType>> master_casts_;
  int64_t tp_groups_made_ = 0;  // names each run's tensor-parallel group uniquely in the store
  DeepSpeedStrategyOptions options_;
  c10::optional<DeepSpeedConfig> config_;
  c10::optional<double> clip_;  // the JSON's gradient_clipping
  int64_t micro_batch_ = 0;     // the JSON's micro batch, checked on the first batch
  // The engines, keyed by the optimizer whose state each partitions, or by the module for a
  // ZeRO-Inference engine (no optimizer), in the order they were made: their collectives run in
  // this order, alike on every rank (the keys' address order can differ between ranks, which
  // would pair one engine's all-gathers with another's).
  class Engines {
   public:
    using Item = std::pair<const void*, std::unique_ptr<ZeroEngine>>;
    ZeroEngine* find(const void* key) const;
    /// Made anew for a key: it goes last.
    void put(const void* key, std::unique_ptr<ZeroEngine> engine);
    void erase(const void* key);
    void clear() { items_.clear(); }
    bool empty() const { return items_.empty(); }
    std::vector<Item>::iterator begin() { return items_.begin(); }
    std::vector<Item>::iterator end() { return items_.end(); }
    std::vector<Item>::const_iterator begin() const { return items_.begin(); }
    std::vector<Item>::const_iterator end() const { return items_.end(); }

   private:
    std::vector<Item> items_;
  };
  Engines engines_;
  // The modules set up in this run (a Fabric loop's several), each engine's module, and each
  // module's parameter names (its engines name their chunks by them).
  std::vector<const Module*> modules_;
  std::map<const void*, const Module*> owners_;
  std::map<const Module*, std::map<const c10::TensorImpl*, std::string>> names_;
  int64_t nvme_files_ = 0;  // swap files made in this run's folder (each one's number)
  std::unique_ptr<CheckpointDefaultsGuard> checkpoint_defaults_;  // cpu_checkpointing's run
  // NVMe offload: per optimizer, its state swapper; this run's folders (removed at teardown).
  bool nvme_optimizer() const {
    return options_.offload_optimizer() && options_.offload_optimizer_device() == "nvme";
  }
  bool nvme_parameters() const {
    return options_.offload_parameters() && options_.offload_parameters_device() == "nvme";
  }
  void make_nvme_folder();
  void remove_nvme_files() noexcept;
  std::map<const torch::optim::Optimizer*, std::unique_ptr<detail::OptimizerSwapper>> swappers_;
  std::string nvme_run_dir_, nvme_rank_dir_;
  int nvme_lock_fd_ = -1;  // flock held on nvme_rank_dir_/owner.lock while the folder is in use
};

/// What a consolidated ZeRO checkpoint keeps.
enum class ZeroContents {
  /// The whole weights and the whole optimizer states: a fit resumes from it at any world size.
  kEverything,
  /// The whole weights and every entry that is not an optimizer's partitioned state (loop state,
  /// callbacks, the module's and the data module's own): what validate / test / predict and
  /// load_weights read, as Lightning's convert_zero_checkpoint_to_fp32_state_dict drops
  /// DeepSpeed's optimizer states. Read one shard at a time: rank 0's shard, the whole weights
  /// and one other shard are in memory at once, where kEverything holds every shard and the
  /// whole optimizer states.
  kWeights,
};

/// Reads a ZeRO checkpoint folder (every rank's shard) and writes one ordinary volt checkpoint
/// file at `out`: full weights and (kEverything) full optimizer state by parameter name, plus
/// everything else rank 0 saved (DeepSpeed's zero_to_fp32, with the optimizer state kept unless
/// `contents` is kWeights). The partitioned entries are found wherever the checkpoint keeps them
/// (a Trainer's weights and optimizers, each module and optimizer of a Fabric state); with bf16
/// master weights, the weights are the fp32 masters. Any strategy and any world size loads the
/// result. Throws CheckpointError naming a missing or inconsistent shard.
void consolidate_zero_checkpoint(const std::string& folder, const std::string& out,
                                 ZeroContents contents = ZeroContents::kEverything);

/// consolidate_zero_checkpoint into a temporary file, read back: how every strategy (and
/// DeepSpeedStrategy at another world size) loads a ZeRO folder; kWeights when no optimizer
/// state will be read (validate / test / predict, load_weights).
torch::serialize::InputArchive load_consolidated_zero_checkpoint(
    const std::string& folder, ZeroContents contents = ZeroContents::kEverything);

/// True when `path` is a ZeRO checkpoint folder written by DeepSpeedStrategy.
bool is_zero_checkpoint(const std::string& path);

}  // namespace volt
