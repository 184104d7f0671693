#include "volt/cli/cli.h"

#include <c10/util/Type.h>
#include <nlohmann/json.hpp>

#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "callbacks/detail/prediction_tensors.h"
#include "core/detail/input_limits.h"
#include "core/detail/numbers.h"
#include "core/detail/out_of_memory.h"
#include "core/detail/print.h"
#include "data/detail/module_data.h"
#include "data/detail/stage_loaders.h"
#include "detail/config_tree.h"
#include "detail/perf_scan.h"
#include "detail/resolve.h"
#include "loggers/detail/log_dir.h"
#include "trainer/detail/batch_hooks.h"
#include "volt/callbacks/callback.h"
#include "volt/callbacks/model_checkpoint.h"
#include "volt/callbacks/prediction_writer.h"
#include "volt/core/atomic_file.h"
#include "volt/core/check.h"
#include "volt/core/env.h"
#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/core/registry.h"
#include "volt/data/data_module.h"
#include "volt/distributed/process_group.h"
#include "volt/graphs/cuda_graph.h"
#include "volt/io/checkpoint_io.h"
#include "volt/io/safetensors.h"
#include "volt/io/torchscript.h"
#include "volt/kernels/kernel_cache.h"
#include "volt/loggers/logger.h"
#include "volt/nn/parameters.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/report/run_report.h"
#include "volt/strategies/deepspeed.h"
#include "volt/strategies/model_parallel.h"
#include "volt/trainer/checkpoint.h"
#include "volt/trainer/plan.h"
#include "volt/trainer/trainer.h"

namespace volt {
namespace {

using detail::ConfigNode;
using detail::ResolvedConfig;

const std::vector<std::string> kRunCommands = {"fit", "validate", "test", "predict"};
const std::vector<std::string> kCommands = {
    "fit",    "validate", "test",         "predict",     "print-config", "export",
    "report", "perf",     "zero-to-fp32", "consolidate", "env",          "kernel-cache"};

const char* command_summary(const std::string& c) {
  if (c == "fit") return "train the model (Trainer::fit); ckpt_path resumes a run";
  if (c == "validate") return "run one validation pass and print its metrics";
  if (c == "test") return "run one test pass and print its metrics";
  if (c == "predict")
    return "run predict_step over the predict data; saves predictions.safetensors";
  if (c == "print-config") return "print the fully resolved config (loadable with --config)";
  if (c == "export") return "write a checkpoint's model as a TorchScript file (its predict_step)";
  if (c == "report") return "write a self-contained HTML report of a run folder";
  if (c == "perf") return "scan a profiler trace (TorchProfiler / PyTorch) and print advice";
  if (c == "zero-to-fp32") return "consolidate a ZeRO checkpoint folder into one checkpoint file";
  if (c == "consolidate") {
    return "join a folder of shards (ZeRO or model_parallel) into one checkpoint file";
  }
  if (c == "env") return "list the environment variables volt reads, with their values here";
  if (c == "kernel-cache") return "list or clear the JIT's compiled-kernel cache folder";
  return "";
}

/// One config source, in command-line order: later sources win.
struct Source {
  enum class Kind { kFile, kSet, kAppend } kind;
  std::string key;    // kSet/kAppend: dotted key
  std::string value;  // kFile: path; else the value text
  std::string origin;
};

struct Command {
  std::string name;  // "" for build_cli (options only)
  std::vector<Source> sources;
  std::vector<std::string> positional;
  bool help = false;
  bool print_config = false;  // build_cli's --print_config
  /// jsonargparse's --KEY.help CLASS: the component key ("model", "trainer.callbacks") and class.
  std::string class_help_key, class_help_name;
};

std::string file_name(const char* argv0) {
  if (argv0 == nullptr) return "volt";
  std::string s = argv0;
  auto p = s.find_last_of('/');
  return p == std::string::npos ? s : s.substr(p + 1);
}

// An override as messages and every node it sets name it: cut to 120 bytes (at a character
// boundary), since each node of the override's tree keeps a copy (a 128 KiB list override of
// 64,000 items kept 8 GiB of copies of itself).
std::string override_origin(const std::string& text) {
  constexpr size_t kMax = 120;
  if (text.size() <= kMax) return text;
  size_t cut = kMax - 3;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // UTF-8
  return text.substr(0, cut) + "...";
}

void parse_options(Command& cmd, int argc, const char* const* argv, int first);

// The keys that hold a class, for jsonargparse's --KEY.help CLASS (a component's own `help`
// argument is --KEY.init_args.help): each with how to print one of its classes (defined below).
struct ClassKey {
  const char* key;
  void (*print)(std::ostream& os, const Registry& reg, const std::string& name);
};
const std::vector<ClassKey>& class_keys();

// The key of --KEY.help when `option` is one ("model.help" -> "model"), else null.
const ClassKey* class_help_of(const std::string& option) {
  for (const ClassKey& k : class_keys()) {
    if (option == std::string(k.key) + ".help") return &k;
  }
  return nullptr;
}

Command parse_argv(int argc, const char* const* argv) {
  Command cmd;
  VOLT_CHECK(argc >= 2, ConfigError, "[cli] no command given; use one of ", quoted_list(kCommands),
             " (--help explains each).");
  cmd.name = argv[1];
  if (cmd.name == "--help" || cmd.name == "-h" || cmd.name == "help") {
    cmd.name.clear();
    cmd.help = true;
    return cmd;
  }
  VOLT_CHECK(std::find(kCommands.begin(), kCommands.end(), cmd.name) != kCommands.end(),
             ConfigError, "[cli] unknown command \"", cmd.name,
             "\"; valid commands: ", quoted_list(kCommands), did_you_mean(cmd.name, kCommands),
             ".");
  parse_options(cmd, argc, argv, 2);
  return cmd;
}

// The options from argv[first] on: --config / -c FILE, --key=VALUE (or --key VALUE), --key+=VALUE,
// --help, positional arguments; build_cli's (cmd.name empty) --print_config too.
void parse_options(Command& cmd, int argc, const char* const* argv, int first) {
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      cmd.help = true;
      continue;
    }
    if (a == "-c") {  // LightningCLI's short form of --config
      VOLT_CHECK(i + 1 < argc, ConfigError, "[cli] option -c needs a config file; write -c FILE.");
      const std::string file = argv[++i];
      cmd.sources.push_back({Source::Kind::kFile, "", file, file});
      continue;
    }
    if (a.rfind("--", 0) != 0) {
      cmd.positional.push_back(a);
      continue;
    }
    std::string key = a.substr(2), value;
    bool has_value = false, append = false;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
      has_value = true;
    }
    if (!key.empty() && key.back() == '+') {
      append = true;
      key.pop_back();
    }
    // jsonargparse's flag is a command of run_cli (it took --print_config for an option needing
    // a value, then an unknown key) and a flag of build_cli, as LightningCLI(run=False)'s.
    if (cmd.name.empty() && !has_value && (key == "print_config" || key == "print-config")) {
      cmd.print_config = true;
      continue;
    }
    VOLT_CHECK(key != "print_config" && key != "print-config", ConfigError, "[cli] --", key,
               cmd.name.empty() ? " takes no value here; write --print_config alone."
                                : " is the command print-config here; write volt print-config "
                                  "followed by the same options.");
    if (!has_value) {
      VOLT_CHECK(i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0, ConfigError,
                 "[cli] option --", key, " needs a value; write --", key, "=VALUE.");
      value = argv[++i];
    }
    VOLT_CHECK(!key.empty(), ConfigError, "[cli] \"", a,
               "\" has no option name; write --key=value.");
    if (key == "config" || key == "c") {
      cmd.sources.push_back({Source::Kind::kFile, "", value, value});
    } else if (const ClassKey* k = class_help_of(key)) {
      VOLT_CHECK(!append, ConfigError, "[cli] --", key, " takes one class; write --", key,
                 " CLASS.");
      // jsonargparse prints at the first of --help and --KEY.help and exits: a later one is
      // never read.
      if (cmd.help || !cmd.class_help_key.empty()) continue;
      cmd.class_help_key = k->key;
      cmd.class_help_name = value;
    } else {
      cmd.sources.push_back({append ? Source::Kind::kAppend : Source::Kind::kSet, key, value,
                             override_origin("--" + key + (append ? "+=" : "=") + value)});
    }
  }
}

