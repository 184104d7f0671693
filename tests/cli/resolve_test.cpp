// Config resolution: schema checks with actionable messages, defaults, YAML round trip.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "cli/detail/resolve.h"
#include "error_text.h"
#include "tiny.h"
#include "volt/callbacks/timer.h"
#include "volt/strategies/ddp.h"

namespace {

using volt::detail::ConfigNode;
using volt::detail::parse_yaml;
using volt::detail::ResolvedConfig;

/// The built-ins plus a model taking every parameter type and one data module.
volt::Registry test_registry(bool two_models = false) {
  volt::Registry r = volt::registry();
  r.models = decltype(r.models)("model");
  r.data_modules = decltype(r.data_modules)("data module");
  auto make_model = [](const volt::Args&) -> std::shared_ptr<volt::Module> {
    return std::make_shared<volt_test::TinyClassifier>();
  };
  r.models.add("Everything", "every type",
               volt::Params()
                   .required<int64_t>("width", "units")
                   .add("lr", 1e-3, "lr")
                   .add("fused", true, "flag")
                   .add("name", "{epoch}-x", "a string needing quotes")
                   .add("empty", "", "an empty string")
                   .add("hidden", std::vector<int64_t>{256, 128}, "ints")
                   .add("betas", std::vector<double>{0.9, 0.999}, "floats")
                   .add("tags", std::vector<std::string>{"a", "null", "32-true"}, "strings")
                   .choice("mode", "min", {"min", "max"}, "choice")
                   .number("limit", int64_t{10}, "int or float")
                   .optional<double>("max_time", "nullable"),
               make_model);
  if (two_models) r.models.add("Other", "", volt::Params(), make_model);
  r.data_modules.add(
      "Blobs", "tiny", volt::Params().add("n", int64_t{64}, "rows"),
      [](const volt::Args&) -> std::shared_ptr<volt::DataModule> { return nullptr; });
  return r;
}

ResolvedConfig resolve_text(const std::string& yaml, const volt::Registry& r) {
  ConfigNode n = parse_yaml(yaml, "run.yaml");
  if (n.is_null()) n = ConfigNode::make_map("run.yaml");
  volt::detail::canonicalize(n);
  return volt::detail::resolve(n, r);
}

std::string error_of(const std::string& yaml, const volt::Registry& r) {
  try {
    resolve_text(yaml, r);
  } catch (const volt::ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

TEST(Resolve, FillsDefaultsAndPicksTheOnlyRegisteredClass) {
  const auto r = test_registry();
  auto c = resolve_text("model: {width: 8}\n", r);
  EXPECT_EQ(c.model.class_path, "Everything");
  EXPECT_EQ(c.data->class_path, "Blobs");
  EXPECT_EQ(c.model.args.get<int64_t>("width"), 8);
  EXPECT_DOUBLE_EQ(c.model.args.get<double>("lr"), 1e-3);
  EXPECT_FALSE(c.model.args.get_optional<double>("max_time").has_value());
  EXPECT_FALSE(c.trainer.get_optional<int64_t>("max_epochs").has_value());  // unset, as Lightning
  EXPECT_EQ(volt::detail::trainer_options(
                resolve_text("model: {width: 8}\ntrainer: {max_epochs: -1}\n", r).trainer)
                .max_epochs(),
            int64_t{-1});
  EXPECT_EQ(c.trainer.get<std::string>("accelerator"), "auto");
  EXPECT_FALSE(c.seed_everything.has_value());
  EXPECT_TRUE(c.callbacks.empty());
}

// LightningCLI's seed_everything is bool|int: true seeds with a seed chosen then and recorded in
// the saved config, false seeds nothing. volt took only a number ("expected int or null").
TEST(Resolve, SeedEverythingTrueChoosesARecordedSeed) {
  const auto r = test_registry();
  struct SavedEnv {
    explicit SavedEnv(const char* n) : name(n) {
      if (const char* v = std::getenv(n)) value = v;
      ::unsetenv(n);
    }
    ~SavedEnv() {
      if (value) {
        ::setenv(name, value->c_str(), 1);
      } else {
        ::unsetenv(name);
      }
    }
    const char* name;
    c10::optional<std::string> value;
  } seed("VOLT_GLOBAL_SEED"), world("WORLD_SIZE"), tasks("SLURM_NTASKS");
  const auto c = resolve_text("model: {width: 8}\nseed_everything: true\n", r);
  ASSERT_TRUE(c.seed_everything.has_value());
  EXPECT_GE(*c.seed_everything, 0);
  EXPECT_LT(*c.seed_everything, int64_t{1} << 32);
  EXPECT_NE(volt::detail::to_yaml(c).find("seed_everything: " + std::to_string(*c.seed_everything) +
                                          "\n"),
            std::string::npos);
  EXPECT_FALSE(resolve_text("model: {width: 8}\nseed_everything: false\n", r).seed_everything);
  EXPECT_EQ(*resolve_text("model: {width: 8}\nseed_everything: 5\n", r).seed_everything, 5);
  // A process started by one that seeded takes its seed (as Lightning's PL_GLOBAL_SEED).
  ::setenv("VOLT_GLOBAL_SEED", "1234", 1);
  EXPECT_EQ(*resolve_text("model: {width: 8}\nseed_everything: true\n", r).seed_everything, 1234);
  ::unsetenv("VOLT_GLOBAL_SEED");
  // One of several processes that would each draw their own: refused.
  ::setenv("WORLD_SIZE", "2", 1);
  const std::string e = error_of("model: {width: 8}\nseed_everything: true\n", r);
  EXPECT_NE(e.find("one of 2 processes (WORLD_SIZE) and each would pick its own"),
            std::string::npos)
      << e;
}

// The trainer section of a config Lightning's CLI printed holds nulls for the options left at
// their defaults (max_epochs: null, limit_val_batches: null, ...): each takes volt's default
// (they were "is null but must be int"). check_val_every_n_epoch: null is Lightning's None.
TEST(Resolve, TrainerNullsAreDefaultsAndCheckValEveryNEpochTakesNone) {
  const auto r = test_registry();
  auto c = resolve_text(
      "model: {width: 8}\ntrainer: {max_epochs: null, min_epochs: null, min_steps: null, "
      "limit_train_batches: null, limit_val_batches: null, val_check_interval: 50, "
      "num_sanity_val_steps: null, log_every_n_steps: null, enable_checkpointing: null, "
      "check_val_every_n_epoch: null}\n",
      r);
  auto o = volt::detail::trainer_options(c.trainer);
  const volt::TrainerOptions d;
  EXPECT_EQ(o.max_epochs(), d.max_epochs());
  EXPECT_EQ(o.min_steps(), d.min_steps());
  EXPECT_TRUE(o.limit_val_batches().is_fraction());
  EXPECT_EQ(o.num_sanity_val_steps(), d.num_sanity_val_steps());
  EXPECT_EQ(o.log_every_n_steps(), d.log_every_n_steps());
  EXPECT_EQ(o.enable_checkpointing(), d.enable_checkpointing());
  EXPECT_FALSE(o.check_val_every_n_epoch().has_value());
  EXPECT_EQ(o.val_check_interval().count(), 50);
  EXPECT_NO_THROW(o.validate());
  c = resolve_text("model: {width: 8}\ntrainer: {check_val_every_n_epoch: 3}\n", r);
  EXPECT_EQ(volt::detail::trainer_options(c.trainer).check_val_every_n_epoch(), int64_t{3});
  c = resolve_text("model: {width: 8}\n", r);
  EXPECT_EQ(volt::detail::trainer_options(c.trainer).check_val_every_n_epoch(), int64_t{1});
  // Elsewhere a null is still refused where a value is needed.
  EXPECT_NE(error_of("model: {width: null}\n", r).find("is null but must be int"),
            std::string::npos);
  // fast_dev_run: true / false is Lightning's 1 / 0 (a bool was refused as not an int).
  c = resolve_text("model: {width: 8}\ntrainer: {fast_dev_run: true}\n", r);
  EXPECT_EQ(volt::detail::trainer_options(c.trainer).fast_dev_run(), 1);
  c = resolve_text("model: {width: 8}\ntrainer: {fast_dev_run: False}\n", r);
  EXPECT_EQ(volt::detail::trainer_options(c.trainer).fast_dev_run(), 0);
  c = resolve_text("model: {width: 8}\ntrainer: {fast_dev_run: 3}\n", r);
  EXPECT_EQ(volt::detail::trainer_options(c.trainer).fast_dev_run(), 3);
  EXPECT_NE(
      error_of("model: {width: 8}\ntrainer: {fast_dev_run: \"true\"}\n", r).find("fast_dev_run"),
      std::string::npos);
}

// Lightning 2.6's time-based validation: val_check_interval as "DD:HH:MM:SS" or a timedelta
// mapping is val_check_interval_s; a number stays a batch count or fraction.
TEST(Resolve, ValCheckIntervalTakesLightningsDurations) {
  const auto r = test_registry();
  auto c = resolve_text("model: {width: 8}\ntrainer: {val_check_interval: \"00:00:01:30\"}\n", r);
  auto o = volt::detail::trainer_options(c.trainer);
  EXPECT_EQ(o.val_check_interval_s(), c10::optional<double>(90.0));
  EXPECT_TRUE(o.val_check_interval().is_fraction());
  EXPECT_NO_THROW(o.validate());
  c = resolve_text(
      "model: {width: 8}\ntrainer: {val_check_interval: {minutes: 2}, "
      "check_val_every_n_epoch: null}\n",
      r);
  o = volt::detail::trainer_options(c.trainer);
  EXPECT_EQ(o.val_check_interval_s(), c10::optional<double>(120.0));
  EXPECT_NO_THROW(o.validate());
  c = resolve_text("model: {width: 8}\ntrainer: {val_check_interval_s: 5}\n", r);
  EXPECT_EQ(volt::detail::trainer_options(c.trainer).val_check_interval_s(),
            c10::optional<double>(5.0));
  c = resolve_text("model: {width: 8}\ntrainer: {val_check_interval: 0.25}\n", r);
  EXPECT_FALSE(volt::detail::trainer_options(c.trainer).val_check_interval_s());
  EXPECT_NE(error_of("model: {width: 8}\ntrainer: {val_check_interval: \"1:2\"}\n", r)
                .find("\"1:2\" is no duration"),
            std::string::npos);
  EXPECT_NE(error_of("model: {width: 8}\ntrainer: {val_check_interval: \"00:00:01:00\", "
                     "val_check_interval_s: 5}\n",
                     r)
                .find("keep one of the two"),
            std::string::npos);
}

// A config Lightning's CLI wrote: import paths as class_path, Lightning's class and profiler
// names, a single callback, loggers under trainer.logger, nulls in built-in components'
// arguments, the Trainer arguments volt has no use for at harmless values, the entry points'
// verbose / weights_only / return_predictions at the top, and the ddp_find_unused_parameters_*
// strategy names. Each was an "unknown" or "null" error.
TEST(Resolve, AConfigLightningWroteLoads) {
  const auto r = test_registry();
  auto c = resolve_text(
      "model: {width: 1}\n"
      "verbose: false\nweights_only: null\nreturn_predictions: false\n"
      "optimizer: null\nlr_scheduler: null\n"
      "trainer:\n"
      "  strategy: {class_path: lightning.pytorch.strategies.DDPStrategy}\n"
      "  profiler: simple\n"
      "  plugins: null\n  model_registry: null\n  enable_autolog_hparams: true\n"
      "  suggest_integrations: false\n"
      "  callbacks: {class_path: lightning.pytorch.callbacks.ModelCheckpoint, init_args: "
      "{dirpath: null, monitor: null, filename: null, every_n_train_steps: null, "
      "save_last: null}}\n"
      "  logger: [{class_path: lightning.pytorch.loggers.CSVLogger, init_args: {save_dir: "
      "logs, version: null}}]\n",
      r);
  EXPECT_FALSE(c.verbose);
  EXPECT_FALSE(volt::detail::trainer_options(c.trainer).return_predictions());
  EXPECT_TRUE(volt::detail::trainer_options(c.trainer).logger());
  ASSERT_TRUE(c.strategy.has_value());
  EXPECT_EQ(c.strategy->class_path, "ddp");
  ASSERT_TRUE(c.profiler.has_value());
  EXPECT_EQ(c.profiler->class_path, "SimpleProfiler");
  ASSERT_EQ(c.callbacks.size(), 1u);
  EXPECT_EQ(c.callbacks[0].class_path, "ModelCheckpoint");
  EXPECT_EQ(c.callbacks[0].args.get<std::string>("monitor"), "");
  EXPECT_EQ(c.callbacks[0].args.get<int64_t>("every_n_train_steps"), 0);
  ASSERT_EQ(c.loggers.size(), 1u);
  EXPECT_EQ(c.loggers[0].class_path, "CSVLogger");
  // Printed, the loggers are trainer.loggers and verbose stays false.
  const std::string printed = volt::detail::to_yaml(c);
  EXPECT_NE(printed.find("verbose: false\n"), std::string::npos) << printed;
  EXPECT_NE(printed.find("class_path: CSVLogger"), std::string::npos) << printed;

  c = resolve_text(
      "model: {width: 1}\ntrainer: {strategy: ddp_find_unused_parameters_true, callbacks: "
      "LearningRateMonitor, profiler: {class_path: lightning.pytorch.profilers.PyTorchProfiler}}\n",
      r);
  ASSERT_TRUE(c.strategy.has_value());
  EXPECT_EQ(c.strategy->class_path, "ddp");
  EXPECT_TRUE(c.strategy->args.get<bool>("find_unused_parameters"));
  EXPECT_EQ(c.callbacks.at(0).class_path, "LearningRateMonitor");
  EXPECT_EQ(c.profiler->class_path, "TorchProfiler");
  // Arguments only Lightning's classes take, at their defaults (an unrelated value is refused).
  c = resolve_text(
      "model: {width: 1}\ntrainer: {loggers: [{class_path: TensorBoardLogger, init_args: "
      "{log_graph: false, sub_dir: null, default_hp_metric: true}}], callbacks: [{class_path: "
      "lightning.pytorch.callbacks.TQDMProgressBar, init_args: {process_position: 0}}]}\n",
      r);
  EXPECT_EQ(c.loggers.at(0).class_path, "TensorBoardLogger");
  EXPECT_EQ(c.callbacks.at(0).class_path, "TQDMProgressBar");
  EXPECT_NE(error_of("model: {width: 1}\ntrainer: {loggers: [{class_path: TensorBoardLogger, "
                     "init_args: {log_graph: true}}]}\n",
                     r)
                .find("log_graph"),
            std::string::npos);
  c = resolve_text("model: {width: 1}\ntrainer: {logger: []}\n", r);
  EXPECT_FALSE(volt::detail::trainer_options(c.trainer).logger());
  EXPECT_TRUE(c.loggers.empty());

  // What they cannot mean here is still refused, saying why.
  EXPECT_NE(error_of("model: {width: 1}\ntrainer: {plugins: [{class_path: x}]}\n", r)
                .find("trainer.plugins"),
            std::string::npos);
  EXPECT_NE(error_of("model: {width: 1}\ntrainer: {enable_autolog_hparams: false}\n", r)
                .find("volt always logs the module's hparams()"),
            std::string::npos);
  EXPECT_NE(error_of("model: {width: 1}\nreturn_predictions: false\n"
                     "trainer: {return_predictions: true}\n",
                     r)
                .find("keep one"),
            std::string::npos);
  EXPECT_NE(error_of("model: {width: 1}\ntrainer: {logger: {class_path: CSVLogger}, loggers: "
                     "[{class_path: TensorBoardLogger}]}\n",
                     r)
                .find("keep one of the two lists"),
            std::string::npos);
  EXPECT_NE(error_of("model: {width: 1}\ntrainer: {callbacks: [{class_path: "
                     "lightning.pytorch.callbacks.NoSuchCallback}]}\n",
                     r)
                .find("unknown callback \"lightning.pytorch.callbacks.NoSuchCallback\""),
            std::string::npos);
  EXPECT_NE(error_of("model: {width: 1}\nverbose: 3\n", r).find("verbose"), std::string::npos);
}

// DDPStrategy as Lightning's CLI prints it, every argument of its __init__: the ones its Trainer
// fills in are null, timeout is str(timedelta) ("0:30:00"), read as volt's timeout_s. Until
// session 109 they were refused by name.
TEST(Resolve, ADdpStrategyAsLightningPrintsItLoads) {
  const auto r = test_registry();
  const std::string strategy =
      "model: {width: 1}\ntrainer:\n  strategy:\n"
      "    class_path: lightning.pytorch.strategies.DDPStrategy\n    init_args:\n"
      "      accelerator: null\n      parallel_devices: null\n      cluster_environment: null\n"
      "      checkpoint_io: null\n      precision_plugin: null\n      ddp_comm_state: null\n"
      "      ddp_comm_hook: null\n      ddp_comm_wrapper: null\n"
      "      model_averaging_period: null\n      process_group_backend: null\n"
      "      start_method: popen\n";
  auto c = resolve_text(strategy + "      timeout: 0:30:00\n", r);
  ASSERT_TRUE(c.strategy.has_value());
  EXPECT_EQ(c.strategy->class_path, "ddp");
  EXPECT_DOUBLE_EQ(c.strategy->args.get<double>("timeout_s"), 1800);
  EXPECT_EQ(c.strategy->args.get<std::string>("process_group_backend"), "auto");
  c = resolve_text(strategy + "      timeout: 1 day, 2:00:00.500000\n", r);
  EXPECT_DOUBLE_EQ(c.strategy->args.get<double>("timeout_s"), 93600.5);
  c = resolve_text(strategy + "      timeout: 90\n", r);
  EXPECT_DOUBLE_EQ(c.strategy->args.get<double>("timeout_s"), 90);
  c = resolve_text(strategy + "      timeout: null\n", r);
  EXPECT_DOUBLE_EQ(c.strategy->args.get<double>("timeout_s"),
                   volt::DdpStrategyOptions().timeout_s());
  EXPECT_NE(error_of(strategy + "      timeout: soon\n", r)
                .find("expected a duration as Lightning prints a timedelta"),
            std::string::npos);
  EXPECT_NE(error_of(strategy + "      timeout: 0:61:00\n", r).find("timedelta"),
            std::string::npos);
  EXPECT_NE(error_of(strategy + "      timeout: 0:30:00\n      timeout_s: 5\n", r)
                .find("keep one of the two"),
            std::string::npos);
  EXPECT_NE(error_of("model: {width: 1}\ntrainer: {strategy: {class_path: DDPStrategy, "
                     "init_args: {start_method: spawn}}}\n",
                     r)
                .find("start_method"),
            std::string::npos);
}

// LightningCLI's automatic optimizer and lr_scheduler groups as its configs write them: import
// paths, every argument of PyTorch 2's classes (the implementation flags at values that change
// nothing), lightning.pytorch.cli.ReduceLROnPlateau with its monitor, and a name alone; printed,
// they load back. Until session 109 any value there was refused.
TEST(Resolve, LightningsOptimizerAndLrSchedulerGroupsResolve) {
  const auto r = test_registry();
  const auto c = resolve_text(
      "model: {width: 1}\n"
      "optimizer:\n  class_path: torch.optim.Adam\n  init_args:\n    lr: 0.01\n"
      "    betas: [0.9, 0.99]\n    eps: 1.0e-08\n    weight_decay: 0.0\n    amsgrad: false\n"
      "    foreach: null\n    maximize: false\n    capturable: false\n"
      "    differentiable: false\n    fused: null\n"
      "lr_scheduler:\n  class_path: lightning.pytorch.cli.ReduceLROnPlateau\n  init_args:\n"
      "    monitor: val_loss\n    mode: max\n    factor: 0.5\n    patience: 2\n"
      "    threshold: 0.0001\n    threshold_mode: rel\n    cooldown: 0\n    min_lr: 0.0\n"
      "    eps: 1.0e-08\n    verbose: deprecated\n",
      r);
  ASSERT_TRUE(c.optimizer.has_value());
  EXPECT_EQ(c.optimizer->class_path, "Adam");
  EXPECT_DOUBLE_EQ(c.optimizer->args.get<double>("lr"), 0.01);
  EXPECT_EQ(c.optimizer->args.get<std::vector<double>>("betas"), (std::vector<double>{0.9, 0.99}));
  EXPECT_FALSE(c.optimizer->args.get<bool>("amsgrad"));
  ASSERT_TRUE(c.lr_scheduler.has_value());
  EXPECT_EQ(c.lr_scheduler->class_path, "ReduceLROnPlateau");
  EXPECT_EQ(c.lr_scheduler->args.get<std::string>("monitor"), "val_loss");
  EXPECT_EQ(c.lr_scheduler->args.get<std::string>("mode"), "max");
  EXPECT_EQ(c.lr_scheduler->args.get<int64_t>("patience"), 2);
  const std::string printed = volt::detail::to_yaml(c);
  EXPECT_NE(printed.find("optimizer:\n  class_path: Adam\n  init_args:\n    lr: 0.01\n"),
            std::string::npos)
      << printed;
  EXPECT_EQ(volt::detail::to_yaml(resolve_text(printed, r)), printed);

  // A name alone takes the defaults; none given prints null.
  const auto plain = resolve_text("model: {width: 1}\noptimizer: SGD\n", r);
  ASSERT_TRUE(plain.optimizer.has_value());
  EXPECT_DOUBLE_EQ(plain.optimizer->args.get<double>("lr"), 1e-3);
  EXPECT_FALSE(plain.lr_scheduler.has_value());
  const std::string none = volt::detail::to_yaml(resolve_text("model: {width: 1}\n", r));
  EXPECT_NE(none.find("\noptimizer: null\nlr_scheduler: null\n"), std::string::npos) << none;

  EXPECT_NE(error_of("model: {width: 1}\nlr_scheduler: {class_path: StepLR, init_args: "
                     "{step_size: 1}}\n",
                     r)
                .find("is set without an optimizer"),
            std::string::npos);
  EXPECT_NE(error_of("model: {width: 1}\noptimizer: {class_path: Adamm}\n", r)
                .find("did you mean \"Adam\""),
            std::string::npos);
  // PyTorch's flags at values volt does not run are refused by name.
  EXPECT_NE(error_of("model: {width: 1}\noptimizer: {class_path: torch.optim.SGD, init_args: "
                     "{maximize: true}}\n",
                     r)
                .find("maximize"),
            std::string::npos);
  EXPECT_NE(error_of("model: {width: 1}\noptimizer: SGD\nlr_scheduler: ReduceLROnPlateau\n", r)
                .find("monitor"),
            std::string::npos);
  EXPECT_NE(error_of("model: {width: 1}\noptimizer: {class_path: SGD, init_args: {lr: fast}}\n", r)
                .find("optimizer.init_args.lr"),
            std::string::npos);
}

TEST(Resolve, NumbersKeepIntVersusFloat) {
  const auto r = test_registry();
  auto c = resolve_text("model: {width: 8, limit: 0.25}\ntrainer: {limit_train_batches: 10}\n", r);
  EXPECT_TRUE(c.model.args.holds<double>("limit"));
  EXPECT_TRUE(c.trainer.holds<int64_t>("limit_train_batches"));
  auto o = volt::detail::trainer_options(c.trainer);
  EXPECT_FALSE(o.limit_train_batches().is_fraction());
  EXPECT_EQ(o.limit_train_batches().count(), 10);
  EXPECT_TRUE(o.limit_val_batches().is_fraction());
  // Lightning's _determine_batch_limits: a whole-number float above 1 counts batches; 1.0 stays
  // the whole loader and 1.5 is still refused (when the Trainer checks its options).
  c = resolve_text(
      "model: {width: 8}\ntrainer: {limit_train_batches: 10.0, limit_val_batches: 1.0, "
      "val_check_interval: 3.0, overfit_batches: 1.5}\n",
      r);
  o = volt::detail::trainer_options(c.trainer);
  EXPECT_FALSE(o.limit_train_batches().is_fraction());
  EXPECT_EQ(o.limit_train_batches().count(), 10);
  EXPECT_FALSE(o.val_check_interval().is_fraction());
  EXPECT_EQ(o.val_check_interval().count(), 3);
  EXPECT_TRUE(o.limit_val_batches().is_fraction());
  EXPECT_TRUE(o.overfit_batches().is_fraction());
  EXPECT_THROW(o.overfit_batches().validate("overfit_batches"), volt::ConfigError);
}

// Lightning's devices: auto is -1 (every device of the accelerator); any other word stays an
// error naming an int.
TEST(Resolve, DevicesAutoIsEveryDevice) {
  const auto r = test_registry();
  auto c = resolve_text("model: {width: 1}\ntrainer: {devices: auto, num_nodes: 1}\n", r);
  EXPECT_EQ(volt::detail::trainer_options(c.trainer).devices(), -1);
  c = resolve_text("model: {width: 1}\ntrainer: {devices: 3}\n", r);
  EXPECT_EQ(volt::detail::trainer_options(c.trainer).devices(), 3);
  const std::string e = error_of("model: {width: 1}\ntrainer: {devices: many}\n", r);
  EXPECT_NE(e.find("expected int, got \"many\""), std::string::npos) << e;
}

// Lightning's Trainer(max_time=...) takes "DD:HH:MM:SS" or a datetime.timedelta mapping; a
// Lightning config holding either failed with "expected float or null".
TEST(Resolve, MaxTimeTakesLightningsDurationForms) {
  const auto r = test_registry();
  const auto max_time = [&](const std::string& value) {
    return *volt::detail::trainer_options(
                resolve_text("model: {width: 1}\ntrainer: {max_time: " + value + "}\n", r).trainer)
                .max_time();
  };
  EXPECT_DOUBLE_EQ(max_time("12.5"), 12.5);
  EXPECT_DOUBLE_EQ(max_time("00:12:00:00"), 12 * 3600.0);
  EXPECT_DOUBLE_EQ(max_time("' 01:00:00:30 '"), 86400.0 + 30);
  EXPECT_DOUBLE_EQ(max_time("{days: 1, hours: 5}"), 29 * 3600.0);
  EXPECT_DOUBLE_EQ(max_time("{minutes: 1.5, milliseconds: 250}"), 90.25);
  // On the command line too: the value is the text as typed.
  ConfigNode n = parse_yaml("model: {width: 1}\n", "run.yaml");
  volt::detail::apply_override(n, "trainer.max_time", "00:00:02:00", /*append=*/false,
                               "--trainer.max_time=00:00:02:00");
  volt::detail::canonicalize(n);
  EXPECT_DOUBLE_EQ(*volt::detail::trainer_options(volt::detail::resolve(n, r).trainer).max_time(),
                   120.0);
  std::string e = error_of("model: {width: 1}\ntrainer: {max_time: '12:00'}\n", r);
  EXPECT_NE(e.find("[cli] trainer.max_time (run.yaml:2:21): \"12:00\" is no duration; give "
                   "seconds, \"DD:HH:MM:SS\""),
            std::string::npos)
      << e;
  e = error_of("model: {width: 1}\ntrainer: {max_time: {fortnights: 1}}\n", r);
  EXPECT_NE(e.find("\"fortnights\" is no unit of a duration"), std::string::npos) << e;
  e = error_of("model: {width: 1}\ntrainer: {max_time: {hours: soon}}\n", r);
  EXPECT_NE(e.find("trainer.max_time.hours"), std::string::npos) << e;
  EXPECT_NE(e.find("expected a number, got \"soon\""), std::string::npos) << e;
  // Zero seconds reads as 0, which the Trainer takes as Lightning does (the fit trains nothing).
  const auto zero = volt::detail::trainer_options(
      resolve_text("model: {width: 1}\ntrainer: {max_time: '00:00:00:00'}\n", r).trainer);
  EXPECT_NO_THROW(zero.validate());
  EXPECT_EQ(zero.max_time(), c10::optional<double>(0.0));
}

// Timer's duration takes the same forms as max_time (Lightning's Timer takes "DD:HH:MM:SS", a
// timedelta or a dict): a mapping was refused as "expected name".
TEST(Resolve, TimerDurationTakesLightningsDurationForms) {
  const auto r = test_registry();
  const auto timer = [&](const std::string& duration) {
    const auto c = resolve_text(
        "model: {width: 1}\ntrainer: {callbacks: [{class_path: Timer, init_args: {duration: " +
            duration + "}}]}\n",
        r);
    return r.callbacks.create(c.callbacks.at(0).class_path, c.callbacks.at(0).args);
  };
  const auto left = [&](const std::string& duration) {
    return *std::dynamic_pointer_cast<volt::Timer>(timer(duration))->time_remaining();
  };
  EXPECT_DOUBLE_EQ(left("'00:12:00:00'"), 12 * 3600.0);
  EXPECT_DOUBLE_EQ(left("{days: 1, hours: 5}"), 29 * 3600.0);
  EXPECT_DOUBLE_EQ(left("{minutes: 1.5, milliseconds: 250}"), 90.25);
  EXPECT_DOUBLE_EQ(left("90.5"), 90.5);
  std::string e = error_of(
      "model: {width: 1}\ntrainer: {callbacks: [{class_path: Timer, init_args: {duration: "
      "{fortnights: 1}}}]}\n",
      r);
  EXPECT_NE(e.find("[cli] trainer.callbacks.0.init_args.duration (run.yaml:2:"), std::string::npos)
      << e;
  EXPECT_NE(e.find("\"fortnights\" is no unit of a duration; give seconds, \"DD:HH:MM:SS\""),
            std::string::npos)
      << e;
  e = volt_test::error_of<volt::ConfigError>([&] { timer("soon"); });
  EXPECT_NE(e.find("[Timer] duration \"soon\" is not DD:HH:MM:SS"), std::string::npos) << e;
}

// GradientAccumulationScheduler's scheduling as Lightning writes it, a mapping of epochs to
// factors, reads as volt's "0:8, 4:4"; a mapping with a bad entry fails in the callback's parser.
TEST(Resolve, GradientAccumulationSchedulerTakesLightningsMapping) {
  const auto r = test_registry();
  const auto c = resolve_text(
      "model: {width: 1}\ntrainer: {callbacks: [{class_path: GradientAccumulationScheduler, "
      "init_args: {scheduling: {0: 8, 4: 4}}}]}\n",
      r);
  EXPECT_EQ(c.callbacks.at(0).args.get<std::string>("scheduling"), "0:8, 4:4");
  auto made = std::dynamic_pointer_cast<volt::GradientAccumulationScheduler>(
      r.callbacks.create(c.callbacks.at(0).class_path, c.callbacks.at(0).args));
  ASSERT_NE(made, nullptr);
  EXPECT_EQ(made->scheduling(), (std::map<int64_t, int64_t>{{0, 8}, {4, 4}}));
  EXPECT_TRUE(made->going_to_accumulate_grad_batches());
  const auto bad = resolve_text(
      "model: {width: 1}\ntrainer: {callbacks: [{class_path: GradientAccumulationScheduler, "
      "init_args: {scheduling: {0: 8, x: 4}}}]}\n",
      r);
  const std::string e = volt_test::error_of<volt::ConfigError>(
      [&] { r.callbacks.create(bad.callbacks.at(0).class_path, bad.callbacks.at(0).args); });
  EXPECT_NE(e.find("[GradientAccumulationScheduler] scheduling \"0:8, x:4\""), std::string::npos)
      << e;
}

// A Lightning config's LearningRateMonitor with logging_interval: null (Lightning's default) is
// volt's "auto"; it was refused as "cannot be none".
TEST(Resolve, LearningRateMonitorTakesLightningsNullInterval) {
  const auto r = test_registry();
  const auto c = resolve_text(
      "model: {width: 1}\ntrainer: {callbacks: [{class_path: LearningRateMonitor, init_args: "
      "{logging_interval: null, log_momentum: true}}]}\n",
      r);
  EXPECT_EQ(c.callbacks.at(0).args.get<std::string>("logging_interval"), "auto");
  EXPECT_TRUE(c.callbacks.at(0).args.get<bool>("log_momentum"));
  EXPECT_NE(error_of("model: {width: 1}\ntrainer: {callbacks: [{class_path: LearningRateMonitor, "
                     "init_args: {logging_interval: hourly}}]}\n",
                     r)
                .find("logging_interval"),
            std::string::npos);
}

// Lightning's verbose / auto_insert_metric_name / log_rank_zero_only / log_key_prefix (null
// included, as LightningCLI writes its defaults) were "has no parameter" errors.
TEST(Resolve, CallbacksTakeLightningsVerboseAndNamingArguments) {
  const auto r = test_registry();
  const auto c = resolve_text(
      "model: {width: 1}\ntrainer: {callbacks: ["
      "{class_path: ModelCheckpoint, init_args: {verbose: true, auto_insert_metric_name: false}},"
      "{class_path: EarlyStopping, init_args: {monitor: val_loss, verbose: true, "
      "log_rank_zero_only: true}},"
      "{class_path: LearningRateMonitor, init_args: {log_key_prefix: null}},"
      "{class_path: LearningRateMonitor, init_args: {log_key_prefix: train/}}]}\n",
      r);
  EXPECT_TRUE(c.callbacks.at(0).args.get<bool>("verbose"));
  EXPECT_FALSE(c.callbacks.at(0).args.get<bool>("auto_insert_metric_name"));
  EXPECT_TRUE(c.callbacks.at(1).args.get<bool>("verbose"));
  EXPECT_TRUE(c.callbacks.at(1).args.get<bool>("log_rank_zero_only"));
  EXPECT_FALSE(c.callbacks.at(2).args.get_optional<std::string>("log_key_prefix"));
  EXPECT_EQ(c.callbacks.at(3).args.get_optional<std::string>("log_key_prefix").value_or(""),
            "train/");
}

// Lightning's save_last: false, true or "link"; save_on_exception.
TEST(Resolve, ModelCheckpointTakesSaveLastLinkAndSaveOnException) {
  const auto r = test_registry();
  const auto c = resolve_text(
      "model: {width: 1}\ntrainer: {callbacks: ["
      "{class_path: ModelCheckpoint, init_args: {save_last: link, save_on_exception: true}},"
      "{class_path: ModelCheckpoint, init_args: {save_last: true}},"
      "{class_path: ModelCheckpoint},"
      "{class_path: ModelCheckpoint, init_args: {save_last: True}}]}\n",
      r);
  EXPECT_EQ(c.callbacks.at(0).args.get<std::string>("save_last"), "link");
  EXPECT_TRUE(c.callbacks.at(0).args.get<bool>("save_on_exception"));
  EXPECT_EQ(c.callbacks.at(1).args.get<std::string>("save_last"), "true");
  EXPECT_EQ(c.callbacks.at(2).args.get<std::string>("save_last"), "false");
  EXPECT_FALSE(c.callbacks.at(2).args.get<bool>("save_on_exception"));
  for (const auto& spec : c.callbacks) {
    EXPECT_NO_THROW(r.callbacks.create(spec.class_path, spec.args));
  }
  const auto bad = resolve_text(
      "model: {width: 1}\ntrainer: {callbacks: [{class_path: ModelCheckpoint, "
      "init_args: {save_last: sometimes}}]}\n",
      r);
  try {
    r.callbacks.create(bad.callbacks.at(0).class_path, bad.callbacks.at(0).args);
    ADD_FAILURE() << "no ConfigError";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "[ModelCheckpoint] save_last=\"sometimes\" is not true, false or link"),
              std::string::npos)
        << e.what();
  }
}

TEST(Resolve, EveryTrainerFieldReachesTrainerOptions) {
  const auto r = test_registry();
  auto c = resolve_text(
      "model: {width: 1}\n"
      "trainer:\n  accelerator: cpu\n  devices: 1\n  strategy: single_device\n  precision: '32'\n"
      "  max_epochs: 7\n  min_epochs: 2\n  max_steps: 99\n  max_time: 12.5\n"
      "  limit_train_batches: 0.5\n  limit_val_batches: 3\n  limit_test_batches: 4\n"
      "  limit_predict_batches: 0.25\n  val_check_interval: 20\n  check_val_every_n_epoch: 3\n"
      "  num_sanity_val_steps: 0\n  fast_dev_run: 2\n  accumulate_grad_batches: 4\n"
      "  gradient_clip_val: 1.5\n  gradient_clip_algorithm: value\n  log_every_n_steps: 5\n"
      "  enable_progress_bar: false\n  enable_checkpointing: false\n"
      "  enable_model_summary: false\n  logger: false\n  default_root_dir: /tmp/x\n"
      "  deterministic: true\n  benchmark: false\n  detect_nonfinite_loss: false\n"
      "  inference_mode: false\n  barebones: true\n"
      "  handle_signals: false\n  graph_training_step: true\n  trace_training_step: true\n"
      "  num_threads: 2\n  reuse_host_memory: false\n  progress_refresh_s: 2.0\n"
      "  val_check_interval_s: 30.0\n",
      r);
  // Every declared field was set above to a non-default value.
  EXPECT_EQ(c.trainer.values().size(), volt::detail::trainer_params(r).specs().size());
  auto o = volt::detail::trainer_options(c.trainer);
  std::ostringstream got, want;
  got << o;
  volt::TrainerOptions w;
  w.accelerator("cpu")
      .devices(1)
      .strategy("single_device")
      .precision("32")
      .max_epochs(7)
      .min_epochs(2)
      .max_steps(99)
      .max_time(12.5)
      .limit_train_batches(0.5)
      .limit_val_batches(int64_t{3})
      .limit_test_batches(int64_t{4})
      .limit_predict_batches(0.25)
      .val_check_interval(int64_t{20})
      .check_val_every_n_epoch(3)
      .num_sanity_val_steps(0)
      .fast_dev_run(2)
      .accumulate_grad_batches(4)
      .gradient_clip_val(1.5)
      .gradient_clip_algorithm(volt::ClipAlgorithm::kValue)
      .log_every_n_steps(5)
      .enable_progress_bar(false)
      .enable_checkpointing(false)
      .enable_model_summary(false)
      .logger(false)
      .default_root_dir("/tmp/x")
      .deterministic(true)
      .benchmark(false)
      .detect_nonfinite_loss(false)
      .inference_mode(false)
      .barebones(true)
      .handle_signals(false)
      .graph_training_step(true)
      .trace_training_step(true)
      .num_threads(2)
      .reuse_host_memory(false)
      .progress_refresh_s(2.0)
      .val_check_interval_s(30.0);
  want << w;
  EXPECT_EQ(got.str(), want.str());
  EXPECT_NE(got.str(), [] {
    std::ostringstream d;
    d << volt::TrainerOptions();
    return d.str();
  }());
}

TEST(Resolve, PrintedConfigLoadsBackToTheSameValues) {
  const auto r = test_registry();
  auto c = resolve_text(
      "seed_everything: 7\nckpt_path: 'runs/a b.ckpt'\n"
      "model: {width: 3, lr: 3.0e-4, name: 'null', empty: '', hidden: [], betas: [0.1, .inf],"
      " tags: ['', 'true', x], mode: max, limit: 1.0, max_time: 0.1}\n"
      "trainer:\n  callbacks: [{class_path: EarlyStopping, init_args: {monitor: val_loss}},"
      " ModelCheckpoint]\n  loggers: [CSVLogger]\n",
      r);
  const std::string y1 = volt::detail::to_yaml(c);
  auto c2 = resolve_text(y1, r);
  EXPECT_EQ(volt::detail::to_yaml(c2), y1);
  EXPECT_EQ(c2.model.args.get<std::string>("name"), "null");
  EXPECT_EQ(c2.model.args.get<std::string>("empty"), "");
  EXPECT_DOUBLE_EQ(c2.model.args.get<double>("lr"), 3.0e-4);
  EXPECT_TRUE(std::isinf(c2.model.args.get<std::vector<double>>("betas")[1]));
  EXPECT_EQ(c2.model.args.get<std::vector<std::string>>("tags")[1], "true");
  EXPECT_TRUE(c2.model.args.holds<double>("limit"));  // 1.0 stays a float
  EXPECT_EQ(*c2.ckpt_path, "runs/a b.ckpt");
  EXPECT_EQ(*c2.seed_everything, 7);
  ASSERT_EQ(c2.callbacks.size(), 2u);
  EXPECT_EQ(c2.callbacks[0].args.get<std::string>("monitor"), "val_loss");
  EXPECT_EQ(c2.loggers[0].class_path, "CSVLogger");
}

// The same rule for trainer.strategy (and trainer.precision) written as a component: changing
// its class_path by a later file or --trainer.strategy.class_path=X keeps the init_args the new
// class takes and drops the rest. They were all kept: an unknown-key error for the new class.
TEST(Resolve, AChangedStrategyClassKeepsTheInitArgsItTakes) {
  const auto r = test_registry();
  const std::string yaml =
      "model: {width: 1}\ntrainer:\n  strategy:\n    class_path: ddp\n"
      "    init_args: {bucket_cap_mb: 5, broadcast_buffers: false}\n";
  for (const std::string how : {"--trainer.strategy.class_path=", "file"}) {
    SCOPED_TRACE(how);
    ConfigNode n = parse_yaml(yaml, "run.yaml");
    volt::detail::canonicalize(n);
    if (how == "file") {
      ConfigNode later =
          parse_yaml("trainer: {strategy: {class_path: model_parallel}}\n", "later.yaml");
      volt::detail::canonicalize(later);
      volt::detail::merge(n, later);
    } else {
      volt::detail::apply_override(n, "trainer.strategy.class_path", "model_parallel", false,
                                   how + "model_parallel");
    }
    const ResolvedConfig c = volt::detail::resolve(n, r);
    ASSERT_TRUE(c.strategy.has_value());
    EXPECT_EQ(c.strategy->class_path, "model_parallel");
    EXPECT_DOUBLE_EQ(c.strategy->args.get<double>("bucket_cap_mb"), 5.0);  // taken: kept
  }
  // A plain name still replaces the whole component.
  ConfigNode n = parse_yaml(yaml, "run.yaml");
  volt::detail::canonicalize(n);
  volt::detail::apply_override(n, "trainer.strategy", "single_device", false,
                               "--trainer.strategy=single_device");
  const ResolvedConfig c = volt::detail::resolve(n, r);
  EXPECT_FALSE(c.strategy.has_value());
  EXPECT_EQ(c.trainer.get<std::string>("strategy"), "single_device");
}

TEST(Resolve, StrategyIsANameOrAComponentWithParameters) {
  const auto r = test_registry();
  auto named = resolve_text("model: {width: 1}\ntrainer: {strategy: ddp}\n", r);
  EXPECT_FALSE(named.strategy.has_value());
  EXPECT_EQ(named.trainer.get<std::string>("strategy"), "ddp");
  auto c = resolve_text(
      "model: {width: 1}\ntrainer:\n  strategy:\n    class_path: ddp\n"
      "    init_args: {bucket_cap_mb: 5, gradient_as_bucket_view: true}\n",
      r);
  ASSERT_TRUE(c.strategy.has_value());
  EXPECT_EQ(c.strategy->class_path, "ddp");
  EXPECT_DOUBLE_EQ(c.strategy->args.get<double>("bucket_cap_mb"), 5.0);
  EXPECT_TRUE(c.strategy->args.get<bool>("gradient_as_bucket_view"));
  EXPECT_DOUBLE_EQ(c.strategy->args.get<double>("timeout_s"), 60.0);  // default filled
  // print-config writes the component back, and it loads to the same values.
  const std::string y1 = volt::detail::to_yaml(c);
  EXPECT_NE(y1.find("  strategy:\n    class_path: ddp\n"), std::string::npos) << y1;
  auto c2 = resolve_text(y1, r);
  EXPECT_EQ(volt::detail::to_yaml(c2), y1);
  ASSERT_TRUE(c2.strategy.has_value());
  EXPECT_DOUBLE_EQ(c2.strategy->args.get<double>("bucket_cap_mb"), 5.0);
  // Its parameters are checked like any component's.
  EXPECT_NE(error_of("model: {width: 1}\ntrainer: {strategy: {class_path: ddp, init_args: "
                     "{bucket_cap: 5}}}\n",
                     r)
                .find("did you mean \"trainer.strategy.init_args.bucket_cap_mb\"?"),
            std::string::npos);
  EXPECT_NE(error_of("model: {width: 1}\ntrainer: {strategy: {class_path: dpp}}\n", r)
                .find("did you mean \"ddp\"?"),
            std::string::npos);
}

TEST(Resolve, PrecisionIsANameOrAComponentWithOpLists) {
  const auto r = test_registry();
  auto c = resolve_text("model: {width: 1}\ntrainer: {precision: bf16-mixed}\n", r);
  EXPECT_FALSE(c.precision.has_value());
  EXPECT_EQ(c.trainer.get<std::string>("precision"), "bf16-mixed");
  c = resolve_text(
      "model: {width: 1}\n"
      "trainer:\n"
      "  precision:\n"
      "    class_path: bf16-mixed\n"
      "    init_args: {fp32_ops: [mm, addmm], read_env_lists: false}\n",
      r);
  ASSERT_TRUE(c.precision.has_value());
  EXPECT_EQ(c.precision->class_path, "bf16-mixed");
  EXPECT_EQ(c.precision->args.get<std::vector<std::string>>("fp32_ops"),
            (std::vector<std::string>{"mm", "addmm"}));
  const std::string y = volt::detail::to_yaml(c);
  EXPECT_NE(y.find("  precision:\n    class_path: bf16-mixed\n"), std::string::npos) << y;
  EXPECT_EQ(volt::detail::to_yaml(resolve_text(y, r)), y);
  EXPECT_NE(error_of("model: {width: 1}\ntrainer: {precision: {class_path: bf16-mixd}}\n", r)
                .find("did you mean \"bf16-mixed\"?"),
            std::string::npos);
}

TEST(Resolve, UnknownKeysSuggestTheClosest) {
  const auto r = test_registry();
  auto m = error_of("trainr: {}\n", r);
  EXPECT_NE(m.find("unknown key \"trainr\" (run.yaml:1:9); did you mean \"trainer\"?"),
            std::string::npos)
      << m;
  m = error_of("trainer: {max_epoch: 3}\nmodel: {width: 1}\n", r);
  EXPECT_NE(m.find("did you mean \"trainer.max_epochs\"?"), std::string::npos) << m;
  m = error_of("model: {width: 1, lrr: 0.1}\n", r);
  EXPECT_NE(m.find("unknown key \"model.init_args.lrr\""), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean \"model.init_args.lr\"?"), std::string::npos) << m;
  m = error_of("model: {width: 1}\ntrainer: {seed: 3}\n", r);
  EXPECT_NE(m.find("use seed_everything"), std::string::npos) << m;
  m = error_of("model: {width: 1}\nzzzzzz: 1\n", r);
  EXPECT_NE(m.find("valid keys: \"seed_everything\""), std::string::npos) << m;
}

