#pragma once
/// Fabric: Lightning Fabric in C++ — volt's accelerators, strategies, precisions and checkpoint
/// IO for a training loop the program writes itself. The Trainer owns the loop; Fabric hands its
/// pieces to a loop you keep: launch the processes, set up the module and optimizers, shard the
/// loaders, then `backward`, `step`, collectives and checkpoints go through the strategy and the
/// precision exactly as the Trainer's do.
///
///   volt::Fabric fabric(volt::FabricOptions().devices(2).precision("bf16-mixed"));
///   fabric.launch();                    // devices 2: this binary runs again as local rank 1
///   auto model = std::make_shared<Net>();
///   auto opt = std::make_shared<torch::optim::SGD>(model->parameters(), 0.1);
///   fabric.setup(model, {opt});         // rank 0's weights everywhere, DDP's gradient buckets
///   volt::DataLoader train = fabric.setup_dataloader(loader);  // this rank's shard
///   for (int64_t epoch = 0; epoch < 3; ++epoch) {
///     volt::BatchStream s = train.stream(epoch);
///     for (volt::Batch b; s.next(b);) {
///       b = fabric.to_device(b);
///       at::Tensor loss;
///       {
///         auto forward = fabric.forward_context(model);  // autocast, DDP's buffers
///         loss = torch::mse_loss(model->forward(b.input), b.target);
///       }
///       fabric.backward(loss);          // gradients averaged over the ranks
///       fabric.step(*opt);              // unscale / clip / step through the precision
///       fabric.zero_grad(*opt);
///     }
///   }
///
/// Strategies: "auto", "single_device", "ddp", ZeRO's "deepspeed*" (engines per module; forwards
/// in forward_context, clipping by the DeepSpeed config) and "pipeline" (one module holding one
/// volt::Pipeline, a stage per process), by name or as an object with its options.
///
/// Departures from Lightning, where C++ differs: `setup` leaves the module and optimizers as
/// they are (no wrapper objects), so the training forward runs under `forward_context(module)`
/// (what Lightning's wrapped forward does itself: the precision's autocast, DDP's buffer
/// broadcast and SyncBatchNorm), the optimizer steps through `step(optimizer)` (Lightning's
/// wrapped optimizer.step), and batches move with `to_device`.
/// Several modules, each set up with its own optimizers (a GAN's generator and discriminator),
/// keep their own gradient buckets; `backward` finds the ones a loss reaches in its graph.

#include <ATen/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/util/Optional.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "volt/accelerators/accelerator.h"
#include "volt/core/batch.h"
#include "volt/core/spec.h"
#include "volt/core/types.h"
#include "volt/data/data_loader.h"
#include "volt/io/checkpoint_io.h"
#include "volt/loggers/logger.h"
#include "volt/precision/precision.h"
#include "volt/strategies/strategy.h"

