// Every user-facing Options type prints all of its fields (STYLE: each run can log its full
// config): the type name, each field name, and set values as given.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "volt/distributed/tensor_parallel.h"
#include "volt/distributed/zero_engine.h"
#include "volt/strategies/deepspeed.h"
#include "volt/volt.h"

namespace {

template <typename T>
std::string text(const T& options) {
  std::ostringstream os;
  os << options;
  return os.str();
}

void expect_has_all(const std::string& printed, const std::vector<std::string>& parts) {
  for (const auto& p : parts)
    EXPECT_NE(printed.find(p), std::string::npos) << p << " in " << printed;
}

TEST(OptionsPrinting, StrategiesPrintEveryField) {
  expect_has_all(text(volt::DdpStrategyOptions().bucket_cap_mb(5).static_graph(true)),
                 {"DdpStrategyOptions(", "bucket_cap_mb=5", "gradient_as_bucket_view=0",
                  "static_graph=1", "find_unused_parameters=0", "broadcast_buffers=1",
                  "timeout_s=60", "process_group_backend=\"auto\"", "max_restarts=0)"});
  const std::string ds =
      text(volt::DeepSpeedStrategyOptions().stage(3).nvme_path("/x").tensor_parallel(
          volt::TensorParallelOptions()
              .tp_size(2)
              .plan({{"qkv_*", volt::TpStyle::kColwiseQkv}})
              .injection_policy({{"Block", {"attn.o", "mlp.fc2"}}})));
  expect_has_all(ds, {"DeepSpeedStrategyOptions(zero_optimization=1",
                      "stage=3",
                      "offload_optimizer=0",
                      "offload_optimizer_device=\"cpu\"",
                      "nvme_path=\"/x\"",
                      "sub_group_size=",
                      "aio_use_uring=1",
                      "overlap_comm=1",
                      "prefetch_bucket_size=",
                      "master_weights=1",
                      "ignore_unused_parameters=1",
                      "loss_scale=0",
                      "initial_scale_power=16",
                      "loss_scale_window=1000",
                      "hysteresis=2",
                      "consecutive_hysteresis=0",
                      "min_loss_scale=1",
                      "config=\"\"",
                      "tensor_parallel=TensorParallelOptions(tp_size=2, "
                      "plan=[\"qkv_*=colwise_qkv\"], injection_policy=[\"Block\": "
                      "[\"attn.o\", \"mlp.fc2\"]], num_heads=0, partial_grads=[])",
                      "dtype=\"float32\"",
                      "replace_with_kernel_inject=0",
                      "enable_cuda_graph=0",
                      "replace_method=\"auto\")"});
}

TEST(OptionsPrinting, LogOptionsPrintEveryField) {
  EXPECT_EQ(text(volt::LogOptions()),
            "LogOptions(prog_bar=0, on_step=none, on_epoch=none, reduce=mean, batch_size=none, "
            "logger=1, sync_dist=0, add_dataloader_idx=1)");
  EXPECT_EQ(text(volt::LogOptions()
                     .prog_bar(true)
                     .on_step(false)
                     .on_epoch(true)
                     .reduce(volt::Reduce::kMax)
                     .batch_size(int64_t{7})
                     .logger(false)
                     .sync_dist(true)
                     .add_dataloader_idx(false)),
            "LogOptions(prog_bar=1, on_step=0, on_epoch=1, reduce=max, batch_size=7, logger=0, "
            "sync_dist=1, add_dataloader_idx=0)");
}

TEST(OptionsPrinting, CallbacksLoggersProfilerAndSchedulersPrintEveryField) {
  expect_has_all(
      text(volt::EarlyStoppingOptions("val_loss").stopping_threshold(0.1)),
      {"EarlyStoppingOptions(monitor=\"val_loss\"", "min_delta=0", "patience=3", "mode=min",
       "check_finite=1", "stopping_threshold=0.1", "divergence_threshold=none", "strict=1",
       "check_on_train_epoch_end=none", "verbose=0", "log_rank_zero_only=0)"});
  expect_has_all(text(volt::ModelCheckpointOptions().monitor("acc").mode(volt::Mode::kMax)),
                 {"ModelCheckpointOptions(dirpath=\"\"", "filename=\"{epoch}-{step}\"",
                  "monitor=\"acc\"", "mode=max", "save_top_k=1", "save_last=0",
                  "every_n_train_steps=0", "every_n_epochs=none", "train_time_interval=0",
                  "save_weights_only=0", "save_on_train_epoch_end=none", "enable_version_counter=1",
                  "auto_insert_metric_name=1", "verbose=0", "save_on_exception=0)"});
  expect_has_all(text(volt::ModelCheckpointOptions().save_last(volt::SaveLast::kLink)),
                 {"save_last=link"});
  expect_has_all(text(volt::ModelCheckpointOptions().save_last(true)), {"save_last=1"});
  expect_has_all(text(volt::TimerOptions().duration_s(60.0).interval(volt::Interval::kEpoch)),
                 {"TimerOptions(duration_s=60", "interval=epoch", "verbose=1)"});
  expect_has_all(
      text(volt::SafetensorsPredictionWriterOptions().output_dir("p").write_interval(
          volt::WriteInterval::kBatchAndEpoch)),
      {"SafetensorsPredictionWriterOptions(output_dir=\"p\"", "write_interval=batch_and_epoch)"});
  expect_has_all(
      text(volt::ModelPruningOptions("ln_structured")
               .parameters_to_prune({{"fc1", "weight"}})
               .amount(volt::PruningAmount::count(3))
               .pruning_dim(1)),
      {"ModelPruningOptions(pruning_fn=\"ln_structured\"", "parameters_to_prune=[fc1.weight]",
       "parameter_names=[weight, bias]", "use_global_unstructured=1", "amount=3", "apply_pruning=1",
       "make_pruning_permanent=1", "use_lottery_ticket_hypothesis=1", "resample_parameters=0",
       "pruning_dim=1", "pruning_norm=none", "verbose=0", "prune_on_train_epoch_end=1)"});
  expect_has_all(text(volt::LearningRateMonitorOptions().log_momentum(true)),
                 {"LearningRateMonitorOptions(logging_interval=auto", "log_momentum=1",
                  "log_weight_decay=0", "log_key_prefix=\"\")"});
  expect_has_all(text(volt::CSVLoggerOptions("runs").prefix("fold1")),
                 {"CSVLoggerOptions(save_dir=\"runs\"", "name=\"volt_logs\"", "version=-1",
                  "prefix=\"fold1\"", "flush_logs_every_n_steps=100)"});
  expect_has_all(
      text(volt::TensorBoardLoggerOptions("tb")),
      {"TensorBoardLoggerOptions(save_dir=\"tb\"", "name=\"volt_logs\"", "version=-1",
       "prefix=\"\"", "default_hp_metric=1", "flush_logs_every_n_steps=10", "flush_secs=120)"});
  expect_has_all(text(volt::ProgressBarOptions().refresh_rate(5).leave(true)),
                 {"ProgressBarOptions(refresh_rate=5", "refresh_s=0.5", "leave=1)"});
  expect_has_all(text(volt::SimpleProfilerOptions().filename("perf")),
                 {"SimpleProfilerOptions(dirpath=\"\"", "filename=\"perf\")"});
  expect_has_all(text(volt::WarmupLROptions().warmup_type(volt::WarmupType::kLinear)),
                 {"WarmupLROptions(warmup_min_lr=0", "warmup_max_lr=0.001", "warmup_num_steps=1000",
                  "warmup_type=linear", "total_num_steps=0)"});
  expect_has_all(text(volt::StochasticWeightAveragingOptions({0.05, 0.1}).swa_epoch_start(3)),
                 {"StochasticWeightAveragingOptions(swa_lrs={0.05, 0.1}", "swa_epoch_start=3",
                  "annealing_epochs=10", "annealing_strategy=cos", "avg_fn=mean", "device=cpu)"});
  expect_has_all(text(volt::WeightAveragingOptions().use_buffers(false)),
                 {"WeightAveragingOptions(device=module's", "use_buffers=0", "avg_fn=mean)"});
  expect_has_all(text(volt::EMAWeightAveragingOptions().update_starting_at_step(100)),
                 {"EMAWeightAveragingOptions(decay=0.999", "update_every_n_steps=1",
                  "update_starting_at_step=100", "update_starting_at_epoch=none", "device=module's",
                  "use_buffers=1)"});
  expect_has_all(text(volt::ActivationCheckpointingOptions({"blocks.*"}).cpu_checkpointing(true)),
                 {"ActivationCheckpointingOptions(modules=[\"blocks.*\"]", "cpu_checkpointing=1",
                  "preserve_rng_state=1)"});
}

TEST(OptionsPrinting, DistributedAndFp8BuildingBlocksPrintEveryField) {
  expect_has_all(
      text(volt::ZeroEngineOptions().stage(3).param_swap_file("/nvme/p.swap")),
      {"ZeroEngineOptions(stage=3", "reduce_bucket_size=200000000",
       "allgather_bucket_size=200000000", "overlap_comm=1", "prefetch_bucket_size=50000000",
       "param_swap_file=\"/nvme/p.swap\"", "aio_block_size=1048576", "aio_queue_depth=8",
       "aio_use_uring=1", "param_persistence_threshold=100000", "max_live_parameters=1000000000",
       "master_weights=1", "offload_optimizer=0", "offload_parameters=0",
       "ignore_unused_parameters=1)"});
  expect_has_all(text(volt::GradientReducerOptions().bucket_cap_mb(1.5).static_graph(true)),
                 {"GradientReducerOptions(bucket_cap_mb=1.5", "gradient_as_bucket_view=0",
                  "find_unused_parameters=0", "static_graph=1)"});
  expect_has_all(
      text(volt::ProcessGroupOptions().timeout(std::chrono::milliseconds(2500)).interface("veth0")),
      {"ProcessGroupOptions(backend=gloo", "timeout_ms=2500", "config_hash=\"\"",
       "interface=\"veth0\"", "store=none)"});
  expect_has_all(text(volt::Fp8ConvertOptions().skip({"head"})),
                 {"Fp8ConvertOptions(recipe=DelayedScalingOptions(margin=0", "skip=[\"head\"])"});
  expect_has_all(text(volt::GradScalerOptions().hysteresis(2).min_scale(1)),
                 {"GradScalerOptions(init_scale=65536", "growth_factor=2", "backoff_factor=0.5",
                  "growth_interval=2000", "dynamic=1", "hysteresis=2", "consecutive_hysteresis=0",
                  "min_scale=1", "error_at_min_scale=0)"});
  expect_has_all(
      text(volt::Fp8PrecisionOptions().inference(true).quant_config("q.json")),
      {"Fp8PrecisionOptions(replace_layers=1", "recipe=DelayedScalingOptions(", "skip=[]",
       "inference=1", "quant=0", "quant_config=\"q.json\"", "mixed=MixedPrecisionOptions("});
}

}  // namespace
