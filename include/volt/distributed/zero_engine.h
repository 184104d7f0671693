#pragma once
/// ZeroEngine: ZeRO data parallelism (Rajbhandari et al., arXiv 1910.02054) over a ProcessGroup.
/// Stage 1 partitions the optimizer state, stage 2 also the reduced gradients, stage 3 also the
/// parameters: each rank owns chunk `rank` of every parameter (the parameter flattened and cut
/// into world_size equal chunks, the last ones padded) and steps only those chunks.

#include <ATen/Tensor.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "volt/distributed/process_group.h"

namespace volt {

struct ZeroEngineOptions {
  /// 1: optimizer state partitioned (full gradients kept, reduced once per optimizer step);
  /// 2: gradients partitioned too (reduced on every backward, only this rank's chunk kept);
  /// 3: parameters partitioned too (gathered when an op reads them, released after). Default: 2.
  TORCH_ARG(int64_t, stage) = 2;
  /// Gradient elements per reduce-scatter (all ranks' chunks together). Default: 2e8.
  TORCH_ARG(int64_t, reduce_bucket_size) = 200000000;
  /// Parameter elements per all-gather after the step. Default: 2e8.
  TORCH_ARG(int64_t, allgather_bucket_size) = 200000000;
  /// Reduce gradient buckets while backward goes on (DeepSpeed's overlap_comm): a full bucket's
  /// collective is started and backward continues; at most two are in flight (double
  /// buffering), the rest are finished at the end of backward. false: each bucket's reduction
  /// blocks backward. The results are bitwise the same either way. Default: true.
  TORCH_ARG(bool, overlap_comm) = true;
  /// Stage 3: when a module's parameters are read, start gathering the ones the recorded access
  /// order says come next (learned from earlier steps, per direction), up to this many elements
  /// in flight (DeepSpeed's stage3_prefetch_bucket_size); 0 gathers only on read. Default: 5e7.
  TORCH_ARG(int64_t, prefetch_bucket_size) = 50000000;
  /// Stage 3, ZeRO-Infinity's offload_param to NVMe: this rank's chunks of the partitioned
  /// parameters live in this file (created; removed by the destructor) instead of memory.
  /// Gathers read a module's chunks from it; the optimizer step holds one or two sub-groups'
  /// chunks at a time (prepare_step(true) and the *_step_chunks calls; DeepSpeedStrategy) or the
  /// whole shard (prepare_step() to gather_parameters()), a `Resident` guard the whole shard,
  /// and writing it back releases it again. "" keeps the chunks in memory. Default: "".
  TORCH_ARG(std::string, param_swap_file) = "";
  /// Bytes per I/O request and requests in flight on param_swap_file (DeepSpeed's aio
  /// block_size and queue_depth), and io_uring (false: pread/pwrite). Defaults: 1 MiB, 8, true.
  TORCH_ARG(int64_t, aio_block_size) = 1048576;
  TORCH_ARG(int64_t, aio_queue_depth) = 8;
  TORCH_ARG(bool, aio_use_uring) = true;
  /// Stage 3: parameters of at most this many elements stay whole on every rank (DeepSpeed's
  /// stage3_param_persistence_threshold). Default: 1e5.
  TORCH_ARG(int64_t, param_persistence_threshold) = 100000;
  /// Stage 3: most elements of partitioned parameters gathered at once; the least recently
  /// gathered are released first (DeepSpeed's stage3_max_live_parameters). Default: 1e9.
  TORCH_ARG(int64_t, max_live_parameters) = 1000000000;
  /// Parameters in bf16 or fp16: keep an fp32 master copy of this rank's chunks (sharded like
  /// the optimizer state), let the optimizer step the masters and round them into the parameters
  /// after each step (DeepSpeed's BF16Optimizer: updates smaller than the weights' precision
  /// accumulate instead of rounding away). Gradients stay in the parameters' dtype and are
  /// reduced in fp32. No effect on fp32 parameters. Default: true.
  TORCH_ARG(bool, master_weights) = true;
  /// ZeRO-Offload (arXiv 2101.06840): the optimizer steps copies of this rank's chunks held in
  /// host memory (fp32 for bf16/fp16 parameters, else the parameters' dtype), so its state is
  /// created there too and the step runs on the CPU (volt's FusedAdamW is DeepSpeed's CPU-Adam
  /// idea). prepare_step() copies the reduced gradient chunks to the host; gather_parameters()
  /// copies the stepped chunks back into the parameters before all-gathering them. For
  /// accelerator parameters the host copies are pinned (page-locked) and both copies are
  /// asynchronous, waited for once per direction. On host parameters it only adds a copy and
  /// changes no value. Default: false.
  TORCH_ARG(bool, offload_optimizer) = false;
  /// Stage 3, ZeRO-Offload's offload_param: this rank's chunks of the partitioned parameters
  /// (the shard) live in pinned host memory instead of the parameters' device, and a gather
  /// copies them to the device before all-gathering them there; the device holds only the
  /// parameters gathered at the moment. Accelerator parameters need offload_optimizer too (the
  /// optimizer then steps host masters of the host chunks). On host parameters nothing moves.
  /// Default: false.
  TORCH_ARG(bool, offload_parameters) = false;
  /// A parameter whose gradient hook did not fire in a backward that reduces (the forward did
  /// not use it): true counts it as a zero gradient, as DeepSpeed does by default (so the
  /// optimizer still steps it: weight decay moves it, unlike DDP and single-process training,
  /// where its gradient stays undefined and the optimizer skips it); false throws a ValueError
  /// naming it, after the reductions (DeepSpeed's zero_optimization.ignore_unused_parameters).
  /// Default: true.
  TORCH_ARG(bool, ignore_unused_parameters) = true;
};

std::ostream& operator<<(std::ostream& os, const ZeroEngineOptions& o);

/// Bytes one rank holds for the model, counted from the tensors' storages (each storage once).
struct ZeroMemory {
  int64_t parameters = 0;       ///< module parameters (full in stages 1 and 2)
  int64_t gradients = 0;        ///< full gradients (stage 1) or this rank's reduced chunks
  int64_t optimizer_state = 0;  ///< the optimizer's per-parameter state tensors
  int64_t master_weights = 0;   ///< master chunks in RAM (fp32 masters of bf16/fp16
                                ///< parameters, offload_optimizer's host copies), else 0
  /// Optimizer state swapped out to NVMe swap files (not in RAM; DeepSpeedStrategy::memory),
  /// with the fp32 masters when there are some (they swap with their state).
  int64_t optimizer_state_in_files = 0;
  /// Stage 3 parameter chunks in the param_swap_file (not in RAM) now.
  int64_t parameters_in_files = 0;
};

/// One parameter as the engine partitions it.
struct ZeroChunk {
  std::string name;          ///< the parameter's name in the module
  int64_t group = 0;         ///< the optimizer param group it belongs to
  bool partitioned = false;  ///< stage 3: the module keeps no copy; `view` is this rank's chunk
  int64_t unit = -1;         ///< stage 3: the gather unit (the parameters of one module)
  at::Tensor parameter;      ///< the module's (full) parameter
  int64_t numel = 0;         ///< elements of the full parameter
  int64_t chunk = 0;         ///< elements per rank: ceil(numel / world_size)
  int64_t start = 0;         ///< this rank's first element: rank * chunk (may be >= numel)
  int64_t length = 0;        ///< this rank's elements: min(chunk, numel - start), >= 0
  at::Tensor view;           ///< what the optimizer steps: parameter.view(-1)[start, start+length),
                             ///< or this rank's stored chunk when partitioned (undefined when
                             ///< length == 0)
  at::Tensor master;         ///< master weights: the copy of `view` that the optimizer steps,
                             ///< fp32 for 16-bit parameters, in host memory with
                             ///< offload_optimizer (undefined without master weights or
                             ///< offload, or when length == 0)
  /// What the optimizer steps: `master` when there is one, else `view`.
  const at::Tensor& stepped() const { return master.defined() ? master : view; }
};

/// Partitions one optimizer across the ranks of a group. The optimizer's param groups are
/// rewired in place: each parameter is replaced by this rank's chunk of it, a view into the
/// module's parameter, so the optimizer keeps state for 1/world_size of the model and its step
/// updates the module's own memory; hyper-parameters, schedulers and the optimizer object stay
/// the user's. Every rank must build it with the same parameters in the same order (checked).
/// Elementwise optimizers (SGD, Adam, AdamW, RMSprop, Adagrad, FusedSGD, FusedAdamW) give the
/// same result as unpartitioned training; ones that look across elements of a tensor would not.
class ZeroEngine {
 public:
  /// `names` maps each parameter's TensorImpl to its module name (for errors and checkpoints).
  ZeroEngine(torch::optim::Optimizer& optimizer, std::shared_ptr<ProcessGroup> group,
             ZeroEngineOptions options, const std::map<const c10::TensorImpl*, std::string>& names);
  /// ZeRO-Inference: stage 3 without an optimizer, for a model that is only evaluated. Each rank
  /// keeps its chunks of `parameters` (dense floating-point module parameters, frozen ones too;
  /// the persistence threshold and param_swap_file apply as in training) and gathers a module's
  /// parameters while an op reads them inside a Scope. Nothing is reduced or stepped: no
  /// gradient hooks, no master weights, and backward() is a ValueError. ConfigError unless
  /// options.stage() is 3 (stages 1 and 2 partition nothing a forward reads).
  ZeroEngine(const std::vector<at::Tensor>& parameters, std::shared_ptr<ProcessGroup> group,
             ZeroEngineOptions options, const std::map<const c10::TensorImpl*, std::string>& names);
  ~ZeroEngine();
  /// Whether an optimizer steps the chunks (false for a ZeRO-Inference engine).
  bool trains() const { return optimizer_ != nullptr; }
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  /// Stage 3: while a scope is open, an op that reads a partitioned parameter gathers it (one
  /// all-gather for its module's parameters) on every rank; when the outermost scope closes, all
  /// gathered parameters are released. Outside scopes such a read is a ValueError (it would
  /// need a collective that other ranks do not join). Open one around every forward and
  /// backward; a no-op in stages 1 and 2.
  class Scope {
   public:
    explicit Scope(ZeroEngine& engine);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    ZeroEngine& engine_;
    bool outer_;
  };
  /// param_swap_file: holds this rank's parameter chunks (ZeroChunk::view of partitioned
  /// parameters) in memory while it lives, e.g. to save or load them; on destruction they are
  /// written back to the file (when it read them in) and released. A no-op otherwise.
  class Resident {
   public:
    explicit Resident(ZeroEngine& engine);
    /// A failed write-back keeps the shard in memory (logged): nothing is lost.
    ~Resident();
    Resident(const Resident&) = delete;
    Resident& operator=(const Resident&) = delete;

