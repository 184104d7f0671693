#include "volt/core/registry.h"

#include <algorithm>

#include "volt/accelerators/accelerator.h"
#include "volt/callbacks/early_stopping.h"
#include "volt/callbacks/lr_monitor.h"
#include "volt/callbacks/model_checkpoint.h"
#include "volt/callbacks/throughput_monitor.h"
#include "volt/callbacks/timer.h"
#include "volt/core/check.h"
#include "volt/loggers/csv.h"
#include "volt/loggers/tensorboard.h"
#include "volt/precision/precision.h"
#include "volt/profiler/simple.h"
#include "volt/strategies/strategy.h"

namespace volt {

const char* param_type_name(ParamType type) {
  switch (type) {
    case ParamType::kBool: return "bool";
    case ParamType::kInt: return "int";
    case ParamType::kFloat: return "float";
    case ParamType::kString: return "str";
    case ParamType::kIntList: return "list[int]";
    case ParamType::kFloatList: return "list[float]";
    case ParamType::kStringList: return "list[str]";
    case ParamType::kNumber: return "int|float";
  }
  return "?";
}

ParamType param_value_type(const ParamValue& value) {
  switch (value.index()) {
    case 1: return ParamType::kBool;
    case 2: return ParamType::kInt;
    case 3: return ParamType::kFloat;
    case 4: return ParamType::kString;
    case 5: return ParamType::kIntList;
    case 6: return ParamType::kFloatList;
    case 7: return ParamType::kStringList;
    default: break;
  }
  VOLT_ASSERT(false, "param_value_type of a none value");
  return ParamType::kString;
}

// ------------------------------------------------------------------------------------- Params

Params& Params::push(ParamSpec spec) {
  VOLT_CHECK(!spec.name.empty() && spec.name.find('.') == std::string::npos, ConfigError,
             "[Registry] parameter name \"", spec.name,
             "\" is invalid; use a non-empty name without dots.");
  VOLT_CHECK(find(spec.name) == nullptr, ConfigError, "[Registry] parameter \"", spec.name,
             "\" is declared twice; give each parameter one declaration.");
  specs_.push_back(std::move(spec));
  return *this;
}

const ParamSpec* Params::find(const std::string& name) const {
  for (const auto& s : specs_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

namespace {
ParamSpec with_default(std::string name, ParamValue v, std::string help) {
  ParamSpec s;
  s.name = std::move(name);
  s.type = param_value_type(v);
  s.default_value = std::move(v);
  s.help = std::move(help);
  return s;
}
}  // namespace

Params& Params::add(std::string name, bool v, std::string help) {
  return push(with_default(std::move(name), v, std::move(help)));
}
Params& Params::add(std::string name, int v, std::string help) {
  return push(with_default(std::move(name), static_cast<int64_t>(v), std::move(help)));
}
Params& Params::add(std::string name, int64_t v, std::string help) {
  return push(with_default(std::move(name), v, std::move(help)));
}
Params& Params::add(std::string name, double v, std::string help) {
  return push(with_default(std::move(name), v, std::move(help)));
}
Params& Params::add(std::string name, const char* v, std::string help) {
  return push(with_default(std::move(name), std::string(v), std::move(help)));
}
Params& Params::add(std::string name, std::string v, std::string help) {
  return push(with_default(std::move(name), std::move(v), std::move(help)));
}
Params& Params::add(std::string name, std::vector<int64_t> v, std::string help) {
  return push(with_default(std::move(name), std::move(v), std::move(help)));
}
Params& Params::add(std::string name, std::vector<double> v, std::string help) {
  return push(with_default(std::move(name), std::move(v), std::move(help)));
}
Params& Params::add(std::string name, std::vector<std::string> v, std::string help) {
  return push(with_default(std::move(name), std::move(v), std::move(help)));
}
Params& Params::number(std::string name, ParamValue v, std::string help) {
  VOLT_CHECK(std::holds_alternative<int64_t>(v) || std::holds_alternative<double>(v), ConfigError,
             "[Registry] default of number parameter \"", name, "\" must be an int or a float.");
  ParamSpec s = with_default(std::move(name), std::move(v), std::move(help));
  s.type = ParamType::kNumber;
  return push(std::move(s));
}
Params& Params::choice(std::string name, std::string v, std::vector<std::string> choices,
                       std::string help) {
  VOLT_CHECK(std::find(choices.begin(), choices.end(), v) != choices.end(), ConfigError,
             "[Registry] default \"", v, "\" of parameter \"", name,
             "\" is not one of its choices; add it to the choices.");
  ParamSpec s = with_default(std::move(name), std::move(v), std::move(help));
  s.choices = std::move(choices);
  return push(std::move(s));
}

// --------------------------------------------------------------------------------------- Args

const ParamValue& Args::at(const std::string& name) const {
  auto it = values_.find(name);
  VOLT_CHECK(it != values_.end(), InternalError, "[Registry] ", owner_, " reads parameter \"",
             name, "\" that it did not declare; add it to its Params.");
  return it->second;
}

void Args::type_mismatch(const std::string& name, ParamType asked) const {
  const ParamValue& v = at(name);
  throw InternalError(detail::str_cat(
      "[Registry] ", owner_, " reads parameter \"", name, "\" as ", param_type_name(asked),
      " but it holds ",
      std::holds_alternative<std::monostate>(v) ? "none (use get_optional)"
                                                : param_type_name(param_value_type(v)),
      "; read it with the type it was declared with."));
}

Args default_args(const std::string& owner, const Params& params) {
  std::map<std::string, ParamValue> values;
  for (const auto& s : params.specs()) {
    VOLT_CHECK(!s.required, ConfigError, "[Registry] ", owner, " needs parameter \"", s.name,
               "\" (", param_type_name(s.type), "); set it in the config.");
    values[s.name] = s.default_value;
  }
  return Args(owner, std::move(values));
}

// ------------------------------------------------------------------------------ suggestions

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Close enough to be a typo: at most a third of the longer word (and at least 2 edits allowed).
  const size_t limit = std::max<size_t>(2, std::max(word.size(), best.size()) / 3);
  if (best_d <= limit) return best;
  // Or an abbreviation: "Mlp" for "MlpClassifier" (a unique candidate starting with the word).
  std::string lower_word = word, found;
  for (auto& ch : lower_word) ch = static_cast<char>(std::tolower(ch));
  if (lower_word.size() < 2) return "";
  for (const auto& c : candidates) {
    std::string lc = c;
    for (auto& ch : lc) ch = static_cast<char>(std::tolower(ch));
    if (lc.rfind(lower_word, 0) == 0) {
      if (!found.empty()) return "";
      found = c;
    }
  }
  return found;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string close = closest_match(word, candidates);
  return close.empty() ? "" : " (did you mean \"" + close + "\"?)";
}

std::string quoted_list(const std::vector<std::string>& names, const std::string& empty_text) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "\"" : ", \"") + n + "\"";
  return s.empty() ? empty_text : s;
}