TEST(Resolve, WrongTypesNameKeyOriginAndExpectedType) {
  const auto r = test_registry();
  auto m = error_of("model: {width: three}\n", r);
  EXPECT_NE(m.find("model.init_args.width (run.yaml:1:16): expected int, got \"three\""),
            std::string::npos)
      << m;
  m = error_of("model: {width: 1, fused: maybe}\n", r);
  EXPECT_NE(m.find("expected bool"), std::string::npos) << m;
  m = error_of("model: {width: 1, lr: fast}\n", r);
  EXPECT_NE(m.find("expected float"), std::string::npos) << m;
  // An integer too large for 64 bits says so (it said "expected int"); a subnormal float is a
  // float (it was refused for strtod's ERANGE), an overflowing one is not.
  m = error_of("model: {width: 99999999999999999999}\n", r);
  EXPECT_NE(m.find("is 99999999999999999999, outside the range of a 64-bit integer"),
            std::string::npos)
      << m;
  EXPECT_EQ(resolve_text("model: {width: 1, lr: 1e-310}\n", r).model.args.get<double>("lr"),
            1e-310);
  m = error_of("model: {width: 1, lr: 1e999}\n", r);
  EXPECT_NE(m.find("expected float"), std::string::npos) << m;
  m = error_of("model: {width: 1, hidden: [1, x]}\n", r);
  EXPECT_NE(m.find("model.init_args.hidden.1"), std::string::npos) << m;
  m = error_of("model: {width: 1, hidden: 5}\n", r);
  EXPECT_NE(m.find("expected list[int]"), std::string::npos) << m;
  m = error_of("model: {width: 1, mode: maxx}\n", r);
  EXPECT_NE(m.find("\"maxx\" is not one of \"min\", \"max\" (did you mean \"max\"?)"),
            std::string::npos)
      << m;
  m = error_of("model: {width: null}\n", r);
  EXPECT_NE(m.find("is null but must be int"), std::string::npos) << m;
  // A null where a string is needed says how to write the empty string.
  m = error_of("model: {width: 1, mode: null}\n", r);
  EXPECT_NE(m.find("is null but must be str; give a value (the empty string is \"\" in YAML, "
                   "--model.init_args.mode= on the command line)"),
            std::string::npos)
      << m;
  m = error_of("model: {width: 1}\ntrainer: {max_epochs: 1.5}\n", r);
  EXPECT_NE(m.find("trainer.max_epochs"), std::string::npos) << m;
  m = error_of("model: {width: 1}\nseed_everything: -1\n", r);
  EXPECT_NE(m.find("must be >= 0"), std::string::npos) << m;
  m = error_of("model: {width: 1}\ntrainer: {callbacks: 3}\n", r);
  EXPECT_NE(m.find("unknown callback \"3\""), std::string::npos) << m;
}