namespace volt {

class Module;
class LRScheduler;
namespace detail {
class FabricRun;
}

/// The base of the objects Fabric::call reaches (Lightning Fabric's `callbacks`). A callback
/// declares its hooks as member functions, usually through interfaces of the program's own
/// derived virtually from this class (so one callback may implement several):
///
///   struct EpochHooks : virtual volt::FabricCallback {
///     virtual void on_train_epoch_end(int64_t epoch, double loss) {}
///   };
///   struct Printer : EpochHooks {
///     void on_train_epoch_end(int64_t epoch, double loss) override { ... }
///   };
///   volt::Fabric fabric(volt::FabricOptions().callbacks({std::make_shared<Printer>()}));
///   fabric.call(&EpochHooks::on_train_epoch_end, epoch, loss);
class FabricCallback {
 public:
  virtual ~FabricCallback() = default;
};

/// Lightning Fabric's constructor arguments (the Trainer's names and defaults).
struct FabricOptions {
  /// "auto" (cuda when available, else cpu), "cpu", "cuda", or an Accelerator object.
  TORCH_ARG(Spec<Accelerator>, accelerator) = "auto";
  /// Processes per node (on the CPU: N processes; on CUDA: N GPUs); -1: every device.
  TORCH_ARG(int64_t, devices) = 1;
  TORCH_ARG(int64_t, num_nodes) = 1;
  /// "auto" (ddp for several processes, else single_device), "single_device", "ddp", "deepspeed*",
  /// "pipeline", or a strategy object with its options (DdpStrategy, DeepSpeedStrategy, ...).
  TORCH_ARG(Spec<Strategy>, strategy) = "auto";
  /// "32-true", "bf16-mixed", "bf16-true", "16-mixed" (CUDA), "64-true", "fp8" (or Lightning's
  /// short names "32", "bf16", "16", "64"), or a Precision object.
  TORCH_ARG(Spec<Precision>, precision) = "32-true";
  /// Where save / load read and write (default: the strategy's TorchCheckpointIO).
  TORCH_ARG(std::shared_ptr<CheckpointIO>, checkpoint_io);
  /// Receive log / log_dict on global rank 0 (Lightning's loggers argument).
  TORCH_ARG(std::vector<std::shared_ptr<Logger>>, loggers);
  /// What call() reaches, in this order (Lightning's callbacks argument).
  TORCH_ARG(std::vector<std::shared_ptr<FabricCallback>>, callbacks);
  /// BatchNorm over the whole data-parallel batch (the Trainer's sync_batchnorm; Lightning
  /// Fabric's users convert the model with torch.nn.SyncBatchNorm first): with several
  /// processes, the BatchNorm1d/2d/3d layers of each set-up module normalize by every rank's
  /// statistics in forwards run inside forward_context(module). A backward through a
  /// training-mode BatchNorm layer (one with a weight) that ran outside it, or through a module
  /// that never ran inside it, is a ConfigError naming the layer or module. One process:
  /// nothing changes.
  TORCH_ARG(bool, sync_batchnorm) = false;
};

/// What Fabric::save writes and Fabric::load reads back (Lightning's `state` dict): named
/// references to the set-up module and its optimizers, learning-rate schedulers, tensors, and
/// plain values. load() restores the module, optimizers, schedulers and tensors in place and the
/// values in this object. The precision's state (16-mixed's loss scale) is saved with every file
/// and restored when the state names an optimizer (a resumed training), so the scale goes on
/// from where it was.
class FabricState {
 public:
  /// A module given to Fabric::setup. The first goes where a Trainer checkpoint has its weights
  /// (volt::load_weights reads it), the others beside it under their names.
  FabricState& module(const std::string& name, torch::nn::Module& module);
  template <typename M>
  FabricState& module(const std::string& name, const torch::nn::ModuleHolder<M>& holder) {
    return module(name, *holder.ptr());
  }
  /// An optimizer given to Fabric::setup.
  FabricState& optimizer(const std::string& name, torch::optim::Optimizer& optimizer);
  /// A volt learning-rate scheduler (volt/optim/lr_scheduler.h), e.g. of a set-up optimizer
  /// (Lightning saves any object with a state_dict).
  FabricState& scheduler(const std::string& name, LRScheduler& scheduler);
  /// A tensor kept outside the module (an EMA copy, a counter on the device); load() copies the
  /// saved values into it when the shapes and dtypes agree, else replaces it.
  FabricState& tensor(const std::string& name, at::Tensor& tensor);
  /// A plain value (an iteration count, a best score); value() reads it after load().
  FabricState& value(const std::string& name, c10::IValue value);
  const c10::IValue& value(const std::string& name) const;

 private:
  friend class Fabric;
  void check_new(const std::string& name) const;
  std::vector<std::pair<std::string, torch::nn::Module*>> modules_;
  std::vector<std::pair<std::string, torch::optim::Optimizer*>> optimizers_;
  std::vector<std::pair<std::string, LRScheduler*>> schedulers_;
  std::vector<std::pair<std::string, at::Tensor*>> tensors_;
  std::map<std::string, c10::IValue> values_;
};

class Fabric {
 public:
  /// Resolves the accelerator, strategy and precision at once (ConfigError for an unknown name
  /// or a strategy Fabric does not run, NotAvailable for missing hardware).
  explicit Fabric(FabricOptions options = {});
  /// Tears the strategy down (DDP: rank 0 waits for the processes it launched) and finalizes
  /// the loggers. On the way out of an exception, or when the program marked the run failed
  /// (strategy().set_run_failed(true): it caught an error and gives up), nothing collective runs
  /// (the other ranks may be gone) and the loggers are told the run failed.
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  /// Starts the processes and joins the process group (Lightning's launch()). With devices > 1
  /// on a plain process, the binary runs again as local ranks 1..N-1 (the same argv; the
  /// program's main runs from the start in each, so everything before launch() runs N times),
  /// and this process goes on as rank 0; under torchrun, Slurm or mpirun the ranks exist
  /// already. Called by every method that needs it; a second call does nothing.
  void launch();