// The model's config as its hyper-parameters, as LightningCLI's instantiator gives a module:
// `_class_path` (which loggers do not get) and each init argument (as YAML), over the keys of
// those names the module saved itself, beside its other keys. Loggers record them and every
// checkpoint keeps them, from which a later command's ckpt_path reads them back
// (model_from_checkpoint).
constexpr const char* kClassPathKey = "_class_path";
void record_model_config(Module& model, const detail::ComponentConfig& c) {
  std::map<std::string, std::string> hp = model.hparams();
  hp[kClassPathKey] = c.class_path;
  for (const auto& spec : c.params->specs()) {
    hp[spec.name] = detail::yaml_value(c.args.values().at(spec.name));
  }
  model.save_hyperparameters(std::move(hp));
}

// LightningCLI's _parse_ckpt_path: a ckpt_path naming a checkpoint file whose hyper-parameters
// hold a model config (record_model_config's) sets the model's class and arguments over the
// config files and the command line, so that a command given the checkpoint builds the model it
// was trained as. "last" / "best", folders (sharded checkpoints), files that are no volt
// checkpoint (the run says so) and checkpoints without one change nothing.
void model_from_checkpoint(ConfigNode& root) {
  const ConfigNode* ckpt = root.find("ckpt_path");
  if (ckpt == nullptr || !ckpt->is_scalar()) return;
  const std::string path = ckpt->scalar;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return;
  std::map<std::string, std::string> hp;
  try {
    torch::serialize::InputArchive archive = TorchCheckpointIO().load(path);
    torch::serialize::InputArchive saved;
    if (!archive.try_read("hyper_parameters", saved)) return;
    c10::IValue names, values;
    saved.read("names", names);
    saved.read("values", values);
    const auto n = names.toList();
    const auto v = values.toList();
    for (size_t i = 0; i < n.size() && i < v.size(); ++i) {
      hp.emplace(n.get(i).toStringRef(), v.get(i).toStringRef());
    }
  } catch (const std::exception&) {
    return;
  }
  const auto class_path = hp.find(kClassPathKey);
  if (class_path == hp.end()) return;
  const std::string origin = "the hyper-parameters of " + path;
  ConfigNode model = ConfigNode::make_map(origin);
  model.field("class_path", origin) = ConfigNode::make_scalar(class_path->second, origin);
  ConfigNode& args = model.field("init_args", origin);
  args = ConfigNode::make_map(origin);
  std::string listed;
  for (const auto& [name, value] : hp) {
    if (name == kClassPathKey) continue;
    ConfigNode& arg = args.field(name, origin);
    try {
      arg = detail::parse_yaml(value, origin);
    } catch (const ConfigError&) {
      // A value the module saved itself that is no YAML ("x: y: z"): its text, as a string.
      arg = ConfigNode::make_scalar(value, origin);
      arg.quoted = true;
    }
    // Kept only where the class takes it: a key the module saved itself may be none of its
    // arguments (resolve drops such carried entries, as for a changed class_path).
    arg.carried = true;
    listed += (listed.empty() ? "" : ", ") + name + "=" + value;
  }
  ConfigNode top = ConfigNode::make_map(origin);
  top.field("model", origin) = std::move(model);
  detail::merge(root, std::move(top));
  log_info("cli", "the model is " + class_path->second + "(" + listed + ") as the checkpoint " +
                      path +
                      " records it; its values replace the config's (LightningCLI's ckpt_path "
                      "rule).");
}

// The program's defaults (CliOptions::defaults, then its default config files that exist), then
// the command line's sources in order, then the model config of the checkpoint ckpt_path names.
ConfigNode build_tree(const Command& cmd, const CliOptions& options) {
  ConfigNode root = ConfigNode::make_map("defaults");
  if (!options.defaults.empty()) {
    ConfigNode defaults = detail::parse_config_text(options.defaults, "CliOptions::defaults");
    detail::canonicalize(defaults);
    detail::merge(root, std::move(defaults));
  }
  for (const auto& path : options.default_config_files) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) continue;
    ConfigNode file = detail::load_yaml_file(path);
    detail::canonicalize(file);
    detail::merge(root, std::move(file));
  }
  for (const auto& s : cmd.sources) {
    if (s.kind == Source::Kind::kFile) {
      ConfigNode file = detail::load_yaml_file(s.value);
      detail::canonicalize(file);
      detail::merge(root, std::move(file));
    } else {
      detail::apply_override(root, s.key, s.value, s.kind == Source::Kind::kAppend, s.origin);
    }
  }
  model_from_checkpoint(root);
  return root;
}

// ---------------------------------------------------------------------------------------- help

std::string default_text(const ParamSpec& s) {
  if (s.required) return "required";
  return detail::yaml_value(s.default_value);
}

void print_params(std::ostream& os, const std::string& prefix, const Params& params) {
  size_t w = 0;
  for (const auto& s : params.specs()) w = std::max(w, prefix.size() + s.name.size() + 2);
  for (const auto& s : params.specs()) {
    std::string type = param_type_name(s.type);
    if (s.nullable) type += "|null";
    os << "    " << std::left << std::setw(static_cast<int>(w)) << ("--" + prefix + s.name) << "  "
       << std::setw(11) << type << " " << std::setw(16) << ("[" + default_text(s) + "]") << " "
       << s.help;
    if (!s.choices.empty()) os << " (one of: " << quoted_list(s.choices) << ")";
    os << "\n";
  }
}

template <typename R>
void print_registry(std::ostream& os, const std::string& title, const std::string& prefix,
                    const R& reg) {
  os << "\n" << title << "\n";
  if (reg.entries().empty()) os << "    (none registered)\n";
  for (const auto& kv : reg.entries()) {
    os << "  " << kv.first << " — " << kv.second.help << "\n";
    print_params(os, prefix, kv.second.params);
  }
}

void print_options(std::ostream& os, const Registry& reg, const CliOptions& options);

template <typename R>
void print_class(std::ostream& os, const std::string& key, const std::string& prefix, const R& reg,
                 const std::string& written) {
  // As a class_path: an import path (torch.optim.Adam) by its last part, Lightning's names.
  const auto& entry = reg.at(detail::lightning_class_name(reg, written));  // unknown: ConfigError
  os << "--" << key << "=" << entry.name << ": " << entry.help << "\n";
  if (entry.params.specs().empty()) os << "    (no parameters)\n";
  print_params(os, prefix, entry.params);
}

const std::vector<ClassKey>& class_keys() {
  using P = void (*)(std::ostream&, const Registry&, const std::string&);
  static const std::vector<ClassKey> keys = {
      {"model", P([](auto& os, const Registry& r, const auto& n) {
         print_class(os, "model", "model.", r.models, n);
       })},
      {"data", P([](auto& os, const Registry& r, const auto& n) {
         print_class(os, "data", "data.", r.data_modules, n);
       })},
      {"optimizer", P([](auto& os, const Registry& r, const auto& n) {
         print_class(os, "optimizer", "optimizer.", r.optimizers, n);
       })},
      {"lr_scheduler", P([](auto& os, const Registry& r, const auto& n) {
         print_class(os, "lr_scheduler", "lr_scheduler.", r.lr_schedulers, n);
       })},
      {"trainer.callbacks", P([](auto& os, const Registry& r, const auto& n) {
         print_class(os, "trainer.callbacks", "trainer.callbacks.N.", r.callbacks, n);
       })},
      {"trainer.loggers", P([](auto& os, const Registry& r, const auto& n) {
         print_class(os, "trainer.loggers", "trainer.loggers.N.", r.loggers, n);
       })},
      {"trainer.logger", P([](auto& os, const Registry& r, const auto& n) {
         print_class(os, "trainer.logger", "trainer.loggers.N.", r.loggers, n);
       })},
      {"trainer.profiler", P([](auto& os, const Registry& r, const auto& n) {
         print_class(os, "trainer.profiler", "trainer.profiler.", r.profilers, n);
       })},
      {"trainer.checkpoint_io", P([](auto& os, const Registry& r, const auto& n) {
         print_class(os, "trainer.checkpoint_io", "trainer.checkpoint_io.", r.checkpoint_ios, n);
       })},
      {"trainer.strategy", P([](auto& os, const Registry& r, const auto& n) {
         print_class(os, "trainer.strategy", "trainer.strategy.init_args.", r.strategies, n);
       })},
      {"trainer.precision", P([](auto& os, const Registry& r, const auto& n) {
         print_class(os, "trainer.precision", "trainer.precision.init_args.", r.precisions, n);
       })},
  };
  return keys;
}