TEST(Resolve, MissingRequiredValueSaysHowToSetIt) {
  const auto r = test_registry();
  auto m = error_of("model: {lr: 0.1}\n", r);
  EXPECT_NE(m.find("model.init_args.width is required (int) for model Everything"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("--model.width=<value>"), std::string::npos) << m;
  m = error_of("model: {width: 1}\ntrainer: {callbacks: [EarlyStopping]}\n", r);
  EXPECT_NE(m.find("trainer.callbacks.0.init_args.monitor is required"), std::string::npos) << m;
  const auto r2 = test_registry(/*two_models=*/true);
  m = error_of("data: Blobs\n", r2);
  EXPECT_NE(m.find("model is required"), std::string::npos) << m;
  EXPECT_NE(m.find("\"Everything\", \"Other\""), std::string::npos) << m;
}

TEST(Resolve, UnknownRegisteredNamesListTheValidOnes) {
  const auto r = test_registry(true);
  auto m = error_of("model: Everythin\n", r);
  EXPECT_NE(m.find("unknown model \"Everythin\"; valid names: \"Everything\", \"Other\" (did you "
                   "mean \"Everything\"?)"),
            std::string::npos)
      << m;
  m = error_of("model: {class_path: Other}\ntrainer: {loggers: [TensorBoard]}\n", r);
  EXPECT_NE(m.find("unknown logger \"TensorBoard\""), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean \"TensorBoardLogger\"?"), std::string::npos) << m;
  m = error_of("model: Other\ntrainer: {accelerator: tpu}\n", r);
  EXPECT_NE(m.find("\"tpu\" is not one of \"auto\", \"cpu\", \"cuda\""), std::string::npos) << m;
  m = error_of("model: {class_path: Other, init: {}}\n", r);
  // Shorthand: a key beside class_path is an init arg, and Other takes none.
  EXPECT_NE(m.find("unknown key \"model.init_args.init\""), std::string::npos) << m;
  EXPECT_NE(m.find("valid keys under model.init_args: (none)"), std::string::npos) << m;
}