  int64_t global_rank();
  int64_t local_rank();
  int64_t node_rank();
  int64_t world_size();
  bool is_global_zero();
  /// The device this process trains on.
  c10::Device device();
  Strategy& strategy() { return *strategy_; }

  /// Build the model inside the returned object's life (Lightning's fabric.init_module()): its
  /// parameters and buffers are made in the dtype the precision trains them in (bf16-true:
  /// bfloat16), so a large model never holds an fp32 copy; nothing changes under the precisions
  /// whose weights stay fp32. Departure: C++ has no default device, so the tensors are made on
  /// the CPU and setup() moves them (a CUDA run's model passes through host memory). The dtype
  /// is the process's default while the object lives (as torch.set_default_dtype): build on one
  /// thread, with no other thread making tensors meanwhile. `empty_init`: the parameters'
  /// initializers do not run (volt::EmptyInit, volt/nn/empty_init.h), for a model whose
  /// weights a checkpoint replaces next (`fabric.load`); Lightning's default (None) is false
  /// under every volt strategy.
  ///
  ///   std::shared_ptr<Net> model;
  ///   {
  ///     auto init = fabric.init_module();
  ///     model = std::make_shared<Net>();  // bfloat16 parameters under "bf16-true"
  ///   }
  [[nodiscard]] std::shared_ptr<void> init_module(bool empty_init = false);
  /// The same for tensors the loop makes (Lightning's fabric.init_tensor()).
  [[nodiscard]] std::shared_ptr<void> init_tensor();

  /// Takes `module` (moved to the device, converted by the precision, every rank starting from
  /// rank 0's parameters and buffers; DDP's gradient buckets over the parameters that require a
  /// gradient) and its optimizers. Every optimizer parameter must be one of the module's
  /// (ConfigError: DDP would not average its gradient). Call it once per module: several
  /// modules (a generator and a discriminator) each keep their own buckets and optimizers; a
  /// module set up already, or one sharing a parameter with one, is a ConfigError (set up the
  /// module that holds both instead). A module set up without optimizers is only evaluated (a
  /// distillation teacher): under ZeRO stage 3 its weights are partitioned alone
  /// (ZeRO-Inference) and no backward reduces its gradients. A volt::Module is used as it is and
  /// attached to this Fabric while both live, so its training_step can be called from the loop
  /// (Lightning's LightningModule under Fabric): log() / log_dict() reach the loggers on rank 0
  /// at the step count (the optimizer steps taken through step(); sync_dist reduces over the
  /// ranks; epoch aggregation is the loop's business), callback_metrics() holds the latest
  /// values, manual_backward() is backward(), optimizers() / manual steps / clip_gradients() /
  /// all_gather() and the rank queries go through this Fabric; what needs the Trainer's loop
  /// (save_checkpoint, request_stop, estimated_stepping_batches, ...) is a ConfigError saying so.
  void setup(const std::shared_ptr<torch::nn::Module>& module,
             const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers = {});
  template <typename M>
  void setup(const torch::nn::ModuleHolder<M>& module,
             const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers = {}) {
    setup(std::static_pointer_cast<torch::nn::Module>(module.ptr()), optimizers);
  }
  /// `loader` over this rank's shard (a distributed sampler; unchanged in one process). Each
  /// epoch's order comes from stream(epoch), as set_epoch gives a DistributedSampler.
  DataLoader setup_dataloader(const DataLoader& loader);
  /// The batch on this process's device (no copy when it is there already), its floating-point
  /// inputs converted as the precision wants them (bf16-true: bfloat16), as the Trainer hands
  /// batches to training_step. The tensor form only moves the tensor.
  Batch to_device(const Batch& batch);
  at::Tensor to_device(const at::Tensor& tensor);