// jsonargparse's --KEY.help CLASS: the parameters of one registered class of a component key
// (one class_keys() holds: parse_options takes no other).
void print_class_help(std::ostream& os, const Registry& reg, const std::string& key,
                      const std::string& name) {
  const ClassKey* k = class_help_of(key + ".help");
  VOLT_CHECK(k != nullptr, InternalError, "[cli] --", key, ".help is no class key.");
  k->print(os, reg, name);
}

void print_help(std::ostream& os, const std::string& prog, const std::string& command,
                const Registry& reg, const CliOptions& options) {
  if (command.empty()) {
    os << "usage: " << prog << " <command> [--config FILE]... [--section.key=VALUE]...\n\n"
       << "commands:\n";
    for (const auto& c : kCommands) {
      os << "  " << std::left << std::setw(14) << c << command_summary(c) << "\n";
    }
    os << "\n"
       << prog << " <command> --help lists every option with its type and default.\n"
       << "Exit codes: 0 success, 1 the run failed, 2 bad command line or config, 128 + N\n"
       << "stopped by signal N (130: Ctrl-C, 143: SIGTERM; add OnExceptionCheckpoint to save).\n";
    return;
  }
  if (command == "perf") {
    os << "usage: " << prog << " perf --trace FILE\n\n"
       << command_summary(command) << ".\nFILE is a Chrome trace JSON: TorchProfiler's "
       << "<stage>-...-rank<R>.pt.trace.json or torch.profiler's export_chrome_trace.\n";
    return;
  }
  if (command == "export") {
    os << "usage: " << prog
       << " export [--config FILE]... --ckpt_path=CKPT --output=FILE [--dynamic_batch=BOOL]\n\n"
       << command_summary(command) << ".\n\n"
       << "The config names the model and data as for predict (`" << prog
       << " predict --help` lists\nthe keys; trainer options are ignored). The model is built, "
          "CKPT's weights are loaded\ninto it (a checkpoint file fit wrote, a ZeRO folder or a "
          ".safetensors file), and its\npredict_step is traced on the input of the first batch "
          "of the predict loader (else\ntest, else validation) into FILE: a TorchScript module "
          "that torch::jit::load (C++)\nand torch.jit.load (Python) run without volt, whose "
          "forward(input) returns what\npredict_step returns. FILE is checked against "
          "predict_step on that batch and, unless\n--dynamic_batch=false, on one row more "
          "(a size read into a C++ integer is a constant\nof a trace).\n";
    return;
  }
  if (command == "zero-to-fp32") {
    os << "usage: " << prog << " zero-to-fp32 FOLDER OUT [--weights_only=BOOL]\n\n"
       << command_summary(command) << ".\nFOLDER is a checkpoint DeepSpeedStrategy wrote (every "
       << "rank's shard); OUT gets full weights and optimizer state by parameter name, loadable "
       << "by any strategy and world size (DeepSpeed's zero_to_fp32.py). With "
       << "--weights_only=true the optimizers' states are left out (what validate, test, "
       << "predict and export read; Lightning's convert_zero_checkpoint_to_fp32_state_dict), "
       << "reading one shard at a time.\n";
    return;
  }
  if (command == "consolidate") {
    os << "usage: " << prog << " consolidate FOLDER OUT [--weights_only=BOOL]\n\n"
       << command_summary(command) << ".\nFOLDER is a checkpoint DeepSpeedStrategy wrote (every "
       << "rank's shard; as zero-to-fp32) or ModelParallelStrategy wrote with "
       << "save_distributed_checkpoint (each tensor-parallel rank's shards, joined by the "
       << "layouts recorded beside them); OUT gets the whole weights and optimizer state by "
       << "parameter name, loadable by any strategy and layout and by one process. With "
       << "--weights_only=true the optimizers' states are left out.\n";
    return;
  }
  if (command == "env") {
    os << "usage: " << prog << " env\n\n"
       << command_summary(command) << ".\nExit code 2 when one of them has a value volt does "
       << "not accept; VOLT_* variables volt does not read are warned about.\n";
    return;
  }
  if (command == "kernel-cache") {
    os << "usage: " << prog << " kernel-cache [list | clear]\n\n"
       << command_summary(command) << ".\nThe folder and size cap come from "
       << "VOLT_KERNEL_CACHE_CONFIG=dir,clear_at_start,size_mb (default <VOLT_CACHE_DIR>/kernels, "
       << "1024 MiB).\n  list    the entries, least recently used first (the default)\n"
       << "  clear   remove every entry (under the eviction lock; running jobs recompile)\n";
    return;
  }
  if (command == "report") {
    os << "usage: " << prog << " report RUN_DIR [--output FILE] [--title TEXT]\n\n"
       << command_summary(command) << ".\nRUN_DIR is a logger's version folder (metrics.csv, "
       << "config.yaml) or a folder holding version_N folders (the newest is used).\n"
       << "  --output FILE   default: RUN_DIR/report.html\n  --title TEXT    default: the "
       << "folder's name\n";
    return;
  }
  os << "usage: " << prog << " " << command << " [--config FILE]... [--section.key=VALUE]...\n\n"
     << command_summary(command) << ".\n\n";
  print_options(os, reg, options);
}

// build_cli's --help.
void print_build_help(std::ostream& os, const std::string& prog, const Registry& reg,
                      const CliOptions& options) {
  os << "usage: " << prog << " [--config FILE]... [--section.key=VALUE]... [--print_config]\n\n"
     << "Builds the trainer, model and data module that this program then runs; --print_config\n"
     << "prints the resolved config as YAML instead (--config loads it back).\n\n";
  print_options(os, reg, options);
}

