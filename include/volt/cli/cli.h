#pragma once
/// run_cli: the `volt` command line (Lightning's LightningCLI) for your own binary.
///
///   int main(int argc, char** argv) {
///     volt::registry().models.add("MyModel", "...", volt::Params().add("lr", 1e-3, "..."),
///                                 [](const volt::Args& a) { return std::make_shared<MyModel>(...);
///                                 });
///     volt::registry().data_modules.add("MyData", ...);
///     return volt::run_cli(argc, argv);
///   }
///
/// Then: `my_cli fit --config run.yaml --trainer.max_epochs=3 --model.lr=3e-4`,
/// `my_cli print-config ...`, `my_cli fit --help`, `my_cli report runs/version_0`.

#include <exception>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace volt {

struct Registry;
class Trainer;
class Module;
class DataModule;

/// Exit codes of run_cli.
enum CliExit : int {
  kCliOk = 0,
  kCliRunFailed = 1,  ///< the run started and failed (data, checkpoint, non-finite loss ...)
  /// Bad command line or config: any volt error raised before the run started (the command
  /// line, the config, building its objects, e.g. a data module whose data path is not there), a
  /// ConfigError raised by the run (e.g. EarlyStopping's monitor was never logged), or a
  /// NotAvailable (a config this build or machine cannot run, such as 16-mixed on a libtorch
  /// 1.13 CPU).
  kCliBadUsage = 2,
  /// Stopped by a signal (volt::Interrupted): 128 + the signal, as a shell reports a process
  /// that signal ended, i.e. 130 for SIGINT (Ctrl-C) and 143 for SIGTERM.
  kCliInterruptedBase = 128,
};

struct CliOptions {
  /// Program name in usage lines. Default: argv[0]'s file name.
  std::string program;
  /// Where results, help and print-config go. Default: std::cout.
  std::ostream* out = nullptr;
  /// Where errors go. Default: std::cerr.
  std::ostream* err = nullptr;
  /// Component names to build from. Default: volt::registry().
  const Registry* registry = nullptr;
  /// Your program's own defaults (Lightning's trainer_defaults, seed_everything_default and
  /// model_class in one): YAML in the config's layout, read before any default config file,
  /// --config file and override, which override it. `--help` shows it, print-config includes
  /// it. E.g. "model: MyModel\ntrainer:\n  max_epochs: 20\n  callbacks: [EarlyStopping]\n".
  /// Malformed YAML or a bad value is a ConfigError naming "CliOptions::defaults". Default: none.
  std::string defaults;
  /// Config files read after `defaults` and before the command line's (Lightning's
  /// parser_kwargs default_config_files); one that does not exist is skipped. Default: none.
  std::vector<std::string> default_config_files;
  /// Write the resolved config into the run's log folder as config.yaml when an entry point
  /// first runs (Lightning's SaveConfigCallback; false: its save_config_callback=None).
  /// Default: true.
  bool save_config = true;
};

/// Runs `fit | validate | test | predict | print-config | report` as argv says and returns a
/// CliExit code; every error is reported as one "[component] what; how to fix" line, never
/// thrown.
int run_cli(int argc, const char* const* argv, const CliOptions& options = {});

/// What build_cli made from a command line: the objects a config describes, built and not run.
struct CliObjects {
  /// Set when the program should exit with it instead of running: kCliOk after --help or
  /// --print_config (printed on CliOptions::out), kCliBadUsage after a bad command line or config
  /// (one "[component] what; how to fix" line on CliOptions::err). Unset: the objects are ready.
  std::optional<int> exit_code;
  /// With the config's options, callbacks, loggers, profiler, strategy and precision (and the
  /// config saver unless CliOptions::save_config is false).
  std::shared_ptr<Trainer> trainer;
  std::shared_ptr<Module> model;
  /// Null under `data: null` (the model's own loaders): call the entry points given the model
  /// only (trainer->fit(*cli.model, cli.ckpt_path)).
  std::shared_ptr<DataModule> data;
  /// The config's ckpt_path ("" when unset): pass it to fit / validate / test / predict.
  std::string ckpt_path;
  /// The resolved config as YAML (what print-config prints and config.yaml holds).
  std::string config;
};

/// Lightning's LightningCLI(run=False): reads `--config FILE`, `--section.key=VALUE`, `--help`
/// and `--print_config` (no command; the keys of `volt fit --help`), seeds, builds the Trainer,
/// model and data module, and returns them for your program to run as it likes:
///
///   auto cli = volt::build_cli(argc, argv, options);
///   if (cli.exit_code) return *cli.exit_code;
///   cli.trainer->fit(*cli.model, *cli.data, cli.ckpt_path);
///   cli.trainer->test(*cli.model, *cli.data, "best");
///
/// Never throws; errors raised by the entry points you then call are yours to catch.
CliObjects build_cli(int argc, const char* const* argv, const CliOptions& options = {});

/// Under torchrun, writes `e` to the file its agent named in TORCHELASTIC_ERROR_FILE, in the
/// layout of Python's @record, so that torchrun's failure summary shows this worker's error
/// (and picks the first failure as the root cause) instead of "error_file: <N/A>". Does nothing
/// when the variable is unset; never throws (a write that fails is logged). run_cli calls it
/// for every error; call it from your own main's catch when you drive the Trainer directly.
void record_error_for_torchrun(const std::exception& e) noexcept;

}  // namespace volt