// jsonargparse's rule for a changed class_path (--model=X, --model.class_path=X or a later
// config file): the init_args set so far stay where the new class takes a parameter of that
// name and are dropped where it does not. Before session 81 --model=X dropped them all and
// --model.class_path=X kept them all (an unknown-key error for the new class).
TEST(Resolve, AChangedClassKeepsTheInitArgsItTakesAndDropsTheRest) {
  volt::Registry r = test_registry();
  r.models.add("Narrow", "lr and name only",
               volt::Params().add("lr", 0.1, "lr").add("name", "n", "a string"),
               [](const volt::Args&) -> std::shared_ptr<volt::Module> {
                 return std::make_shared<volt_test::TinyClassifier>();
               });
  const std::string yaml = "model: {class_path: Everything, init_args: {width: 8, lr: 0.5}}\n";
  for (const std::string how : {"--model=", "--model.class_path=", "file"}) {
    SCOPED_TRACE(how);
    ConfigNode n = parse_yaml(yaml, "run.yaml");
    volt::detail::canonicalize(n);
    if (how == "file") {
      ConfigNode later = parse_yaml("model: Narrow\n", "later.yaml");
      volt::detail::canonicalize(later);
      volt::detail::merge(n, later);
    } else {
      volt::detail::apply_override(n, how == "--model=" ? "model" : "model.class_path", "Narrow",
                                   false, how + "Narrow");
    }
    const ResolvedConfig c = volt::detail::resolve(n, r);
    EXPECT_EQ(c.model.class_path, "Narrow");
    EXPECT_DOUBLE_EQ(c.model.args.get<double>("lr"), 0.5);  // Narrow takes lr: kept
    EXPECT_EQ(c.model.args.get<std::string>("name"), "n");
    // Narrow's resolution dropped width; the config still holds it, so changing back to a class
    // that takes it finds it (jsonargparse would have dropped it at the first change).
    volt::detail::apply_override(n, "model", "Everything", false, "--model=Everything");
    EXPECT_EQ(volt::detail::resolve(n, r).model.args.get<int64_t>("width"), 8);
  }
  // A key set explicitly for the new class is checked as always.
  ConfigNode n = parse_yaml(yaml, "run.yaml");
  volt::detail::canonicalize(n);
  volt::detail::apply_override(n, "model", "Narrow", false, "--model=Narrow");
  volt::detail::apply_override(n, "model.width", "4", false, "--model.width=4");
  try {
    volt::detail::resolve(n, r);
    ADD_FAILURE() << "an explicit unknown key passed";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key \"model.init_args.width\""),
              std::string::npos)
        << e.what();
  }
}