// The keys a config takes, their types and defaults, and the program's own defaults.
void print_options(std::ostream& os, const Registry& reg, const CliOptions& options) {
  os << "Values come from YAML files (--config, repeatable) and --key=value overrides, applied in\n"
     << "command-line order (the last wins). Values are YAML: --model.hidden=[256,128]. A "
        "component\n"
     << "is {class_path: NAME, init_args: {...}}; --model=NAME picks one, --model.lr=X sets an\n"
     << "init arg, --trainer.callbacks+=NAME appends, --trainer.callbacks.0.patience=5 edits;\n"
     << "--model.help NAME (--optimizer.help Adam, --trainer.callbacks.help EarlyStopping) lists "
        "one class's.\n"
     << "An empty value is the empty string (--trainer.callbacks.0.monitor=); --key=null is null\n"
     << "(in YAML files, key: alone is null and key: \"\" the empty string).\n"
     << "Columns: option, type, [default], meaning.\n\n";
  if (!options.defaults.empty() || !options.default_config_files.empty()) {
    os << "This program's defaults, read before --config files and overrides (the [default]\n"
       << "columns below are volt's):\n";
    if (!options.defaults.empty()) {
      auto lines = detail::c_stream<std::istringstream>(options.defaults);
      for (std::string line; std::getline(lines, line);) os << "    " << line << "\n";
    }
    for (const auto& f : options.default_config_files) {
      std::error_code ec;
      os << "  default config file " << f
         << (std::filesystem::exists(f, ec) ? "" : " (not there: skipped)") << "\n";
    }
    os << "\n";
  }
  os << "top level:\n"
     << "    --config FILE      YAML config file (repeatable)\n"
     << "    --seed_everything  int|bool|null  [null]        seed torch's RNG before anything is "
        "built (true: a random seed, written into the saved config)\n"
     << "    --ckpt_path        str|null    [null]           checkpoint file: fit resumes from it, "
        "validate/test/predict load its weights\n"
     << "\ntrainer (volt::TrainerOptions):\n";
  print_params(os, "trainer.", detail::trainer_params(reg));
  os << "    --trainer.callbacks  list  [[]]  callbacks: {class_path, init_args} items (below)\n"
     << "    --trainer.loggers    list  [[]]  loggers: {class_path, init_args} items (below)\n"
     << "    --trainer.profiler   component|null  [null]  a profiler (below), e.g. "
        "--trainer.profiler=SimpleProfiler\n"
     << "    --trainer.checkpoint_io  component|null  [null]  how checkpoints are written "
        "(below; null = the strategy's), e.g. --trainer.checkpoint_io=AsyncCheckpointIO\n";
  print_registry(os, "models (--model=NAME, init args --model.KEY=VALUE):", "model.", reg.models);
  print_registry(os, "data modules (--data=NAME, init args --data.KEY=VALUE):", "data.",
                 reg.data_modules);
  print_registry(os,
                 "optimizers (--optimizer=NAME, init args --optimizer.KEY=VALUE; null = the "
                 "model's configure_optimizers(), which a given optimizer replaces):",
                 "optimizer.", reg.optimizers);
  print_registry(os,
                 "LR schedulers (--lr_scheduler=NAME with an --optimizer, init args "
                 "--lr_scheduler.KEY=VALUE; stepped every epoch):",
                 "lr_scheduler.", reg.lr_schedulers);
  print_registry(os, "callbacks (trainer.callbacks items; --trainer.callbacks+=NAME):",
                 "trainer.callbacks.N.", reg.callbacks);
  print_registry(os,
                 "loggers (trainer.loggers items; --trainer.loggers+=NAME):", "trainer.loggers.N.",
                 reg.loggers);
  print_registry(os, "profilers (--trainer.profiler=NAME):", "trainer.profiler.", reg.profilers);
  print_registry(os, "checkpoint IO (--trainer.checkpoint_io=NAME):", "trainer.checkpoint_io.",
                 reg.checkpoint_ios);
  print_registry(os,
                 "strategies with parameters (trainer.strategy: {class_path: NAME, init_args: "
                 "{...}}; --trainer.strategy.init_args.KEY=VALUE):",
                 "trainer.strategy.init_args.", reg.strategies);
  print_registry(os,
                 "precisions with parameters (trainer.precision: {class_path: NAME, init_args: "
                 "{...}}; --trainer.precision.init_args.KEY=VALUE):",
                 "trainer.precision.init_args.", reg.precisions);
  os << "\naccelerators: " << quoted_list(accelerator_names())
     << "\nstrategies:   " << quoted_list(strategy_names())
     << "\nprecision:    " << quoted_list(reg.precisions.names()) << "\n";
}

// ----------------------------------------------------------------------------------- building

/// Creates `dir` (and its parents); a ConfigError (exit code 2) naming it when that fails, where
/// the filesystem's exception left the CLI as a foreign error (exit code 1).
void make_folder(const std::filesystem::path& dir, const char* what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  VOLT_CHECK(!ec, ConfigError, "[cli] cannot create ", what, " '", dir.string(), "' (",
             ec.message(), "); set trainer.default_root_dir to a folder this process can write.");
}

/// Writes the resolved config into the run's log folder when the run starts (after a resume has
/// picked the folder). An existing different config.yaml is kept: this run's goes to
/// config_<n>.yaml.
class SaveConfig : public Callback {
 public:
  SaveConfig(std::string yaml, bool enabled) : yaml_(std::move(yaml)), enabled_(enabled) {}
  std::string state_key() const override { return "SaveConfig"; }
  void on_fit_start(RunContext& run, Module&) override { save(run); }
  void on_validation_start(RunContext& run, Module&) override { save(run); }
  void on_test_start(RunContext& run, Module&) override { save(run); }
  void on_predict_start(RunContext& run, Module&) override { save(run); }
  const std::string& path() const { return path_; }

 private:
  void save(RunContext& run) {
    if (!enabled_ || !path_.empty() || !run.is_global_zero()) return;
    namespace fs = std::filesystem;
    const fs::path dir = run.log_dir();
    make_folder(dir, "the run's log folder");
    fs::path p = dir / "config.yaml";
    for (int n = 1; fs::exists(p); ++n) {
      auto in = detail::c_stream<std::ifstream>(p, std::ios::binary);
      auto ss = detail::c_stream<std::stringstream>();
      ss << in.rdbuf();
      if (ss.str() == yaml_) break;  // the same config (a resumed run): keep it
      p = dir / ("config_" + std::to_string(n) + ".yaml");
    }
    if (!fs::exists(p)) atomic_write_file(p.string(), yaml_);
    path_ = p.string();
  }
  std::string yaml_;
  bool enabled_;
  std::string path_;
};

/// The data set indices of each predicted batch (`volt predict` writes them beside the rows: with
/// several ranks each predicts its shard, where the sampler's padding repeats the first samples).
class PredictIndices : public Callback {
 public:
  std::string state_key() const override { return "PredictIndices"; }
  void on_predict_start(RunContext&, Module&) override { indices.clear(); }
  void on_predict_batch_end(RunContext& run, Module&, const at::Tensor&, const Batch&,
                            int64_t) override {
    indices.push_back(run.predict_batch_indices());
  }
  std::vector<std::vector<int64_t>> indices;
};

void print_metrics(std::ostream& os, const std::string& title, const Metrics& m) {
  os << title << "\n";
  size_t w = 6;
  for (const auto& kv : m) w = std::max(w, kv.first.size());
  for (const auto& kv : m) {
    os << "  " << std::left << std::setw(static_cast<int>(w)) << kv.first << "  "
       << std::setprecision(6) << kv.second << "\n";
  }
}

std::string save_predictions(const std::vector<at::Tensor>& outputs, const std::string& dir,
                             const Strategy& strategy,
                             const std::vector<std::vector<int64_t>>& indices) {
  // With the samples' indices (one list per batch) the ranks' rows can be put in data set order
  // and the padding's repeats dropped.
  const std::map<std::string, at::Tensor> tensors =
      detail::prediction_tensors(outputs, indices.size() == outputs.size() ? &indices : nullptr);
  make_folder(dir, "the predictions' folder");
  // With several processes each rank predicted its own shard of the data: one file per rank.
  const std::string path =
      strategy.world_size() == 1
          ? dir + "/predictions.safetensors"
          : dir + "/predictions_rank" + std::to_string(strategy.rank()) + ".safetensors";
  save_safetensors(tensors, path);
  return path;
}

/// The save_dir/name roots of the loggers that take the next free version (-1), whose claims
/// the run shares (detail::SharedVersionClaims), so a CSV and a TensorBoard logger of one run
/// write one version_N instead of N and N+1. The version is claimed when the first of them
/// writes, by its mkdir: a run started at the same time into the same root gets another (the
/// folder listed here at configuration time would have given both the same), and a run that
/// stops before writing leaves no empty folder. Applies to loggers declaring save_dir, name and
/// version (the built-in ones do).
std::vector<std::string> next_version_roots(const std::vector<detail::ComponentConfig>& loggers,
                                            const LoggerContext& ctx) {
  std::vector<std::string> roots;
  for (const auto& l : loggers) {
    const auto& v = l.args.values();
    if (!v.count("save_dir") || !v.count("name") || !v.count("version") ||
        !l.args.holds<int64_t>("version") || l.args.get<int64_t>("version") != -1) {
      // A version of its own (or an invalid one, which the logger's constructor refuses).
      continue;
    }
    // A logger of the user's may declare them optional (Lightning's save_dir: Optional[str]);
    // unset, it decides its folder itself.
    if (!l.args.holds<std::string>("save_dir") || !l.args.holds<std::string>("name")) continue;
    std::string dir = l.args.get<std::string>("save_dir");
    if (dir.empty()) dir = ctx.default_root_dir;
    roots.push_back(dir + "/" + l.args.get<std::string>("name"));
  }
  return roots;
}

