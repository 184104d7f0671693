// Registers this folder's built-in names; called once from registry() (src/trainer/builtins.cpp).
#include "volt/core/registry.h"
#include "volt/strategies/ddp.h"
#include "volt/strategies/deepspeed.h"
#include "volt/strategies/model_parallel.h"
#include "volt/strategies/pipeline.h"
#include "volt/strategies/single_device.h"

namespace volt::detail {

void register_strategies(Registry& r) {
  r.strategies.add("single_device", "one process on one device",
                   [](const StrategyContext& c) -> std::shared_ptr<Strategy> {
                     return std::make_shared<SingleDeviceStrategy>(c.accelerator->device(0),
                                                                   c.accelerator, c.precision);
                   });
  const DdpStrategyOptions d;
  r.strategies.add(
      "ddp", "distributed data parallel: one process per device, gradients all-reduced (c10d)",
      Params()
          .add("bucket_cap_mb", d.bucket_cap_mb(), "gradient bucket size in MiB")
          .add("gradient_as_bucket_view", d.gradient_as_bucket_view(),
               "each .grad is a view into its bucket")
          .add("static_graph", d.static_graph(), "the used parameters never change")
          .add("find_unused_parameters", d.find_unused_parameters(),
               "find parameters without a gradient each step")
          .add("broadcast_buffers", d.broadcast_buffers(),
               "broadcast buffers from rank 0 before every training forward")
          .add("timeout_s", d.timeout_s(), "bound on rendezvous and every collective (seconds)")
          .add("max_restarts", d.max_restarts(),
               "relaunch the local workers after a failure, resuming from the last checkpoint")
          .choice("process_group_backend", d.process_group_backend(), {"auto", "gloo", "nccl"},
                  "collective backend; auto = gloo on cpu, nccl on cuda"),
      [](const Args& a, const StrategyContext& c) -> std::shared_ptr<Strategy> {
        return std::make_shared<DdpStrategy>(
            DdpStrategyOptions()
                .bucket_cap_mb(a.get<double>("bucket_cap_mb"))
                .gradient_as_bucket_view(a.get<bool>("gradient_as_bucket_view"))
                .static_graph(a.get<bool>("static_graph"))
                .find_unused_parameters(a.get<bool>("find_unused_parameters"))
                .static_graph(a.get<bool>("static_graph"))
                .broadcast_buffers(a.get<bool>("broadcast_buffers"))
                .timeout_s(a.get<double>("timeout_s"))
                .process_group_backend(a.get<std::string>("process_group_backend"))
                .max_restarts(a.get<int64_t>("max_restarts")),
            c.accelerator, c.precision, c.devices, c.num_nodes);
      });
  const PipelineStrategyOptions pl;
  r.strategies.add(
      "pipeline",
      "pipeline parallel: one process per device, each running one stage of the model's "
      "volt::Pipeline on micro-batches",
      Params()
          .add("chunks", pl.chunks(), "micro-batches per batch (0: the model's own setting)")
          .add("stages", pl.stages(),
               "stages per pipeline; the world size over it = data-parallel replicas (0: one "
               "pipeline of every process)")
          .add("checkpoint", pl.checkpoint(),
               "activation checkpointing per micro-batch: never, always or except_last (empty: "
               "the model's own setting)")
          .add("activation_checkpoint_interval", pl.activation_checkpoint_interval(),
               "checkpoint runs of this many layers of a stage (0: off; -1: the model's own "
               "setting)")
          .add("deferred_batch_norm", pl.deferred_batch_norm(),
               "the pipeline's BatchNorm entries move their running statistics once per batch, "
               "not per micro-batch (false: the model's own setting)")
          .add("release_other_stages", pl.release_other_stages(),
               "each rank frees the weights other stages train (false: every weight everywhere)")
          .add("timeout_s", pl.timeout_s(),
               "bound on rendezvous, every collective and transfer (seconds)")
          .choice("process_group_backend", pl.process_group_backend(), {"auto", "gloo", "nccl"},
                  "collective backend; auto = gloo on cpu, nccl on cuda"),
      [](const Args& a, const StrategyContext& c) -> std::shared_ptr<Strategy> {
        return std::make_shared<PipelineStrategy>(
            PipelineStrategyOptions()
                .chunks(a.get<int64_t>("chunks"))
                .stages(a.get<int64_t>("stages"))
                .checkpoint(a.get<std::string>("checkpoint"))
                .activation_checkpoint_interval(a.get<int64_t>("activation_checkpoint_interval"))
                .deferred_batch_norm(a.get<bool>("deferred_batch_norm"))
                .release_other_stages(a.get<bool>("release_other_stages"))
                .timeout_s(a.get<double>("timeout_s"))
                .process_group_backend(a.get<std::string>("process_group_backend")),
            c.accelerator, c.precision, c.devices, c.num_nodes);
      });
  const ModelParallelStrategyOptions mp;
  r.strategies.add(
      "model_parallel",
      "tensor parallel (Megatron-style split Linear/Embedding layers) x data parallel: "
      "consecutive ranks split the layers a plan names, the groups split the data",
      Params()
          .add("tensor_parallel_size", mp.tensor_parallel_size(),
               "ranks each split layer is split across; the world size over it = data-parallel "
               "size (0: the processes of one node)")
          .add("tp_plan", std::vector<std::string>{},
               "'pattern=colwise|colwise_qkv|rowwise|replicated' (module path glob)")
          .add("injection_policy", std::vector<std::string>{},
               "'Module: member, ...' (the members are row-parallel, the other Linears "
               "column-parallel)")
          .add("num_heads", mp.num_heads(),
               "attention heads (checked against the split; 0: unknown)")
          .add("partial_grads", std::vector<std::string>{},
               "whole parameters used on split activations (name globs): their gradients are "
               "summed over the tensor-parallel group")
          .add("bucket_cap_mb", mp.bucket_cap_mb(),
               "MiB per gradient bucket of the data-parallel replicas")
          .add("find_unused_parameters", mp.find_unused_parameters(),
               "search each backward for parameters without a gradient (not with activation "
               "checkpointing: use static_graph)")
          .add("static_graph", mp.static_graph(),
               "the used parameters and the gradient order never change")
          .add("save_distributed_checkpoint", mp.save_distributed_checkpoint(),
               "checkpoints are a folder of each tensor-parallel rank's shards (false: one file "
               "of the whole model, gathered on rank 0)")
          .add("timeout_s", mp.timeout_s(), "bound on rendezvous and every collective (seconds)")
          .choice("process_group_backend", mp.process_group_backend(), {"auto", "gloo", "nccl"},
                  "collective backend; auto = gloo on cpu, nccl on cuda"),
      [](const Args& a, const StrategyContext& c) -> std::shared_ptr<Strategy> {
        return std::make_shared<ModelParallelStrategy>(
            ModelParallelStrategyOptions()
                .tensor_parallel_size(a.get<int64_t>("tensor_parallel_size"))
                .plan(parse_tp_plan(a.get<std::vector<std::string>>("tp_plan")))
                .injection_policy(
                    parse_injection_policy(a.get<std::vector<std::string>>("injection_policy")))
                .num_heads(a.get<int64_t>("num_heads"))
                .partial_grads(a.get<std::vector<std::string>>("partial_grads"))
                .bucket_cap_mb(a.get<double>("bucket_cap_mb"))
                .find_unused_parameters(a.get<bool>("find_unused_parameters"))
                .static_graph(a.get<bool>("static_graph"))
                .save_distributed_checkpoint(a.get<bool>("save_distributed_checkpoint"))
                .timeout_s(a.get<double>("timeout_s"))
                .process_group_backend(a.get<std::string>("process_group_backend")),
            c.accelerator, c.precision, c.devices, c.num_nodes);
      });
  // DeepSpeed's names (Lightning's registry): one parameter set, different defaults.
  struct Variant {
    const char* name;
    int64_t stage;
    bool offload;
    const char* help;
    bool nvme = false;
  };
  for (const Variant& v : {Variant{"deepspeed", 2, false,
                                   "ZeRO sharded data parallel (stage 2 "
                                   "by default)"},
                           Variant{"deepspeed_stage_1", 1, false,
                                   "ZeRO stage 1: optimizer state partitioned across ranks"},
                           Variant{"deepspeed_stage_2", 2, false,
                                   "ZeRO stage 2: optimizer state and gradients partitioned"},
                           Variant{"deepspeed_stage_2_offload", 2, true,
                                   "ZeRO stage 2 with the optimizer in host memory"},
                           Variant{"deepspeed_stage_3", 3, false,
                                   "ZeRO stage 3: parameters partitioned too, gathered per "
                                   "module when read"},
                           Variant{"deepspeed_stage_3_offload", 3, true,
                                   "ZeRO stage 3 with optimizer and parameters in host "
                                   "memory"},
                           Variant{"deepspeed_stage_3_offload_nvme", 3, true,
                                   "ZeRO-Infinity: stage 3 with the optimizer state and the "
                                   "parameter chunks swapped to NVMe files under nvme_path",
                                   true}}) {
    const DeepSpeedStrategyOptions o;
    r.strategies.add(
        v.name, v.help,
        Params()
            .add("zero_optimization", o.zero_optimization(), "shard with ZeRO (false: plain DDP)")
            .add("stage", v.stage,
                 "ZeRO stage: 1 optimizer state, 2 and gradients, 3 and "
                 "parameters")
            .add("offload_optimizer", v.offload, "optimizer state and step in host memory")
            .add("offload_parameters", v.offload && v.stage == 3,
                 "stage 3: parameters in host memory")
            .add("param_persistence_threshold", o.param_persistence_threshold(),
                 "stage 3: parameters up to this many elements stay whole")
            .add("max_live_parameters", o.max_live_parameters(),
                 "stage 3: most parameter elements gathered at once")
            .choice("offload_optimizer_device", v.nvme ? "nvme" : o.offload_optimizer_device(),
                    {"cpu", "nvme"}, "where the optimizer state is offloaded")
            .choice("offload_parameters_device", v.nvme ? "nvme" : o.offload_parameters_device(),
                    {"cpu", "nvme"}, "stage 3: where the parameters are offloaded")
            .add("nvme_path", o.nvme_path(),
                 "existing writable folder of NVMe swap files (ZeRO-Infinity)")
            .add("sub_group_size", o.sub_group_size(),
                 "NVMe: optimizer elements stepped (swapped) together")
            .add("aio_block_size", o.aio_block_size(), "NVMe: bytes per I/O request")
            .add("aio_queue_depth", o.aio_queue_depth(), "NVMe: I/O requests in flight")
            .add("aio_use_uring", o.aio_use_uring(),
                 "NVMe: io_uring (false: the pread/pwrite reference path)")
            .add("cpu_checkpointing", o.cpu_checkpointing(),
                 "keep inputs saved by activation checkpointing in host memory")
            .add("reduce_bucket_size", o.reduce_bucket_size(),
                 "gradient elements per reduce-scatter")
            .add("allgather_bucket_size", o.allgather_bucket_size(),
                 "parameter elements per all-gather after the step")
            .add("overlap_comm", o.overlap_comm(), "reduce gradient buckets while backward goes on")
            .add("prefetch_bucket_size", o.prefetch_bucket_size(),
                 "stage 3: parameter elements gathered ahead of their read (0: off)")
            .add("zero_allow_untested_optimizer", o.zero_allow_untested_optimizer(),
                 "accept optimizers other than SGD/Adam/AdamW/RMSprop/Adagrad/Fused*")
            .add("ignore_unused_parameters", o.ignore_unused_parameters(),
                 "a parameter the forward did not use counts as a zero gradient (false: error)")
            .add("master_weights", o.master_weights(),
                 "bf16 with ZeRO: fp32 master weights of each rank's chunks (BF16Optimizer)")
            .add("loss_scale", o.loss_scale(), "16-mixed: a static loss scale (0: dynamic)")
            .add("initial_scale_power", o.initial_scale_power(),
                 "16-mixed: the dynamic scale starts at 2^power")
            .add("loss_scale_window", o.loss_scale_window(),
                 "16-mixed: finite steps before the scale doubles")
            .add("hysteresis", o.hysteresis(),
                 "16-mixed: inf/NaN steps before the scale halves (earlier ones only skip)")
            .add("consecutive_hysteresis", o.consecutive_hysteresis(),
                 "16-mixed: the hysteresis counts consecutive inf/NaN steps")
            .add("min_loss_scale", o.min_loss_scale(),
                 "16-mixed: floor of the scale; an inf/NaN step at the floor stops the run")
            .add("config", o.config(), "DeepSpeed JSON: a file path or inline JSON ('{...}')")
            .add("parallel_devices", o.parallel_devices(), "processes per node (0: devices)")
            .add("timeout_s", o.timeout_s(), "bound on rendezvous and every collective (seconds)")
            .choice("process_group_backend", o.process_group_backend(), {"auto", "gloo", "nccl"},
                    "collective backend; auto = gloo on cpu, nccl on cuda")
            .add("tp_size", o.tensor_parallel().tp_size(),
                 "inference: ranks the Linear layers are split across (1: off)")
            .add("injection_policy", std::vector<std::string>{},
                 "inference: 'Module: member, ...' (the members are row-parallel)")
            .add("tp_plan", std::vector<std::string>{},
                 "inference: 'pattern=colwise|colwise_qkv|rowwise|replicated'")
            .add("num_heads", o.tensor_parallel().num_heads(),
                 "inference: attention heads (checked against tp_size; 0: unknown)")
            .choice("dtype", o.dtype(), {"float32", "bfloat16"}, "inference: weights' dtype")
            .add("replace_with_kernel_inject", o.replace_with_kernel_inject(),
                 "inference: swap recognised blocks for fused kernels (KernelInjection)")
            .add("enable_cuda_graph", o.enable_cuda_graph(),
                 "inference: CUDA graph capture (not built yet)")
            .choice("replace_method", o.replace_method(), {"auto"}, "DeepSpeed's replace_method"),
        [](const Args& a, const StrategyContext& c) -> std::shared_ptr<Strategy> {
          return std::make_shared<DeepSpeedStrategy>(
              DeepSpeedStrategyOptions()
                  .zero_optimization(a.get<bool>("zero_optimization"))
                  .stage(a.get<int64_t>("stage"))
                  .offload_optimizer(a.get<bool>("offload_optimizer"))
                  .offload_parameters(a.get<bool>("offload_parameters"))
                  .param_persistence_threshold(a.get<int64_t>("param_persistence_threshold"))
                  .max_live_parameters(a.get<int64_t>("max_live_parameters"))
                  .offload_optimizer_device(a.get<std::string>("offload_optimizer_device"))
                  .offload_parameters_device(a.get<std::string>("offload_parameters_device"))
                  .nvme_path(a.get<std::string>("nvme_path"))
                  .sub_group_size(a.get<int64_t>("sub_group_size"))
                  .aio_block_size(a.get<int64_t>("aio_block_size"))
                  .aio_queue_depth(a.get<int64_t>("aio_queue_depth"))
                  .aio_use_uring(a.get<bool>("aio_use_uring"))
                  .cpu_checkpointing(a.get<bool>("cpu_checkpointing"))
                  .reduce_bucket_size(a.get<int64_t>("reduce_bucket_size"))
                  .allgather_bucket_size(a.get<int64_t>("allgather_bucket_size"))
                  .overlap_comm(a.get<bool>("overlap_comm"))
                  .prefetch_bucket_size(a.get<int64_t>("prefetch_bucket_size"))
                  .zero_allow_untested_optimizer(a.get<bool>("zero_allow_untested_optimizer"))
                  .master_weights(a.get<bool>("master_weights"))
                  .loss_scale(a.get<double>("loss_scale"))
                  .initial_scale_power(a.get<int64_t>("initial_scale_power"))
                  .loss_scale_window(a.get<int64_t>("loss_scale_window"))
                  .hysteresis(a.get<int64_t>("hysteresis"))
                  .consecutive_hysteresis(a.get<bool>("consecutive_hysteresis"))
                  .min_loss_scale(a.get<double>("min_loss_scale"))
                  .ignore_unused_parameters(a.get<bool>("ignore_unused_parameters"))
                  .config(a.get<std::string>("config"))
                  .parallel_devices(a.get<int64_t>("parallel_devices"))
                  .timeout_s(a.get<double>("timeout_s"))
                  .process_group_backend(a.get<std::string>("process_group_backend"))
                  .tensor_parallel(
                      TensorParallelOptions()
                          .tp_size(a.get<int64_t>("tp_size"))
                          .injection_policy(parse_injection_policy(
                              a.get<std::vector<std::string>>("injection_policy")))
                          .plan(parse_tp_plan(a.get<std::vector<std::string>>("tp_plan")))
                          .num_heads(a.get<int64_t>("num_heads")))
                  .dtype(a.get<std::string>("dtype"))
                  .replace_with_kernel_inject(a.get<bool>("replace_with_kernel_inject"))
                  .enable_cuda_graph(a.get<bool>("enable_cuda_graph"))
                  .replace_method(a.get<std::string>("replace_method")),
              c.accelerator, c.precision, c.devices, c.num_nodes);
        });
  }
}

}  // namespace volt::detail