// A command-line value YAML reads as a mapping or list is taken as typed by a string parameter:
// --model.name={epoch} is the text "{epoch}", not the mapping {epoch: null}.
TEST(Resolve, AStringParameterTakesAFlowCollectionOfTheCommandLineAsTyped) {
  const auto r = test_registry();
  ConfigNode n = parse_yaml("model: {width: 8}\n", "run.yaml");
  volt::detail::canonicalize(n);
  volt::detail::apply_override(n, "model.name", "{epoch}", false, "--model.name={epoch}");
  volt::detail::apply_override(n, "model.tags", "[x, '{y}']", false, "--model.tags=[x, '{y}']");
  volt::detail::apply_override(n, "model.mode", "[max]", false, "--model.mode=[max]");
  try {
    volt::detail::resolve(n, r);
    ADD_FAILURE() << "the choice took \"[max]\"";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"[max]\" is not one of"), std::string::npos) << e.what();
  }
  volt::detail::apply_override(n, "model.mode", "max", false, "--model.mode=max");
  const ResolvedConfig c = volt::detail::resolve(n, r);
  EXPECT_EQ(c.model.args.get<std::string>("name"), "{epoch}");
  EXPECT_EQ(c.model.args.get<std::vector<std::string>>("tags"),
            (std::vector<std::string>{"x", "{y}"}));  // a list parameter still takes the list
  // A config file's mapping is no string: YAML asks for quotes there.
  EXPECT_NE(error_of("model: {width: 8, name: {epoch}}\n", r).find("expected str"),
            std::string::npos);
}