int run_report(const Command& cmd, std::ostream& out) {
  VOLT_CHECK(cmd.positional.size() == 1, ConfigError, "[cli] report takes one RUN_DIR, got ",
             cmd.positional.size(), "; e.g. volt report runs/volt_logs/version_0.");
  ReportOptions opts;
  for (const auto& s : cmd.sources) {
    VOLT_CHECK(s.kind == Source::Kind::kSet && (s.key == "output" || s.key == "title"), ConfigError,
               "[cli] report does not take ",
               s.kind == Source::Kind::kFile ? "--config" : "--" + s.key,
               "; its options are --output FILE and --title TEXT.");
    if (s.key == "output")
      opts.output(s.value);
    else
      opts.title(s.value);
  }
  const std::string path = write_run_report(cmd.positional.front(), opts);
  out << "report: " << path << "\n";
  return kCliOk;
}

int run_perf(const Command& cmd, std::ostream& out) {
  std::string trace;
  for (const auto& s : cmd.sources) {
    VOLT_CHECK(
        s.kind == Source::Kind::kSet && s.key == "trace", ConfigError, "[cli] perf does not take ",
        s.kind == Source::Kind::kFile ? "--config" : "--" + s.key, "; its option is --trace FILE.");
    trace = s.value;
  }
  VOLT_CHECK(cmd.positional.empty() && !trace.empty(), ConfigError,
             "[cli] perf needs one --trace FILE; e.g. volt perf --trace "
             "runs/volt_logs/version_0/fit-rank0.pt.trace.json.");
  auto in = detail::c_stream<std::ifstream>(trace, std::ios::binary);
  VOLT_CHECK(in.good(), ConfigError, "[cli] perf: cannot read ", trace,
             "; check the path (TorchProfiler writes it into the run's log folder).");
  detail::InputLimits limits;
  limits.max_bytes = detail::kTraceMaxBytes;
  const std::string text = detail::read_bounded(in, "perf", trace, limits);
  out << detail::format_scan(detail::scan_trace(text, trace), trace);
  return kCliOk;
}