  /// What Lightning's wrapped forward does around a forward of `module`, while the returned
  /// object lives: the strategy's part (DDP: rank 0's buffers broadcast to every rank, as DDP's
  /// broadcast_buffers; SyncBatchNorm with the sync_batchnorm option; ZeRO stage 3: partitioned
  /// parameters gathered as the forward reads them), then the precision's autocast. Run the
  /// forward and the loss inside it (under ZeRO stage 3, evaluations too). Every rank must enter
  /// it for the same forwards (it may broadcast). `module` must be set up (ConfigError).
  [[nodiscard]] std::shared_ptr<void> forward_context(torch::nn::Module& module);
  template <typename M>
  [[nodiscard]] std::shared_ptr<void> forward_context(const std::shared_ptr<M>& module) {
    return forward_context(*checked(module.get(), "forward_context()"));
  }
  template <typename M>
  [[nodiscard]] std::shared_ptr<void> forward_context(const torch::nn::ModuleHolder<M>& module) {
    return forward_context(*checked(module.ptr().get(), "forward_context()"));
  }
  /// The precision's forward context alone (bf16 / fp16 autocast, fp8 regions) while the
  /// returned object lives; nothing for 32-true and bf16-true (Lightning's fabric.autocast()).
  /// For a forward through modules Fabric did not set up (a frozen teacher's logits) or an
  /// evaluation outside ZeRO stage 3; forward_context(module) includes it.
  [[nodiscard]] std::shared_ptr<void> autocast();
  /// Backpropagates `loss` through the precision (loss scaling) and the strategy (DDP averages
  /// the gradients over the ranks, overlapped with the backward), calling the module's backward
  /// hook when it is a volt::Module. With several modules set up, the ones whose parameters the
  /// loss reaches are found in its autograd graph (a discriminator loss over a detached fake
  /// leaves the generator out) and have their gradients averaged, the first of them (in setup
  /// order) giving the backward hook; every rank's loss must reach the same modules, as under
  /// PyTorch's DDP.
  void backward(const at::Tensor& loss);
  /// backward(loss) that also averages the gradients of `modules` (set up; references,
  /// shared_ptrs or holders, any number): modules the loss reaches where its graph cannot show
  /// them, i.e. run wholly inside volt::checkpoint, whose parameters join the graph only when
  /// backward recomputes (Lightning's backward(loss, model=...)). A set-up module that gets
  /// gradients from a backward which neither found nor named it is a ConfigError after that
  /// backward, with several processes (its gradients were not averaged).
  ///   fabric.backward(loss, encoder);  // encoder ran under volt::checkpoint
  template <typename... M>
  void backward(const at::Tensor& loss, const M&... modules) {
    backward_with(loss, {module_of(modules)...});
  }
  /// While the returned guard lives, backward() only accumulates `module`'s gradients (no
  /// all-reduce): the micro-batches of a gradient accumulation but the last (Lightning's
  /// no_backward_sync(module)); the other set-up modules sync as usual. The form without a
  /// module covers every set-up module. With enabled false it changes nothing.
  class NoBackwardSync {
   public:
    NoBackwardSync(NoBackwardSync&& other) noexcept;
    NoBackwardSync(const NoBackwardSync&) = delete;
    NoBackwardSync& operator=(const NoBackwardSync&) = delete;
    NoBackwardSync& operator=(NoBackwardSync&&) = delete;
    ~NoBackwardSync();