   private:
    ZeroEngine& engine_;
    bool swapped_in_;
  };
  /// Whether the partitioned parameters' chunks are in memory (always, without a swap file).
  bool parameters_resident() const;

  /// Stage 3: gathers every parameter for good and stops partitioning them (the end of a run);
  /// collective. When the group is broken the parameters are filled with NaN instead, so that
  /// nothing reads freed memory.
  void restore_parameters();

  /// Runs `run_backward` with the gradient hooks armed: each parameter's gradient, once
  /// complete, joins its bucket; full buckets are reduce-scattered in a fixed order (the same on
  /// every rank) and each rank keeps the mean of its chunks. `sync` = false (micro-batches that
  /// only accumulate) skips the reduction in stage 1; stage 2 reduces every backward so no full
  /// gradient outlives it.
  void backward(const std::function<void()>& run_backward, bool sync);
  /// Whether a synced backward gave the chunks their reduced gradients (since zero_grad).
  bool has_gradients() const { return have_grads_; }
  /// Before clipping and the optimizer step: gives the fp32 masters the reduced gradients as
  /// fp32 (master weights only; these exist until the step, the formulas' transient).
  /// param_swap_file: reads the whole shard in for the step, unless `by_sub_group` (the
  /// optimizer steps sub-group by sub-group and the *_step_chunks calls below bring each one's
  /// chunks in and out).
  void prepare_step(bool by_sub_group = false);
  /// param_swap_file, the step by sub-group (ZeRO-Infinity's swapping of parameters with their
  /// sub-group): only the chunks of the sub-groups in flight are in memory. Each call takes what
  /// the optimizer steps (ZeroChunk::stepped()); chunks that are not partitioned, and a shard in
  /// memory, are left alone. read_step_chunks submits the reads of those chunks;
  /// hold_step_chunks waits for every read and write submitted and points the chunks read at
  /// their buffers (the optimizer and round_masters write them there); write_step_chunks submits
  /// their writes back into the file and releases them (complete at the next hold or finish).
  void read_step_chunks(const std::vector<at::Tensor>& stepped);
  void hold_step_chunks();
  void write_step_chunks(const std::vector<at::Tensor>& stepped);
  /// Writes back whatever is still held (a step that threw) and waits; gather_parameters()
  /// calls it. A no-op without a swap file.
  void finish_step_chunks();
  /// After the optimizer stepped the chunks: rounds the masters into the parameters' chunks
  /// (master weights), then all-gathers the chunks into every rank's parameters (stage 3: only
  /// the persistent ones; the others are gathered when next read).
  void gather_parameters();
  /// Whether the optimizer steps master copies of the chunks (ZeroChunk::master): fp32 masters
  /// of 16-bit parameters, or the host copies of offload_optimizer.
  bool has_master_weights() const { return masters_; }
  /// Master weights: rounds the masters among `stepped` (what the optimizer just stepped) into
  /// their parameter chunks now, while they are in memory. An NVMe optimizer swapper calls it
  /// per sub-group before swapping those masters out; gather_parameters() rounds the rest.
  void round_masters(const std::vector<at::Tensor>& stepped);
  /// Master weights, at the end of a run: all-gathers the fp32 masters into the (whole)
  /// parameters, e.g. after the module was cast back to fp32; collective. Call after
  /// restore_parameters().
  void write_master_weights();
  /// Master weights: sets each master from its parameter chunk (after the parameters were
  /// loaded from a checkpoint that holds no masters).
  void reset_master_weights();
  /// Scales the chunks' gradients so that the norm over all ranks' chunks is at most `max_norm`
  /// (torch's clip_grad_norm_ semantics); returns that total norm.
  double clip_grad_norm(double max_norm, double norm_type);
  /// Drops the gradients (stage 2 zeroes its chunk buffers in place).
  void zero_grad();
  /// The optimizer step (taken or skipped) ended the accumulation window: the next backward
  /// starts from zero gradients even when zero_grad() was not called in between, as DeepSpeed's
  /// engine.step() clears them itself. Until then the step's gradients stay readable
  /// (on_before_zero_grad). An optimizer_zero_grad override calling optimizer.zero_grad() reaches
  /// only this rank's chunk views, not the full gradients (stage 1) or the shard they alias.
  void end_window() { window_ended_ = true; }