int run_export(Command cmd, const Registry& reg, const CliOptions& options, std::ostream& out) {
  // --output and --dynamic_batch are export's own; the rest is the run's config.
  std::string output;
  bool dynamic_batch = true;
  std::vector<Source> config;
  for (const auto& s : cmd.sources) {
    if (s.kind == Source::Kind::kSet && s.key == "output") {
      output = s.value;
    } else if (s.kind == Source::Kind::kSet && s.key == "dynamic_batch") {
      VOLT_CHECK(s.value == "true" || s.value == "false", ConfigError,
                 "[cli] --dynamic_batch takes true or false, got \"", s.value, "\".");
      dynamic_batch = s.value == "true";
    } else {
      config.push_back(s);
    }
  }
  cmd.sources = config;
  VOLT_CHECK(cmd.positional.empty(), ConfigError, "[cli] unexpected argument \"",
             cmd.positional.front(), "\"; options are --key=value (did you forget the --?).");
  VOLT_CHECK(!output.empty(), ConfigError,
             "[cli] export needs --output=FILE, the TorchScript file to write; e.g. volt export "
             "--config run.yaml --ckpt_path=runs/checkpoints/last.ckpt --output=model.pt.");
  const ResolvedConfig rc = detail::resolve(build_tree(cmd, options), reg);
  const std::string ckpt = rc.ckpt_path.value_or("");
  VOLT_CHECK(!ckpt.empty(), ConfigError,
             "[cli] export needs --ckpt_path=CKPT, the checkpoint whose weights to export (a file "
             "fit wrote, a ZeRO folder or a .safetensors file); without it the model's initial "
             "weights would be written.");
  VOLT_CHECK(ckpt != "last" && ckpt != "best", ConfigError,
             "[cli] export takes a checkpoint's "
             "path, not \"",
             ckpt,
             "\" (that names a checkpoint of a running fit); e.g. "
             "--ckpt_path=runs/checkpoints/last.ckpt.");
  if (rc.seed_everything) seed_everything(static_cast<uint64_t>(*rc.seed_everything));
  std::shared_ptr<Module> model = reg.models.at(rc.model.class_path).make(rc.model.args);
  VOLT_CHECK(model != nullptr, ConfigError, "[cli] the factory of model ", rc.model.class_path,
             " returned null; make it return an object.");
  // `data: null`: the model's own loaders, whose set-up hooks are the model's.
  std::shared_ptr<DataModule> data =
      rc.data ? reg.data_modules.at(rc.data->class_path).make(rc.data->args)
              : std::make_shared<detail::ModuleData>(*model);
  const std::string data_name =
      rc.data ? "data module " + rc.data->class_path : "model " + rc.model.class_path;
  VOLT_CHECK(data != nullptr, ConfigError, "[cli] the factory of ", data_name,
             " returned null; make it return an object.");
  data->prepare_data();
  data->setup(Stage::kPredict);
  // Teardown runs however the export ends, as after a Trainer run (a failure's own error wins
  // over one from teardown).
  bool model_set_up = false;
  auto teardown = [&] {
    data->teardown(Stage::kPredict);
    if (model_set_up) model->teardown(Stage::kPredict);
  };
  Batch example;
  try {
    model->setup(Stage::kPredict);
    model_set_up = true;
    model->configure_model();
    c10::optional<DataLoader> loader;
    for (Stage stage : {Stage::kPredict, Stage::kTest, Stage::kValidate}) {
      auto loaders = detail::stage_loaders(*data, stage, /*required=*/false);
      if (!loader && !loaders.empty()) loader = loaders.front();
    }
    VOLT_CHECK(loader.has_value(), ConfigError, "[cli] export: ", data_name,
               " gives no predict, test or validation loader to take an example batch from; "
               "give it a predict_dataloader().");
    Batch raw;
    VOLT_CHECK(loader->stream(0, 0, 1).next(raw) && raw.input.defined(), ConfigError,
               "[cli] export: the first loader of ", data_name,
               " gave no batch (or one without an input); it needs at least one sample.");
    // The batch as predict_step gets it: through the batch hooks before and after the transfer
    // (the DataModule's or the model's); no transfer, the model stays on the CPU.
    const auto plain = [](const char*, const std::function<void()>& fn) { fn(); };
    example =
        detail::run_batch_hooks(data.get(), *model, std::move(raw), c10::nullopt, plain, plain);
    VOLT_CHECK(example.input.defined(), ConfigError, "[cli] export: the batch hooks of ",
               rc.data ? rc.data->class_path + " / " : std::string(), rc.model.class_path,
               " left the example batch without an input; return the batch with its input.");
    std::shared_ptr<CheckpointIO> io;  // the run's own, when its config names one
    if (rc.checkpoint_io) {
      io = reg.checkpoint_ios.at(rc.checkpoint_io->class_path).make(rc.checkpoint_io->args);
    }
    load_weights(*model, ckpt, /*strict=*/true, io);
    to_torchscript(*model, example.input,
                   TorchScriptOptions().file_path(output).dynamic_batch(dynamic_batch));
  } catch (...) {
    try {
      teardown();
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
  teardown();
  auto shape = detail::c_stream<std::ostringstream>();
  shape << example.input.sizes() << " " << example.input.dtype();
  out << "exported: " << output << " (" << rc.model.class_path << "'s predict_step on input "
      << shape.str() << ", checked against it at " << example.input.size(0)
      << (dynamic_batch ? " and " + std::to_string(example.input.size(0) + 1) : std::string())
      << " rows)\n";
  return kCliOk;
}

// zero-to-fp32 and consolidate: a folder of shards into one file (consolidate also takes
// model_parallel's folders).
int run_consolidate(const Command& cmd, std::ostream& out) {
  bool weights_only = false;
  const std::string& name = cmd.name;
  for (const auto& s : cmd.sources) {
    VOLT_CHECK(s.kind == Source::Kind::kSet && s.key == "weights_only", ConfigError, "[cli] ", name,
               " takes FOLDER, OUT and --weights_only=BOOL only; e.g. volt ", name,
               " runs/checkpoints/last.ckpt full.ckpt.");
    VOLT_CHECK(s.value == "true" || s.value == "false", ConfigError,
               "[cli] --weights_only takes true or false, got \"", s.value, "\".");
    weights_only = s.value == "true";
  }
  VOLT_CHECK(cmd.positional.size() == 2, ConfigError, "[cli] ", name,
             " takes FOLDER and OUT; e.g. volt ", name, " runs/checkpoints/last.ckpt full.ckpt.");
  const std::string& folder = cmd.positional[0];
  if (name == "consolidate" && is_model_parallel_checkpoint(folder)) {
    consolidate_model_parallel_checkpoint(folder, cmd.positional[1], weights_only);
  } else {
    VOLT_CHECK(name != "consolidate" || is_zero_checkpoint(folder), CheckpointError, "[cli] '",
               folder,
               "' is not a complete ZeRO or model_parallel checkpoint folder (no metadata file: "
               "not a folder of shards, or a save was interrupted); pass a folder a "
               "DeepSpeedStrategy or ModelParallelStrategy run wrote.");
    consolidate_zero_checkpoint(folder, cmd.positional[1],
                                weights_only ? ZeroContents::kWeights : ZeroContents::kEverything);
  }
  out << "consolidated" << (weights_only ? " (weights)" : "") << ": " << cmd.positional[1] << "\n";
  return kCliOk;
}

// What this build of volt and this machine can run: the facts an error like "backend gloo is not
// in this build" or a skipped GPU test depends on.
void print_build(std::ostream& out) {
  const auto yes_or = [](const std::string& why_not) {
    return why_not.empty() ? std::string("yes") : "no (" + why_not + ")";
  };
  const int64_t gpus = torch::cuda::is_available() ? torch::cuda::device_count() : 0;
  out << "[build]\n"
      << "  libtorch            " << TORCH_VERSION << "\n"
      << "  CUDA devices        " << gpus << "\n"
      << "  CUDA graphs         "
      << yes_or(CudaGraph::available() ? "" : CudaGraph::unavailable_reason()) << "\n"
      << "  Gloo process group  "
      << yes_or(ProcessGroup::backend_unavailable_reason(Backend::kGloo)) << "\n"
      << "  NCCL process group  "
      << yes_or(ProcessGroup::backend_unavailable_reason(Backend::kNccl)) << "\n"
      << "  intra-op threads    " << at::get_num_threads() << "\n\n";
}

int run_env(const Command& cmd, std::ostream& out) {
  VOLT_CHECK(cmd.positional.empty() && cmd.sources.empty(), ConfigError,
             "[cli] env takes no arguments; run `volt env`.");
  print_build(out);
  out << "Environment variables volt reads (value in this process, \"-\" when unset):\n";
  size_t width = 0;
  for (const auto& v : env_vars()) width = std::max(width, v.name.size());
  c10::optional<EnvGroup> group;
  for (const auto& v : env_vars()) {
    if (group != v.group) {
      group = v.group;
      out << "\n[" << to_string(v.group) << "]\n";
    }
    const char* value = std::getenv(v.name.c_str());
    out << "  " << std::left << std::setw(static_cast<int>(width)) << v.name << "  "
        << (value != nullptr && *value != '\0' ? value : "-") << "\n      " << v.values << ": "
        << v.meaning << "\n";
  }
  const auto unknown = unknown_env_warnings();
  if (!unknown.empty()) out << "\n";
  for (const auto& w : unknown) out << "warning: " << w << "\n";
  for (const auto& v : env_vars()) env_value(v.name);  // a value volt rejects: exit code 2
  return kCliOk;
}

int run_kernel_cache(const Command& cmd, std::ostream& out) {
  const std::string action = cmd.positional.empty() ? "list" : cmd.positional.front();
  VOLT_CHECK(
      cmd.positional.size() <= 1 && cmd.sources.empty() && (action == "list" || action == "clear"),
      ConfigError,
      "[cli] kernel-cache takes list or clear (nothing else); e.g. volt kernel-cache clear.");
  // Never clear_at_start here: listing must not remove what it lists.
  KernelCache cache(KernelCacheOptions::from_env().clear_at_start(false));
  const auto& o = cache.options();
  VOLT_CHECK(cache.enabled(), ConfigError, "[cli] kernel-cache: the folder '", o.dir(),
             "' cannot be used (see the warning above); set VOLT_KERNEL_CACHE_CONFIG="
             "<writable folder>,false,1024.");
  const auto entries = cache.entries();
  if (action == "clear") {
    for (const auto& e : entries) cache.remove(e.key);
    out << "removed " << entries.size() << " entries from " << o.dir() << "\n";
    return kCliOk;
  }
  int64_t total = 0;
  for (const auto& e : entries) total += e.bytes;
  out << "kernel cache " << o.dir() << ": " << entries.size() << " entries, " << std::fixed
      << std::setprecision(2) << static_cast<double>(total) / (1 << 20) << " MiB of " << o.size_mb()
      << " MiB\n";
  for (const auto& e : entries) out << "  " << std::setw(10) << e.bytes << "  " << e.key << "\n";
  return kCliOk;
}

// `text` and a newline in one write: std::cerr writes each insertion at once, so the lines of
// the ranks of a job, which share a terminal, would otherwise interleave mid-line.
void print_line(std::ostream& err, const std::string& text) {
  err << text + "\n";
}

// A failure that is not a volt::Error: an allocation, an error raised by the model's code or
// libtorch during the run (the Trainer logged where: step or hook, epoch and batch), or, before
// any run, a volt bug.
int report_foreign_error(const std::exception& e, bool during_run, std::ostream& out) {
  auto err = detail::c_stream<std::ostringstream>();
  if (detail::is_out_of_memory(e)) {
    err << "[cli] out of memory: " << detail::first_line(e.what())
        << "; the model, its optimizer state or a batch does not fit in this machine's memory: "
           "lower the batch size or the model's size, or shard the run "
           "(--trainer.strategy=deepspeed_stage_3 over several processes, or "
           "deepspeed_stage_3_offload).\n";
  } else if (during_run) {
    err << "[cli] the run failed: " << detail::exception_summary(e)
        << "; the Trainer's error above names the step or hook and the batch that raised it.\n";
  } else {
    err << "[cli] unexpected error: " << e.what()
        << "; this is likely a volt bug, please report it with the command line.\n";
  }
  out << err.str();  // one write: the ranks of a job share a terminal
  record_error_for_torchrun(e);
  return kCliRunFailed;
}

/// Keeps the loggers' shared version claim (one version_N for all of a run's loggers) alive
/// until the first entry point ends (build_cli returns before they first write): later, another
/// Trainer's logger of the same root must not join this run's folder.
class LoggerVersionClaims : public Callback {
 public:
  explicit LoggerVersionClaims(std::shared_ptr<const detail::SharedVersionClaims> claims)
      : claims_(std::move(claims)) {}
  std::string state_key() const override { return "LoggerVersionClaims"; }
  void teardown(RunContext&, Module&, Stage) override { claims_.reset(); }

 private:
  std::shared_ptr<const detail::SharedVersionClaims> claims_;
};

// LightningCLI's automatic configure_optimizers: the config's optimizer (and lr_scheduler)
// built over the module's parameters, each tensor once, whenever the Trainer asks, so after
// configure_model (Lightning builds them once, in the CLI, before configure_model). Tried first
// on a stand-in parameter: a bad argument stops the CLI (exit code 2), not the fit.
std::function<std::vector<OptimizerConfig>(Module&)> automatic_optimizers(const ResolvedConfig& rc,
                                                                          const Registry& reg) {
  const detail::ComponentConfig opt = *rc.optimizer;
  auto make_optimizer = reg.optimizers.at(opt.class_path).make;
  std::optional<detail::ComponentConfig> sched = rc.lr_scheduler;
  ComponentRegistry<LRScheduler, torch::optim::Optimizer&>::Factory make_scheduler;
  std::string monitor;
  if (sched) {
    make_scheduler = reg.lr_schedulers.at(sched->class_path).make;
    // Lightning's ReduceLROnPlateau takes the metric it watches as an argument.
    const ParamSpec* m = sched->params != nullptr ? sched->params->find("monitor") : nullptr;
    if (m != nullptr && m->type == ParamType::kString) {
      monitor = sched->args.get_optional<std::string>("monitor").value_or("");
    }
  }
  auto make = [opt, sched, make_optimizer, make_scheduler,
               monitor](const std::vector<at::Tensor>& params) {
    std::shared_ptr<torch::optim::Optimizer> optimizer = make_optimizer(opt.args, params);
    VOLT_CHECK(optimizer != nullptr, ConfigError, "[cli] the factory of optimizer ", opt.class_path,
               " returned null; make it return an optimizer.");
    OptimizerConfig config(optimizer);
    if (sched) {
      std::shared_ptr<LRScheduler> scheduler = make_scheduler(sched->args, *optimizer);
      VOLT_CHECK(scheduler != nullptr, ConfigError, "[cli] the factory of lr_scheduler ",
                 sched->class_path, " returned null; make it return a scheduler.");
      config.scheduler(std::move(scheduler)).monitor(monitor);
    }
    return std::vector<OptimizerConfig>{config};
  };
  make({torch::zeros({1}, torch::requires_grad())});
  return [make](Module& module) { return make(distinct_parameters(module)); };
}

/// What a resolved config builds: run_cli runs it, build_cli hands it over.
struct Built {
  std::shared_ptr<Trainer> trainer;
  std::shared_ptr<Module> model;
  std::shared_ptr<DataModule> data;
  std::shared_ptr<SaveConfig> save_config;          // null when not saving
  std::shared_ptr<PredictIndices> predict_indices;  // null unless asked for
};

Built build_objects(const ResolvedConfig& rc, const std::string& yaml, const Registry& reg,
                    bool save, bool predict_indices) {
  // Build everything before running: a bad value stops here with exit code 2. A checkpoint path
  // that names nothing too (the run found it only as it loaded it: exit code 1, where export
  // said 2).
  if (rc.ckpt_path && !rc.ckpt_path->empty() && *rc.ckpt_path != "last" &&
      *rc.ckpt_path != "best") {
    std::error_code ec;
    VOLT_CHECK(std::filesystem::exists(*rc.ckpt_path, ec), ConfigError, "[cli] ckpt_path '",
               *rc.ckpt_path,
               "' does not exist; pass a checkpoint fit wrote (a file or a ZeRO folder), or "
               "\"last\" / \"best\".");
  }
  if (rc.seed_everything) seed_everything(static_cast<uint64_t>(*rc.seed_everything));
  TrainerOptions opts = detail::trainer_options(rc.trainer);
  const LoggerContext lctx{opts.default_root_dir()};
  auto one_version =
      std::make_shared<const detail::SharedVersionClaims>(next_version_roots(rc.loggers, lctx));
  std::vector<std::shared_ptr<Logger>> loggers;
  for (const auto& l : rc.loggers) {
    loggers.push_back(reg.loggers.at(l.class_path).make(l.args, lctx));
  }
  std::vector<std::shared_ptr<Callback>> callbacks;
  Built b;
  for (const auto& c : rc.callbacks)
    callbacks.push_back(reg.callbacks.at(c.class_path).make(c.args));
  if (rc.profiler) {
    opts.profiler(reg.profilers.at(rc.profiler->class_path).make(rc.profiler->args));
  }
  if (rc.checkpoint_io) {
    opts.checkpoint_io(
        reg.checkpoint_ios.at(rc.checkpoint_io->class_path).make(rc.checkpoint_io->args));
  }
  if (rc.strategy) {
    // Built by the Trainer (it needs the resolved accelerator and precision), with these args.
    opts.strategy(
        Spec<Strategy>(rc.strategy->class_path, std::make_shared<const Args>(rc.strategy->args)));
  }
  if (rc.precision) {
    opts.precision(Spec<Precision>(rc.precision->class_path,
                                   std::make_shared<const Args>(rc.precision->args)));
  }
  if (save) {
    b.save_config = std::make_shared<SaveConfig>(yaml, opts.fast_dev_run() == 0);
    callbacks.push_back(b.save_config);
  }
  if (predict_indices) {
    b.predict_indices = std::make_shared<PredictIndices>();
    callbacks.push_back(b.predict_indices);
  }
  if (!rc.loggers.empty()) callbacks.push_back(std::make_shared<LoggerVersionClaims>(one_version));
  opts.callbacks(callbacks).loggers(loggers);
  b.trainer = std::make_shared<Trainer>(opts);
  b.model = reg.models.at(rc.model.class_path).make(rc.model.args);
  if (b.model) record_model_config(*b.model, rc.model);
  if (rc.data) b.data = reg.data_modules.at(rc.data->class_path).make(rc.data->args);
  VOLT_CHECK(b.model && (b.data || !rc.data), ConfigError, "[cli] the factory of ",
             b.model ? "data module " : "model ",
             b.model ? rc.data->class_path : rc.model.class_path,
             " returned null; make it return an object.");
  if (rc.optimizer) {
    auto automatic = automatic_optimizers(rc, reg);
    // Lightning's warning when the module has its own (every volt module has one).
    log_warning("cli", "the model " + rc.model.class_path +
                           "'s configure_optimizers() is replaced by the config's optimizer " +
                           rc.optimizer->class_path +
                           (rc.lr_scheduler ? " and lr_scheduler " + rc.lr_scheduler->class_path
                                            : std::string()) +
                           " (LightningCLI's automatic configure_optimizers).");
    b.model->replace_configure_optimizers(std::move(automatic));
  }
  return b;
}

int run_command(const Command& cmd, const Registry& reg, const CliOptions& options,
                std::ostream& out, std::ostream& err) {
  if (cmd.name == "env") return run_env(cmd, out);
  if (cmd.name == "kernel-cache") return run_kernel_cache(cmd, out);
  if (cmd.name == "report") return run_report(cmd, out);
  if (cmd.name == "zero-to-fp32" || cmd.name == "consolidate") return run_consolidate(cmd, out);
  if (cmd.name == "export") return run_export(cmd, reg, options, out);
  if (cmd.name == "perf") return run_perf(cmd, out);
  VOLT_CHECK(cmd.positional.empty(), ConfigError, "[cli] unexpected argument \"",
             cmd.positional.front(), "\"; options are --key=value (did you forget the --?).");

  const ResolvedConfig rc = detail::resolve(build_tree(cmd, options), reg);
  const std::string yaml = detail::to_yaml(rc);
  if (cmd.name == "print-config") {
    out << yaml;
    return kCliOk;
  }

  const Built built = build_objects(rc, yaml, reg, options.save_config, cmd.name == "predict");
  Trainer& trainer = *built.trainer;
  Module* model = built.model.get();
  DataModule* data = built.data.get();
  const std::shared_ptr<SaveConfig>& save_config = built.save_config;
  const std::shared_ptr<PredictIndices>& predict_indices = built.predict_indices;
  const std::string ckpt = rc.ckpt_path.value_or("");
  // Only global rank 0 prints the summary (the strategy knows the rank once a run started).
  std::ostream discard(nullptr);
  auto report = [&]() -> std::ostream& {
    return trainer.strategy().is_global_zero() ? out : discard;
  };

  try {
    if (cmd.name == "fit") {
      const auto t0 = std::chrono::steady_clock::now();
      data ? trainer.fit(*model, *data, ckpt) : trainer.fit(*model, ckpt);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      report() << "fit finished in " << std::fixed << std::setprecision(1) << secs << " s ("
               << trainer.state().global_step << " steps)\n";
      report().unsetf(std::ios::fixed);
      print_metrics(report(), "final metrics:", trainer.callback_metrics());
      for (const auto& c : trainer.callbacks()) {
        if (auto mc = std::dynamic_pointer_cast<ModelCheckpoint>(c)) {
          if (!mc->best_model_path().empty())
            report() << "best checkpoint: " << mc->best_model_path() << "\n";
          if (!mc->last_model_path().empty())
            report() << "last checkpoint: " << mc->last_model_path() << "\n";
        }
      }
    } else if (cmd.name == "validate") {
      const Metrics m =
          data ? trainer.validate(*model, *data, ckpt) : trainer.validate(*model, ckpt);
      if (rc.verbose) print_metrics(report(), "validation metrics:", m);
    } else if (cmd.name == "test") {
      const Metrics m = data ? trainer.test(*model, *data, ckpt) : trainer.test(*model, ckpt);
      if (rc.verbose) print_metrics(report(), "test metrics:", m);
    } else {
      auto preds = data ? trainer.predict(*model, *data, ckpt) : trainer.predict(*model, ckpt);
      if (trainer.options().return_predictions()) {
        report() << "predictions: "
                 << save_predictions(preds, trainer.log_dir(), trainer.strategy(),
                                     predict_indices->indices)
                 << " (" << preds.size() << " batches)\n";
      } else {
        // A SafetensorsPredictionWriter (or none) wrote them; say where.
        std::string where = "not kept (trainer.return_predictions=false)";
        for (const auto& c : trainer.callbacks()) {
          if (auto* w = dynamic_cast<const SafetensorsPredictionWriter*>(c.get())) {
            where = "written by SafetensorsPredictionWriter to " + w->output_dir();
          }
        }
        report() << "predictions: " << where << "\n";
      }
    }
  } catch (const Interrupted& e) {
    // Every rank stopped at the same batch with the same message: rank 0 prints it.
    if (trainer.strategy().is_global_zero()) print_line(err, e.what());
    return kCliInterruptedBase + e.signal();
  } catch (const Error& e) {
    print_line(err, e.what());
    record_error_for_torchrun(e);
    // Bad configuration that only the run could see (a monitored metric nobody logs) or that
    // this build or machine cannot run (16-mixed on a libtorch 1.13 CPU) is still bad input:
    // retrying will not help, changing the config will.
    const bool bad_config = dynamic_cast<const ConfigError*>(&e) != nullptr ||
                            dynamic_cast<const NotAvailable*>(&e) != nullptr;
    return bad_config ? kCliBadUsage : kCliRunFailed;
  } catch (const std::exception& e) {
    return report_foreign_error(e, /*during_run=*/true, err);
  }
  if (save_config && !save_config->path().empty()) {
    report() << "config: " << save_config->path() << "\n";
  }
  report() << "logs: " << trainer.log_dir() << "\n";
  return kCliOk;
}

}  // namespace

void record_error_for_torchrun(const std::exception& e) noexcept {
  try {
    const auto path = env_value("TORCHELASTIC_ERROR_FILE");
    if (!path || path->empty()) return;
    // The layout of Python's @record (torch.distributed.elastic's ErrorHandler): torchrun's
    // agent reads message.extraInfo.py_callstack (shown as the traceback) and the timestamp
    // that picks the root cause, the first failure.
    const std::string text = c10::demangle(typeid(e).name()) + ": " + e.what();
    const nlohmann::json data = {
        {"message",
         {{"message", text},
          {"extraInfo",
           {{"py_callstack", text}, {"timestamp", std::to_string(std::time(nullptr))}}}}}};
    atomic_write_file(*path, data.dump(2) + "\n");
  } catch (const std::exception& write_error) {
    log_warning("cli", std::string("could not write torchrun's error file: ") + write_error.what());
  } catch (...) {
  }
}

namespace {

// CliOptions with its defaults filled in: where output and errors go, the registry, the name.
struct Setting {
  Setting(int argc, const char* const* argv, const CliOptions& options)
      : out(options.out ? *options.out : std::cout),
        err(options.err ? *options.err : std::cerr),
        reg(options.registry ? *options.registry : registry()),
        prog(options.program.empty() ? file_name(argc > 0 ? argv[0] : nullptr) : options.program) {}
  std::ostream& out;
  std::ostream& err;
  const Registry& reg;
  const std::string prog;
};

}  // namespace

CliObjects build_cli(int argc, const char* const* argv, const CliOptions& options) {
  const Setting set(argc, argv, options);
  std::ostream& out = set.out;
  std::ostream& err = set.err;
  const Registry& reg = set.reg;
  const std::string& prog = set.prog;
  CliObjects objects;
  try {
    Command cmd;  // no command: options only
    parse_options(cmd, argc, argv, 1);
    if (!cmd.class_help_key.empty() && cmd.positional.empty()) {
      print_class_help(out, reg, cmd.class_help_key, cmd.class_help_name);
      objects.exit_code = kCliOk;
      return objects;
    }
    if (cmd.help) {
      print_build_help(out, prog, reg, options);
      objects.exit_code = kCliOk;
      return objects;
    }
    VOLT_CHECK(cmd.positional.empty(), ConfigError, "[cli] unexpected argument \"",
               cmd.positional.front(), "\"; ", prog,
               " takes options only (--config FILE, --key=value, --help, --print_config): it "
               "decides itself what to run.");
    const ResolvedConfig rc = detail::resolve(build_tree(cmd, options), reg);
    objects.config = detail::to_yaml(rc);
    if (cmd.print_config) {
      out << objects.config;
      objects.exit_code = kCliOk;
      return objects;
    }
    Built built = build_objects(rc, objects.config, reg, options.save_config, false);
    objects.trainer = std::move(built.trainer);
    objects.model = std::move(built.model);
    objects.data = std::move(built.data);
    objects.ckpt_path = rc.ckpt_path.value_or("");
  } catch (const Error& e) {
    print_line(err, e.what());
    record_error_for_torchrun(e);
    objects = CliObjects();
    objects.exit_code = kCliBadUsage;
  } catch (const std::exception& e) {
    objects = CliObjects();
    objects.exit_code = report_foreign_error(e, /*during_run=*/false, err);
  }
  return objects;
}

int run_cli(int argc, const char* const* argv, const CliOptions& options) {
  const Setting set(argc, argv, options);
  std::ostream& out = set.out;
  std::ostream& err = set.err;
  const Registry& reg = set.reg;
  const std::string& prog = set.prog;
  try {
    const Command cmd = parse_argv(argc, argv);
    if (!cmd.class_help_key.empty()) {
      VOLT_CHECK(cmd.name == "fit" || cmd.name == "validate" || cmd.name == "test" ||
                     cmd.name == "predict" || cmd.name == "print-config",
                 ConfigError, "[cli] --", cmd.class_help_key,
                 ".help is an option of fit, validate, test, predict and print-config; write ",
                 prog, " fit --", cmd.class_help_key, ".help ", cmd.class_help_name, ".");
      VOLT_CHECK(cmd.positional.empty(), ConfigError, "[cli] unexpected argument \"",
                 cmd.positional.front(), "\"; options are --key=value (did you forget the --?).");
      print_class_help(out, reg, cmd.class_help_key, cmd.class_help_name);
      return kCliOk;
    }
    if (cmd.help) {
      print_help(out, prog, cmd.name, reg, options);
      return kCliOk;
    }
    return run_command(cmd, reg, options, out, err);
  } catch (const Error& e) {
    // Raised before the run started: the command line, the config, or building its objects.
    print_line(err, e.what());
    record_error_for_torchrun(e);
    return kCliBadUsage;
  } catch (const std::exception& e) {
    return report_foreign_error(e, /*during_run=*/false, err);
  }
}

}  // namespace volt