   private:
    friend class Fabric;
    NoBackwardSync(bool* sync, bool enabled);
    bool* sync_;
    bool previous_;
  };
  [[nodiscard]] NoBackwardSync no_backward_sync(bool enabled = true);
  [[nodiscard]] NoBackwardSync no_backward_sync(torch::nn::Module& module, bool enabled = true);
  template <typename M>
  [[nodiscard]] NoBackwardSync no_backward_sync(const std::shared_ptr<M>& module,
                                                bool enabled = true) {
    return no_backward_sync(*checked(module.get(), "no_backward_sync()"), enabled);
  }
  template <typename M>
  [[nodiscard]] NoBackwardSync no_backward_sync(const torch::nn::ModuleHolder<M>& module,
                                                bool enabled = true) {
    return no_backward_sync(*checked(module.ptr().get(), "no_backward_sync()"), enabled);
  }
  /// One optimizer step through the precision: gradients unscaled (loss scaling), then the step;
  /// false when the precision skipped it (inf/NaN gradients under loss scaling).
  bool step(torch::optim::Optimizer& optimizer);
  /// Sets the optimizer's gradients to none (in place to zero under gradient_as_bucket_view).
  /// ConfigError for an optimizer setup() did not take, as step().
  void zero_grad(torch::optim::Optimizer& optimizer);
  /// Clips the optimizer's gradients (unscaled first under loss scaling): by total norm
  /// (returned, a 0-dim tensor not read on the host) or by value (an undefined tensor).
  at::Tensor clip_gradients(torch::optim::Optimizer& optimizer, double value,
                            ClipAlgorithm algorithm = ClipAlgorithm::kNorm);

  /// `value` reduced over the ranks (Lightning's default: the mean); every rank gets it.
  at::Tensor all_reduce(const at::Tensor& value, Reduce op = Reduce::kMean);
  /// Every rank's `value`, stacked along a new first dimension of size world_size.
  at::Tensor all_gather(const at::Tensor& value);
  /// Rank `src`'s value on every rank, with its shape and dtype: the other ranks' `value` is a
  /// placeholder of any shape or dtype, or undefined (as Lightning's broadcast(obj, src), whose
  /// other ranks' obj is ignored). Rank src's value must be a defined dense tensor of at most
  /// 16 dimensions; otherwise every rank gets the ValueError.
  ///   at::Tensor best = fabric.broadcast(rank == 0 ? chosen : at::Tensor());
  at::Tensor broadcast(const at::Tensor& value, int64_t src = 0);
  void barrier(const std::string& name = "");
  /// While the returned guard lives, rank 0 runs alone; the other ranks start the same block
  /// when it has left it (Lightning's rank_zero_first: rank 0 downloads or prepares a data set,
  /// the others then read it). local: the first process of each node goes first instead. The
  /// others wait at a barrier, so rank 0's block must end within the process group's timeout
  /// (DdpStrategyOptions::timeout); when it throws, its guard does not wait and the waiting
  /// ranks fail when its process ends. In one process it changes nothing.
  class RankZeroFirst {
   public:
    RankZeroFirst(RankZeroFirst&& other) noexcept;
    RankZeroFirst(const RankZeroFirst&) = delete;
    RankZeroFirst& operator=(const RankZeroFirst&) = delete;
    RankZeroFirst& operator=(RankZeroFirst&&) = delete;
    ~RankZeroFirst() noexcept(false);

   private:
    friend class Fabric;
    RankZeroFirst(Fabric* fabric, bool first);
    Fabric* fabric_;
    bool first_;
    int exceptions_;  // uncaught exceptions when the block began
  };
  [[nodiscard]] RankZeroFirst rank_zero_first(bool local = false);

  /// Calls `hook` with `args` on each of the options' callbacks that is a `C` (derives from the
  /// class that declares the hook), in their order; the others are skipped (Lightning's
  /// call(hook_name, ...) skips callbacks without a method of that name).
  /// What a hook returns is dropped, as Lightning's call does.
  template <typename R, typename C, typename... Params, typename... Args>
  void call(R (C::*hook)(Params...), Args&&... args) {
    call_each<C>([&](C& c) { (c.*hook)(args...); });
  }
  template <typename R, typename C, typename... Params, typename... Args>
  void call(R (C::*hook)(Params...) const, Args&&... args) {
    call_each<C>([&](C& c) { (c.*hook)(args...); });
  }