  const std::vector<ZeroChunk>& chunks() const { return chunks_; }
  /// Stage 2: the reduced gradient accumulated for chunks()[i] since the last zero_grad, a
  /// writable view (undefined in stage 1 and for chunks of length 0).
  at::Tensor gradient_chunk(size_t i) const;
  int64_t stage() const { return options_.stage(); }
  int64_t rank() const;
  int64_t world_size() const;
  /// Exact bytes of parameters, gradients and optimizer state this rank holds now.
  ZeroMemory memory() const;
  /// Counters of the communication overlap and the parameter swapping (tests, benchmarks).
  struct CommStats {
    int64_t reductions = 0;          ///< gradient buckets reduced
    int64_t overlapped = 0;          ///< of them, started before backward had finished
    int64_t gathers = 0;             ///< stage 3: unit gathers installed
    int64_t prefetched = 0;          ///< of them, started ahead of the read (prefetch hits)
    int64_t prefetch_discarded = 0;  ///< prefetches started but not read before the scope closed
    int64_t prefetch_reads = 0;      ///< param_swap_file: prefetches whose file read was
                                     ///< submitted ahead (asynchronous, overlapping compute)
    int64_t step_chunk_peak = 0;     ///< param_swap_file: most elements of parameter chunks in
                                     ///< memory at once during the last optimizer step (the
                                     ///< whole shard unless it stepped by sub-group)
  };
  const CommStats& comm_stats() const { return stats_; }

