// Registers this folder's built-in names; called once from registry() (src/trainer/builtins.cpp).
#include <cmath>

#include "core/detail/numbers.h"
#include "volt/callbacks/activation_checkpointing.h"
#include "volt/callbacks/device_stats_monitor.h"
#include "volt/callbacks/early_stopping.h"
#include "volt/callbacks/finetuning.h"
#include "volt/callbacks/gradient_accumulation_scheduler.h"
#include "volt/callbacks/host_sync_monitor.h"
#include "volt/callbacks/lr_monitor.h"
#include "volt/callbacks/model_checkpoint.h"
#include "volt/callbacks/model_pruning.h"
#include "volt/callbacks/model_summary.h"
#include "volt/callbacks/on_exception_checkpoint.h"
#include "volt/callbacks/prediction_writer.h"
#include "volt/callbacks/progress_bar.h"
#include "volt/callbacks/spike_detection.h"
#include "volt/callbacks/stochastic_weight_averaging.h"
#include "volt/callbacks/throughput_monitor.h"
#include "volt/callbacks/timer.h"
#include "volt/callbacks/weight_averaging.h"
#include "volt/core/check.h"
#include "volt/core/errors.h"
#include "volt/core/registry.h"

namespace volt::detail {
namespace {

const char* mode_name(Mode m) {
  return m == Mode::kMax ? "max" : "min";
}

Mode mode_of(const Args& a) {
  return a.get<std::string>("mode") == "max" ? Mode::kMax : Mode::kMin;
}

// Lightning's save_last: a YAML boolean as the CLI's bool parameters take it, or "link".
SaveLast save_last_of(const std::string& text) {
  if (text == "link") return SaveLast::kLink;
  if (text == "true" || text == "True" || text == "TRUE") return SaveLast::kCopy;
  if (text == "false" || text == "False" || text == "FALSE") return SaveLast::kNo;
  VOLT_CHECK(false, ConfigError, "[ModelCheckpoint] save_last=\"", text,
             "\" is not true, false or link; give one of them (link: last.ckpt is a link to the "
             "newest checkpoint).");
  return SaveLast::kNo;
}

}  // namespace

void register_callbacks(Registry& r) {
  // Parameter defaults come from each Options struct, so they have one source.
  const ModelCheckpointOptions mc;
  const EarlyStoppingOptions es("");
  const LearningRateMonitorOptions lm;
  const TimerOptions tm;
  r.callbacks.add(
      "ModelCheckpoint", "saves checkpoints, keeping the best k by a monitored metric",
      Params()
          .add("dirpath", mc.dirpath(), "folder for checkpoints; \"\" = <log_dir>/checkpoints")
          .add("filename", mc.filename(), "file name template, e.g. {epoch}-{val_loss:.3f}")
          .add("monitor", mc.monitor(), "metric that ranks checkpoints; \"\" keeps the latest")
          .choice("mode", mode_name(mc.mode()), {"min", "max"},
                  "whether a lower or higher metric is better")
          .add("save_top_k", mc.save_top_k(), "keep the best k files; -1 keeps all, 0 none")
          .add("save_last", "false",
               "also write last.ckpt: true, false, or link (a link to the newest checkpoint)")
          .add("save_on_exception", mc.save_on_exception(),
               "save a checkpoint when fit fails or is interrupted")
          .add("every_n_train_steps", mc.every_n_train_steps(),
               "save every N optimizer steps; 0 = off")
          .optional<int64_t>("every_n_epochs",
                             "save every N epochs; none = 1 unless steps or a time are set")
          .add("train_time_interval", mc.train_time_interval(),
               "save every this many seconds of training; 0 = off")
          .add("save_weights_only", mc.save_weights_only(),
               "weights-only checkpoints (for validate/test/predict, not to resume)")
          .optional<bool>("save_on_train_epoch_end",
                          "epoch checkpoints at train epoch end (true) or after validation "
                          "(false); unset: Lightning's rule")
          .add("enable_version_counter", mc.enable_version_counter(),
               "a taken file name gets -v1, -v2... instead of being overwritten")
          .add("auto_insert_metric_name", mc.auto_insert_metric_name(),
               "render each filename field as name=value (false: the value alone)")
          .add("verbose", mc.verbose(), "log each ranking decision"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        ModelCheckpointOptions o;
        o.dirpath(a.get<std::string>("dirpath"))
            .filename(a.get<std::string>("filename"))
            .monitor(a.get<std::string>("monitor"))
            .mode(mode_of(a))
            .save_top_k(a.get<int64_t>("save_top_k"))
            .save_last(save_last_of(a.get<std::string>("save_last")))
            .save_on_exception(a.get<bool>("save_on_exception"))
            .every_n_train_steps(a.get<int64_t>("every_n_train_steps"))
            .train_time_interval(a.get<double>("train_time_interval"))
            .save_weights_only(a.get<bool>("save_weights_only"))
            .enable_version_counter(a.get<bool>("enable_version_counter"))
            .auto_insert_metric_name(a.get<bool>("auto_insert_metric_name"))
            .verbose(a.get<bool>("verbose"));
        if (auto n = a.get_optional<int64_t>("every_n_epochs")) o.every_n_epochs(*n);
        if (auto v = a.get_optional<bool>("save_on_train_epoch_end")) {
          o.save_on_train_epoch_end(*v);
        }
        return std::make_shared<ModelCheckpoint>(o);
      });

  r.callbacks.add(
      "EarlyStopping", "stops training when a monitored metric stops improving",
      Params()
          .required<std::string>("monitor", "metric to watch, e.g. val_loss")
          .add("min_delta", es.min_delta(), "smallest change that counts as an improvement")
          .add("patience", es.patience(), "checks without improvement before stopping")
          .choice("mode", mode_name(es.mode()), {"min", "max"},
                  "whether a lower or higher metric is better")
          .add("check_finite", es.check_finite(), "stop when the metric becomes NaN or inf")
          .optional<double>("stopping_threshold", "stop as soon as the metric reaches this")
          .optional<double>("divergence_threshold", "stop as soon as the metric is worse than this")
          .add("strict", es.strict(), "fail when the monitored metric is missing")
          .optional<bool>("check_on_train_epoch_end",
                          "check after training epochs (true) or after validation (false); "
                          "unset: at epoch end when validating once per epoch")
          .add("verbose", es.verbose(), "log each improvement and the reason for a stop")
          .add("log_rank_zero_only", es.log_rank_zero_only(),
               "with verbose: log on rank 0 only (else every rank, prefixed)"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        EarlyStoppingOptions o(a.get<std::string>("monitor"));
        o.min_delta(a.get<double>("min_delta"))
            .patience(a.get<int64_t>("patience"))
            .mode(mode_of(a))
            .check_finite(a.get<bool>("check_finite"))
            .strict(a.get<bool>("strict"))
            .verbose(a.get<bool>("verbose"))
            .log_rank_zero_only(a.get<bool>("log_rank_zero_only"));
        if (auto v = a.get_optional<bool>("check_on_train_epoch_end")) {
          o.check_on_train_epoch_end(*v);
        }
        if (auto v = a.get_optional<double>("stopping_threshold")) o.stopping_threshold(*v);
        if (auto v = a.get_optional<double>("divergence_threshold")) o.divergence_threshold(*v);
        return std::make_shared<EarlyStopping>(o);
      });

  r.callbacks.add(
      "LearningRateMonitor", "logs learning rates (and optionally momentum, weight decay)",
      Params()
          .choice("logging_interval", "auto", {"auto", "step", "epoch"},
                  "auto = each scheduler's own interval")
          .add("log_momentum", lm.log_momentum(), "also log momentum / beta1")
          .add("log_weight_decay", lm.log_weight_decay(), "also log weight decay")
          .optional<std::string>("log_key_prefix", "put before every logged name, e.g. train/"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        const std::string& i = a.get<std::string>("logging_interval");
        return std::make_shared<LearningRateMonitor>(
            LearningRateMonitorOptions()
                .logging_interval(i == "step"    ? LoggingInterval::kStep
                                  : i == "epoch" ? LoggingInterval::kEpoch
                                                 : LoggingInterval::kAuto)
                .log_momentum(a.get<bool>("log_momentum"))
                .log_weight_decay(a.get<bool>("log_weight_decay"))
                .log_key_prefix(a.get_optional<std::string>("log_key_prefix").value_or("")));
      });

  r.callbacks.add(
      "Timer", "measures stage times; stops fit after a maximum duration",
      Params()
          .optional<std::string>("duration",
                                 "maximum training time: \"DD:HH:MM:SS\", seconds, or (in a "
                                 "config) a timedelta mapping such as {hours: 12}")
          .choice("interval", "step", {"step", "epoch"}, "when the limit is checked")
          .add("verbose", tm.verbose(), "print a line when the limit stops training"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        TimerOptions o;
        if (auto d = a.get_optional<std::string>("duration")) {
          // Seconds too: the CLI gives Lightning's timedelta mappings so.
          char* end = nullptr;
          const double seconds = detail::c_strtod(d->c_str(), &end);
          const bool number =
              !d->empty() && end == d->c_str() + d->size() && std::isfinite(seconds);
          o.duration_s(number ? seconds : Timer::parse_duration(*d));
        }
        o.interval(a.get<std::string>("interval") == "epoch" ? Interval::kEpoch : Interval::kStep)
            .verbose(a.get<bool>("verbose"));
        return std::make_shared<Timer>(o);
      });

  // Lightning's TQDMProgressBar, under its own name and volt's.
  const ProgressBarOptions pb;
  for (const char* name : {"ProgressBar", "TQDMProgressBar"}) {
    r.callbacks.add(
        name, "the terminal progress bar (Lightning's TQDMProgressBar)",
        Params()
            .add("refresh_rate", pb.refresh_rate(),
                 "redraw every N batches (and at each bar's last); 0 = no bar")
            .add("refresh_s", pb.refresh_s(),
                 "and at most once per this many seconds; 0 = every refresh_rate batches")
            .add("leave", pb.leave(), "keep each epoch's finished training bar on screen"),
        [](const Args& a) -> std::shared_ptr<Callback> {
          return std::make_shared<ProgressBar>(ProgressBarOptions()
                                                   .refresh_rate(a.get<int64_t>("refresh_rate"))
                                                   .refresh_s(a.get<double>("refresh_s"))
                                                   .leave(a.get<bool>("leave")));
        });
  }

  const SpikeDetectionOptions sd;
  r.callbacks.add(
      "SpikeDetection",
      "ends fit with TrainingSpikeError when the loss jumps from its running mean; writes the "
      "batches to leave out",
      Params()
          .choice("mode", mode_name(sd.mode()), {"min", "max"},
                  "min: a spike is a jump up of the loss; max: a drop")
          .add("window", sd.window(), "losses in the running mean")
          .add("warmup", sd.warmup(), "batches before spikes are looked for")
          .add("atol", sd.atol(), "smallest distance above the mean that is a spike; 0 = none")
          .add("rtol", sd.rtol(), "smallest multiple of |mean| above it that is a spike; 0 = none")
          .add("exclude_batches_path", sd.exclude_batches_path(),
               "JSON file (or folder) for the batches to leave out; \"\" = "
               "<log_dir>/skip_batches.json")
          .add("finite_only", sd.finite_only(), "a NaN or infinite loss is a spike"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        return std::make_shared<SpikeDetection>(
            SpikeDetectionOptions()
                .mode(mode_of(a))
                .window(a.get<int64_t>("window"))
                .warmup(a.get<int64_t>("warmup"))
                .atol(a.get<double>("atol"))
                .rtol(a.get<double>("rtol"))
                .exclude_batches_path(a.get<std::string>("exclude_batches_path"))
                .finite_only(a.get<bool>("finite_only")));
      });

  r.callbacks.add(
      "GradientAccumulationScheduler",
      "changes the batches accumulated per optimizer step by epoch",
      Params().required<std::string>(
          "scheduling", "epoch:factor pairs, e.g. \"0:8, 4:4, 8:1\" (epochs count from 0)"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        return std::make_shared<GradientAccumulationScheduler>(
            GradientAccumulationScheduler::parse_scheduling(a.get<std::string>("scheduling")));
      });

  const BackboneFinetuningOptions bf;
  r.callbacks.add(
      "BackboneFinetuning",
      "freezes the module's backbone submodule until an epoch, then trains it in a param group "
      "of its own at a rate that grows towards the head's",
      Params()
          .add("unfreeze_backbone_at_epoch", bf.unfreeze_backbone_at_epoch(),
               "epoch (from 0) at which the backbone is unfrozen")
          .add("backbone_initial_ratio_lr", bf.backbone_initial_ratio_lr(),
               "the backbone starts at this fraction of the first param group's rate")
          .optional<double>("backbone_initial_lr",
                            "the backbone's starting rate (overrides the ratio)")
          .add("should_align", bf.should_align(),
               "never raise the backbone's rate above the first group's")
          .add("initial_denom_lr", bf.initial_denom_lr(),
               "divides the first group's rate when no starting rate is given")
          .add("train_bn", bf.train_bn(), "BatchNorm layers of the backbone train while frozen")
          .add("verbose", bf.verbose(), "log the rates when they change")
          .add("rounding", bf.rounding(), "decimals of the logged rates")
          .add("backbone", bf.backbone(),
               "the submodule to freeze (a registered name or dotted path)"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        BackboneFinetuningOptions o;
        o.unfreeze_backbone_at_epoch(a.get<int64_t>("unfreeze_backbone_at_epoch"))
            .backbone_initial_ratio_lr(a.get<double>("backbone_initial_ratio_lr"))
            .should_align(a.get<bool>("should_align"))
            .initial_denom_lr(a.get<double>("initial_denom_lr"))
            .train_bn(a.get<bool>("train_bn"))
            .verbose(a.get<bool>("verbose"))
            .rounding(a.get<int64_t>("rounding"))
            .backbone(a.get<std::string>("backbone"));
        if (auto v = a.get_optional<double>("backbone_initial_lr")) o.backbone_initial_lr(*v);
        return std::make_shared<BackboneFinetuning>(o);
      });

  const StochasticWeightAveragingOptions swa({1.0});
  r.callbacks.add(
      "StochasticWeightAveraging",
      "averages the weights of the last epochs (SWA) and puts the average in the module at the "
      "end of fit",
      Params()
          .required<std::vector<double>>("swa_lrs",
                                         "SWA learning rate: [lr] for every param group, or one "
                                         "per group")
          .number("swa_epoch_start", swa.swa_epoch_start().fraction(),
                  "first SWA epoch: a number >= 1 (1 = the first epoch) or a fraction of "
                  "max_epochs")
          .add("annealing_epochs", swa.annealing_epochs(),
               "epochs over which the lr anneals to swa_lrs")
          .choice("annealing_strategy", "cos", {"cos", "linear"}, "annealing curve")
          .choice("device", "cpu", {"cpu", "module"},
                  "where the average is kept: cpu, or with the module's parameters"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        StochasticWeightAveragingOptions o(a.get<std::vector<double>>("swa_lrs"));
        if (a.holds<int64_t>("swa_epoch_start")) {
          o.swa_epoch_start(Limit(a.get<int64_t>("swa_epoch_start")));
        } else {
          o.swa_epoch_start(Limit(a.get<double>("swa_epoch_start")));
        }
        o.annealing_epochs(a.get<int64_t>("annealing_epochs"))
            .annealing_strategy(a.get<std::string>("annealing_strategy") == "linear"
                                    ? AnnealStrategy::kLinear
                                    : AnnealStrategy::kCos);
        if (a.get<std::string>("device") == "module") o.device(c10::nullopt);
        return std::make_shared<StochasticWeightAveraging>(o);
      });

  const WeightAveragingOptions wa;
  r.callbacks.add(
      "WeightAveraging",
      "keeps the mean of the weights after every optimizer step; validation, checkpoints and "
      "the module after fit use it (Lightning's WeightAveraging with its default average)",
      Params()
          .choice("device", "module", {"module", "cpu"},
                  "where the average is kept: with the module's tensors, or cpu")
          .add("use_buffers", wa.use_buffers(), "average the buffers (BatchNorm) too"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        WeightAveragingOptions o;
        o.use_buffers(a.get<bool>("use_buffers"));
        if (a.get<std::string>("device") == "cpu") o.device(c10::Device(c10::kCPU));
        return std::make_shared<WeightAveraging>(o);
      });

  const EMAWeightAveragingOptions ema;
  r.callbacks.add(
      "EMAWeightAveraging",
      "keeps an exponential moving average of the weights; validation, checkpoints and the "
      "module after fit use it",
      Params()
          .add("decay", ema.decay(), "average <- decay * average + (1 - decay) * weights")
          .add("update_every_n_steps", ema.update_every_n_steps(),
               "update after every n-th optimizer step; 0 = never by step")
          .optional<int64_t>("update_starting_at_step", "first 0-based step to update after")
          .optional<int64_t>("update_starting_at_epoch",
                             "also update after every epoch from this 0-based one")
          .choice("device", "module", {"module", "cpu"},
                  "where the average is kept: with the module's tensors, or cpu")
          .add("use_buffers", ema.use_buffers(), "average the buffers (BatchNorm) too"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        EMAWeightAveragingOptions o;
        o.decay(a.get<double>("decay"))
            .update_every_n_steps(a.get<int64_t>("update_every_n_steps"))
            .use_buffers(a.get<bool>("use_buffers"));
        if (auto v = a.get_optional<int64_t>("update_starting_at_step")) {
          o.update_starting_at_step(*v);
        }
        if (auto v = a.get_optional<int64_t>("update_starting_at_epoch")) {
          o.update_starting_at_epoch(*v);
        }
        if (a.get<std::string>("device") == "cpu") o.device(c10::Device(c10::kCPU));
        return std::make_shared<EMAWeightAveraging>(o);
      });

  const OnExceptionCheckpointOptions oe;
  r.callbacks.add(
      "OnExceptionCheckpoint",
      "saves a checkpoint when fit ends with an exception, e.g. stopped by Ctrl-C or SIGTERM "
      "(resumes exactly)",
      Params()
          .add("dirpath", oe.dirpath(), "folder; \"\" = <log_dir>/checkpoints")
          .add("filename", oe.filename(), "file name without .ckpt"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        return std::make_shared<OnExceptionCheckpoint>(
            OnExceptionCheckpointOptions()
                .dirpath(a.get<std::string>("dirpath"))
                .filename(a.get<std::string>("filename")));
      });

  const ModelPruningOptions mp("l1_unstructured");
  r.callbacks.add(
      "ModelPruning",
      "zeroes a share of the weights after each training epoch (torch.nn.utils.prune's methods) "
      "and keeps them at zero; optionally rewinds the rest to their initial values",
      Params()
          .choice("pruning_fn", mp.pruning_fn(),
                  {"l1_unstructured", "random_unstructured", "ln_structured", "random_structured"},
                  "how to choose what to prune")
          .add("parameters_to_prune", std::vector<std::string>{},
               "layer.parameter names, e.g. [fc1.weight]; [] = parameter_names of every layer")
          .add("parameter_names", mp.parameter_names(), "names pruned in every layer")
          .add("use_global_unstructured", mp.use_global_unstructured(),
               "rank all parameters together (unstructured methods only)")
          .number("amount", mp.amount().value,
                  "a fraction (float in [0, 1]) or a count (int) of the unpruned parameters")
          .add("apply_pruning", mp.apply_pruning(), "prune at all")
          .add("make_pruning_permanent", mp.make_pruning_permanent(),
               "stop holding pruned weights at zero when training ends")
          .add("use_lottery_ticket_hypothesis", mp.use_lottery_ticket_hypothesis(),
               "rewind the remaining weights to their initial values after each pruning")
          .add("resample_parameters", mp.resample_parameters(),
               "rewind to new random values instead (Linear and Conv layers)")
          .optional<int64_t>("pruning_dim",
                             "the dimension whose channels structured methods remove")
          .optional<double>("pruning_norm", "the norm ln_structured ranks channels by")
          .add("verbose", mp.verbose(), "0 quiet, 1 overall sparsity, 2 also per parameter")
          .add("prune_on_train_epoch_end", mp.prune_on_train_epoch_end(),
               "prune after training epochs; false: after fit's validations"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        ModelPruningOptions o(a.get<std::string>("pruning_fn"));
        std::vector<PrunedParameter> params;
        for (const auto& full : a.get<std::vector<std::string>>("parameters_to_prune")) {
          const auto dot = full.rfind('.');
          VOLT_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < full.size(), ConfigError,
                     "[ModelPruning] parameters_to_prune entry '", full,
                     "' is not <layer>.<parameter>, e.g. fc1.weight.");
          params.emplace_back(full.substr(0, dot), full.substr(dot + 1));
        }
        o.parameters_to_prune(params)
            .parameter_names(a.get<std::vector<std::string>>("parameter_names"))
            .use_global_unstructured(a.get<bool>("use_global_unstructured"))
            .amount(a.holds<int64_t>("amount") ? PruningAmount::count(a.get<int64_t>("amount"))
                                               : PruningAmount::fraction(a.get<double>("amount")))
            .apply_pruning(a.get<bool>("apply_pruning"))
            .make_pruning_permanent(a.get<bool>("make_pruning_permanent"))
            .use_lottery_ticket_hypothesis(a.get<bool>("use_lottery_ticket_hypothesis"))
            .resample_parameters(a.get<bool>("resample_parameters"))
            .verbose(a.get<int64_t>("verbose"))
            .prune_on_train_epoch_end(a.get<bool>("prune_on_train_epoch_end"));
        if (auto d = a.get_optional<int64_t>("pruning_dim")) o.pruning_dim(*d);
        if (auto n = a.get_optional<double>("pruning_norm")) o.pruning_norm(*n);
        return std::make_shared<ModelPruning>(o);
      });