void unknown_name(const std::string& kind, const std::string& name,
                  const std::vector<std::string>& valid) {
  throw ConfigError("[Registry] unknown " + kind + " \"" + name + "\"; valid names: " +
                    quoted_list(valid, "(none registered)") + did_you_mean(name, valid) + ".");
}

// ---------------------------------------------------------------------------------- built-ins

namespace {

/// A logger writing save_dir/name/version_N (CSVLogger, TensorBoardLogger): the options they
/// share, with defaults read from its Options.
template <typename L, typename O>
void add_run_folder_logger(Registry& r, const char* name, const char* help) {
  const O d("");
  r.loggers.add(
      name, help,
      Params()
          .add("save_dir", "", "root folder of all runs; \"\" = trainer.default_root_dir")
          .add("name", d.name(), "experiment name (sub-folder)")
          .add("version", d.version(), "version_N folder; -1 = next free")
          .add("flush_logs_every_n_steps", d.flush_logs_every_n_steps(),
               "flush to disk every N log calls"),
      [](const Args& a, const LoggerContext& c) -> std::shared_ptr<Logger> {
        const std::string& dir = a.get<std::string>("save_dir");
        return std::make_shared<L>(
            O(dir.empty() ? c.default_root_dir : dir)
                .name(a.get<std::string>("name"))
                .version(a.get<int64_t>("version"))
                .flush_logs_every_n_steps(a.get<int64_t>("flush_logs_every_n_steps")));
      });
}

const char* mode_name(Mode m) { return m == Mode::kMax ? "max" : "min"; }

Mode mode_of(const Args& a) { return a.get<std::string>("mode") == "max" ? Mode::kMax : Mode::kMin; }

void register_builtins(Registry& r) {
  // Parameter defaults come from each Options struct, so they have one source.
  const ModelCheckpointOptions mc;
  const EarlyStoppingOptions es("");
  const LearningRateMonitorOptions lm;
  const TimerOptions tm;
  r.accelerators.add("cpu", "the host CPU", [] { return std::make_shared<CpuAccelerator>(); });
  r.accelerators.add("cuda", "NVIDIA GPUs (needs a CUDA build of libtorch)",
                     [] { return std::make_shared<CudaAccelerator>(); });

  r.strategies.add("single_device", "one process on one device",
                   [](const StrategyContext& c) -> std::shared_ptr<Strategy> {
                     return std::make_shared<SingleDeviceStrategy>(c.accelerator->device(0),
                                                                   c.accelerator, c.precision);
                   });

  r.precisions.add("32-true", "fp32 weights and compute",
                   [] { return std::make_shared<Fp32Precision>(); });
  r.precisions.add("32", "same as 32-true", [] { return std::make_shared<Fp32Precision>(); });

  r.callbacks.add(
      "ModelCheckpoint", "saves checkpoints, keeping the best k by a monitored metric",
      Params()
          .add("dirpath", mc.dirpath(), "folder for checkpoints; \"\" = <log_dir>/checkpoints")
          .add("filename", mc.filename(), "file name template, e.g. {epoch}-{val_loss:.3f}")
          .add("monitor", mc.monitor(), "metric that ranks checkpoints; \"\" keeps the latest")
          .choice("mode", mode_name(mc.mode()), {"min", "max"},
                  "whether a lower or higher metric is better")
          .add("save_top_k", mc.save_top_k(), "keep the best k files; -1 keeps all, 0 none")
          .add("save_last", mc.save_last(), "also write last.ckpt")
          .add("every_n_train_steps", mc.every_n_train_steps(),
               "save every N optimizer steps; 0 = off")
          .optional<int64_t>("every_n_epochs", "save every N epochs; none = 1 unless steps set"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        ModelCheckpointOptions o;
        o.dirpath(a.get<std::string>("dirpath"))
            .filename(a.get<std::string>("filename"))
            .monitor(a.get<std::string>("monitor"))
            .mode(mode_of(a))
            .save_top_k(a.get<int64_t>("save_top_k"))
            .save_last(a.get<bool>("save_last"))
            .every_n_train_steps(a.get<int64_t>("every_n_train_steps"));
        if (auto n = a.get_optional<int64_t>("every_n_epochs")) o.every_n_epochs(*n);
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
          .add("check_on_train_epoch_end", es.check_on_train_epoch_end(),
               "check after training epochs, not validation"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        EarlyStoppingOptions o(a.get<std::string>("monitor"));
        o.min_delta(a.get<double>("min_delta"))
            .patience(a.get<int64_t>("patience"))
            .mode(mode_of(a))
            .check_finite(a.get<bool>("check_finite"))
            .strict(a.get<bool>("strict"))
            .check_on_train_epoch_end(a.get<bool>("check_on_train_epoch_end"));
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
          .add("log_weight_decay", lm.log_weight_decay(), "also log weight decay"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        const std::string& i = a.get<std::string>("logging_interval");
        return std::make_shared<LearningRateMonitor>(
            LearningRateMonitorOptions()
                .logging_interval(i == "step"    ? LoggingInterval::kStep
                                  : i == "epoch" ? LoggingInterval::kEpoch
                                                 : LoggingInterval::kAuto)
                .log_momentum(a.get<bool>("log_momentum"))
                .log_weight_decay(a.get<bool>("log_weight_decay")));
      });

  r.callbacks.add(
      "Timer", "measures stage times; stops fit after a maximum duration",
      Params()
          .optional<std::string>("duration", "maximum training time as \"DD:HH:MM:SS\"")
          .choice("interval", "step", {"step", "epoch"}, "when the limit is checked")
          .add("verbose", tm.verbose(), "print a line when the limit stops training"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        TimerOptions o;
        if (auto d = a.get_optional<std::string>("duration")) o.duration_s(Timer::parse_duration(*d));
        o.interval(a.get<std::string>("interval") == "epoch" ? Interval::kEpoch : Interval::kStep)
            .verbose(a.get<bool>("verbose"));
        return std::make_shared<Timer>(o);
      });

  r.profilers.add("SimpleProfiler", "wall time per hook and loop stage, reported when a run ends",
                  Params()
                      .add("dirpath", "", "folder for the report; \"\" = the run's log folder")
                      .add("filename", "", "report file stem (<stage>-<filename>.txt); \"\" prints it"),
                  [](const Args& a) -> std::shared_ptr<Profiler> {
                    return std::make_shared<SimpleProfiler>(
                        SimpleProfilerOptions()
                            .dirpath(a.get<std::string>("dirpath"))
                            .filename(a.get<std::string>("filename")));
                  });

  r.callbacks.add("ThroughputMonitor",
                  "logs train_samples_per_sec and train_batches_per_sec (validation time excluded)",
                  [] { return std::make_shared<ThroughputMonitor>(); });

  add_run_folder_logger<CSVLogger, CSVLoggerOptions>(r, "CSVLogger",
                                                     "metrics.csv and hparams.yaml per run");
  add_run_folder_logger<TensorBoardLogger, TensorBoardLoggerOptions>(
      r, "TensorBoardLogger", "TensorBoard event files (scalars, hparams)");
}

}  // namespace

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry();  // never destroyed: factories may run during static teardown
    register_builtins(*reg);
    return reg;
  }();
  return *r;
}

}  // namespace volt