 private:
  friend struct ZeroGather;
  struct Unit {
    std::vector<size_t> chunks;  // indices into chunks_, consecutive
    int64_t offset = 0;          // first element in param_shard_
    int64_t width = 0;           // elements in param_shard_ (sum of padded chunks)
    int64_t numel = 0;           // elements of the full parameters
    bool live = false;
    uint64_t last_use = 0;
    size_t pending = 0;   // gradients not yet produced in this backward
    uint64_t pinned = 0;  // the op (serial) reading it now: not evicted for that op
  };
  // Both constructors: `groups` are the optimizer's parameter groups (one group for inference).
  void partition(const std::vector<std::vector<at::Tensor>>& groups,
                 const std::map<const c10::TensorImpl*, std::string>& names);
  void partition_parameters();
  // Waits until the work queued on the parameters' device (its current stream) is done.
  void wait_for_device() const;
  void on_access(size_t unit, bool writes, const char* op);
  void gather(size_t unit);
  void release(size_t unit);
  void release_all();
  void unregister();
  void on_gradient(size_t index);
  void launch_bucket(size_t bucket);
  void complete_bucket();
  void reduce_alone(size_t first, size_t last);
  void finish_backward();
  void record_access(size_t unit);
  // param_swap_file: reads the shard in (true when it was out) / writes it and releases it.
  bool swap_in_shard();
  void swap_out_shard();
  at::Tensor read_shard_range(int64_t offset, int64_t width);   // waits for the read
  at::Tensor submit_shard_read(int64_t offset, int64_t width);  // the buffer; read in flight
  std::vector<size_t> swapped_chunks_of(const std::vector<at::Tensor>& stepped) const;
  void prefetch_after(size_t unit);
  void drop_prefetches();
  void start_read_prefetches();
  // All-gathers source(chunk) (its `length` elements) of every chunk into the parameters, in
  // buckets of allgather_bucket_size; stage 3's partitioned ones only when asked. Every rank
  // sends `wire` tensors (dtype and device), also a rank that owns no element of a bucket and
  // so has no source to take them from.
  void all_gather_into_parameters(const std::function<at::Tensor(const ZeroChunk&)>& source,
                                  const at::TensorOptions& wire, bool partitioned_too);