  const SafetensorsPredictionWriterOptions pw;
  r.callbacks.add(
      "SafetensorsPredictionWriter",
      "writes predict's outputs to safetensors files with their data set indices, per batch "
      "or per pass (several processes: merged into one file in data set order)",
      Params()
          .add("output_dir", pw.output_dir(), "folder; \"\" = <log_dir>/predictions")
          .choice("write_interval", to_string(pw.write_interval()),
                  {"batch", "epoch", "batch_and_epoch"}, "a file per batch, one per pass, or both"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        return std::make_shared<SafetensorsPredictionWriter>(
            SafetensorsPredictionWriterOptions()
                .output_dir(a.get<std::string>("output_dir"))
                .write_interval(parse_write_interval(a.get<std::string>("write_interval"))));
      });

  const ModelSummaryOptions ms;
  r.callbacks.add(
      "ModelSummary",
      "logs the model's submodules, parameter counts and size when fit starts (the Trainer "
      "adds one unless trainer.enable_model_summary=false)",
      Params().add("max_depth", ms.max_depth(),
                   "submodule depth shown; -1 = every submodule, 0 = no summary"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        return std::make_shared<ModelSummary>(
            ModelSummaryOptions().max_depth(a.get<int64_t>("max_depth")));
      });

  const DeviceStatsMonitorOptions ds;
  r.callbacks.add(
      "DeviceStatsMonitor",
      "logs device memory stats (Limit, InUse, MaxInUse, NumAllocs, ...) per step or epoch",
      Params()
          .choice("logging_interval", ds.logging_interval() == Interval::kStep ? "step" : "epoch",
                  {"step", "epoch"}, "step = at the Trainer's log_every_n_steps cadence")
          .add("host_stats", ds.host_stats(), "also log RSS bytes and process CPU percent"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        return std::make_shared<DeviceStatsMonitor>(
            DeviceStatsMonitorOptions()
                .logging_interval(a.get<std::string>("logging_interval") == "epoch"
                                      ? Interval::kEpoch
                                      : Interval::kStep)
                .host_stats(a.get<bool>("host_stats")));
      });