// `+=` on a list parameter nobody set appends to its default, as jsonargparse (which starts from
// the defaults): [256, 128] += 64 is [256, 128, 64]; it was [64]. A list that was set, or null,
// is appended to as it is.
TEST(Resolve, AppendingToAnUnsetListParameterExtendsItsDefault) {
  const auto r = test_registry();
  const auto hidden = [&](const std::vector<std::pair<std::string, bool>>& overrides) {
    ConfigNode n = parse_yaml("model: {width: 8}\n", "run.yaml");
    volt::detail::canonicalize(n);
    for (const auto& [text, append] : overrides) {
      const auto eq = text.find('=');
      volt::detail::apply_override(n, text.substr(0, eq), text.substr(eq + 1), append, "--" + text);
    }
    return volt::detail::resolve(n, r).model.args.get<std::vector<int64_t>>("hidden");
  };
  EXPECT_EQ(hidden({{"model.hidden=64", true}}), (std::vector<int64_t>{256, 128, 64}));
  EXPECT_EQ(hidden({{"model.hidden=64", true}, {"model.hidden=[1, 2]", true}}),
            (std::vector<int64_t>{256, 128, 64, 1, 2}));
  EXPECT_EQ(hidden({{"model.hidden=[8]", false}, {"model.hidden=64", true}}),
            (std::vector<int64_t>{8, 64}));
  EXPECT_EQ(hidden({{"model.hidden=[]", false}, {"model.hidden=64", true}}),
            (std::vector<int64_t>{64}));
}

}  // namespace