  torch::optim::Optimizer* optimizer_;  // nullptr: ZeRO-Inference
  std::shared_ptr<ProcessGroup> group_;
  ZeroEngineOptions options_;
  std::vector<ZeroChunk> chunks_;
  // Buckets: ranges [first, last) of chunks_, assigned from the last parameter backwards (the
  // order gradients become ready), reduced strictly in index order on every rank.
  std::vector<std::pair<size_t, size_t>> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<size_t> pending_;  // per bucket: gradients not yet ready in this backward
  std::vector<bool> ready_;      // per chunk, in this backward
  size_t next_bucket_ = 0;       // the next bucket to reduce
  bool armed_ = false;           // hooks act only inside backward()
  bool have_grads_ = false;
  bool window_ended_ = false;           // end_window() since the last zero_grad()
  at::Tensor grad_shard_;               // stage 2: this rank's reduced chunks, flat
  std::vector<at::Tensor> grad_views_;  // stage 2: per chunk, a view into grad_shard_
  struct Hooks;
  std::unique_ptr<Hooks> hooks_;
  struct Comm;  // collectives in flight (reductions, prefetches) and the learned access order
  std::unique_ptr<Comm> comm_;
  struct Swap;  // param_swap_file: the file and whether the shard is out
  std::unique_ptr<Swap> swap_;
  CommStats stats_;
  bool masters_ = false;              // ZeroChunk::master holds each chunk's fp32 or host copy
  at::TensorOptions master_options_;  // the masters' dtype and device (every rank's)
  bool pinned_masters_ = false;       // offloaded masters of accelerator parameters: pinned
  // The parameters' device (every parameter's: checked at construction).
  c10::Device device_ = c10::Device(c10::kCPU);
  // A piece of the shard (or a buffer read from its file) on device_, for an all-gather: the
  // piece itself when it is there already, unless `fresh` asks for a copy (a prefetch, which a
  // dropped gather may still read after the shard changed); with offload_parameters, a copy
  // from pinned host memory to the device.
  at::Tensor for_gather(const at::Tensor& piece, bool fresh) const;
  // Stage 3.
  at::Tensor param_shard_;             // this rank's chunks of the partitioned parameters, padded
  std::vector<int64_t> shard_offset_;  // per chunk: its offset in param_shard_
  std::vector<Unit> units_;
  int64_t live_elements_ = 0;
  uint64_t clock_ = 0;
  int scope_depth_ = 0;
  bool partitioning_ = false;  // stage 3 and not yet restored
};

}  // namespace volt