  const HostSyncMonitorOptions hs;
  r.callbacks.add(
      "HostSyncMonitor",
      "logs host syncs (item(), nonzero, ...) and ops on host tensors while the model is on an "
      "accelerator, inside training steps, with a table at the end of fit",
      Params()
          .add("log_each", hs.log_each(), "log every occurrence, not only the first of each op")
          .add("row_limit", hs.row_limit(), "rows of the table at the end of fit"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        return std::make_shared<HostSyncMonitor>(HostSyncMonitorOptions()
                                                     .log_each(a.get<bool>("log_each"))
                                                     .row_limit(a.get<int64_t>("row_limit")));
      });

  r.callbacks.add(
      "ThroughputMonitor",
      "logs batches, samples and FLOPs per second of training, validation, testing and "
      "prediction over a rolling window, MFU and running totals (train/device/samples_per_sec...)",
      Params()
          .add("window_size", int64_t{100}, "batches in the rolling window (2 or more)")
          .add("separator", std::string("/"), "between the stage, device and a figure's name")
          .add("flops_per_batch", int64_t{0},
               "FLOPs of one training batch on one device, forward and backward (0: none)")
          .add("eval_flops_per_batch", int64_t{0},
               "FLOPs of one validation/test/predict batch on one device (0: none)")
          .optional<double>("available_flops", "one device's peak FLOPs per second, for device/mfu")
          .optional<bool>("using_sparse_model",
                          "2:4 structured sparsity: MFU's peak times the factor")
          .add("sparse_cuda_acceleration_factor", 2.0, "the sparse peak's multiplier (>= 1)"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        ThroughputMonitorOptions o;
        o.window_size(a.get<int64_t>("window_size"))
            .separator(a.get<std::string>("separator"))
            .flops_per_batch(a.get<int64_t>("flops_per_batch"))
            .eval_flops_per_batch(a.get<int64_t>("eval_flops_per_batch"))
            .sparse_cuda_acceleration_factor(a.get<double>("sparse_cuda_acceleration_factor"));
        if (auto v = a.get_optional<double>("available_flops")) o.available_flops(*v);
        if (auto v = a.get_optional<bool>("using_sparse_model")) o.using_sparse_model(*v);
        return std::make_shared<ThroughputMonitor>(o);
      });

  r.callbacks.add(
      "ActivationCheckpointing",
      "recomputes the listed Sequential entries' activations in backward (saves memory)",
      Params()
          .required<std::vector<std::string>>(
              "modules", "module paths or globs to checkpoint, e.g. [\"blocks.*\"]")
          .optional<bool>("cpu_checkpointing",
                          "keep checkpointed inputs in host memory; none = the strategy's")
          .add("preserve_rng_state", true, "replay RNG states so dropout masks match"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        ActivationCheckpointingOptions o(a.get<std::vector<std::string>>("modules"));
        o.preserve_rng_state(a.get<bool>("preserve_rng_state"));
        if (auto c = a.get_optional<bool>("cpu_checkpointing")) o.cpu_checkpointing(*c);
        return std::make_shared<ActivationCheckpointing>(o);
      });
}

}  // namespace volt::detail