  /// Prints on the first process of each node, local rank 0 (Lightning's Fabric.print), a line
  /// per call: each machine's console gets the line once.
  void print(const std::string& text);
  /// Sends metrics to the loggers (global rank 0 only; other ranks return at once) at `step`,
  /// by default the optimizer steps taken so far through step() (Lightning's loggers count
  /// their own calls instead). The tensor form reads a one-element tensor on rank 0.
  void log(const std::string& name, double value, c10::optional<int64_t> step = c10::nullopt);
  void log(const std::string& name, const at::Tensor& value,
           c10::optional<int64_t> step = c10::nullopt);
  void log_dict(const Metrics& metrics, c10::optional<int64_t> step = c10::nullopt);

  /// Writes `state` to `path` (global rank 0 writes, atomically through the CheckpointIO; every
  /// rank then waits at a barrier, so the file is complete wherever save returns). The state's
  /// first module goes where a Trainer checkpoint has its weights, so volt::load_weights and the
  /// Trainer's validate / test / predict with a ckpt_path read it (a Trainer's fit cannot resume
  /// from it: it holds no loop state). Entry names are non-empty, without '/', distinct, and
  /// not a word TorchScript reserves (in, class, None, ...: ConfigError when named).
  void save(const std::string& path, const FabricState& state);
  /// Reads `path` into `state` (every rank reads the file). strict: every entry of `state` must
  /// be in the file (CheckpointError naming the missing ones) and each module's weights must
  /// match it exactly; strict=false loads what is there and matches (Lightning's). Entries of
  /// the file that `state` lacks are left. The state's modules must have been set up first. A
  /// strict miss changes nothing; a module whose weights do not match the file (CheckpointError) is
  /// left as it was, but the modules before it in `state` are loaded by then: load again or rebuild
  /// them. A state naming an optimizer (a resumed training) also takes the file's step count
  /// (log()'s default step); weights alone leave it.
  void load(const std::string& path, FabricState& state, bool strict = true);

 private:
  template <typename C, typename F>
  void call_each(F&& f) {
    static_assert(std::is_base_of<FabricCallback, C>::value,
                  "Fabric::call reaches FabricCallback objects: declare the hook in a class "
                  "derived from volt::FabricCallback");
    for (const auto& cb : options_.callbacks()) {
      if (auto* c = dynamic_cast<C*>(cb.get())) f(*c);
    }
  }
  friend class detail::FabricRun;
  // One set-up module: the program's, the volt::Module the strategy holds, its optimizers and
  // what a volt::Module's log(), manual_backward(), optimizers() ... reach.
  struct SetUp;
  void check_set_up(const char* what) const;
  /// `module`, or a ConfigError naming `what` when it is null.
  static torch::nn::Module* checked(torch::nn::Module* module, const char* what);
  /// The set-up entry of `module`, or a ConfigError naming `what`.
  SetUp& set_up_for(const torch::nn::Module& module, const char* what) const;
  SetUp* set_up_of(const torch::nn::Module& module) const;
  SetUp* owner_of(const torch::optim::Optimizer& optimizer) const;
  void backward_with(const at::Tensor& loss, const std::vector<const torch::nn::Module*>& named);
  static const torch::nn::Module* module_of(const torch::nn::Module& module) { return &module; }
  template <typename M>
  static const torch::nn::Module* module_of(const std::shared_ptr<M>& module) {
    return checked(module.get(), "backward()");
  }
  template <typename M>
  static const torch::nn::Module* module_of(const torch::nn::ModuleHolder<M>& module) {
    return checked(module.ptr().get(), "backward()");
  }

  FabricOptions options_;
  std::shared_ptr<Precision> precision_;
  // Modules whose setup() failed part-way: the strategy may point at them (a split, a cast)
  // until its teardown, so they live until after it (declared before strategy_).
  std::vector<std::unique_ptr<SetUp>> failed_set_ups_;
  std::shared_ptr<Strategy> strategy_;
  bool launched_ = false;
  bool sync_ = true;
  std::vector<std::unique_ptr<SetUp>> set_up_;
  int64_t steps_ = 0;  // optimizer steps taken through step(): log()'s default step
};

}  // namespace volt
