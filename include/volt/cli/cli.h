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
#include <string>

namespace volt {

struct Registry;

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
};

/// Runs `fit | validate | test | predict | print-config | report` as argv says and returns a
/// CliExit code; every error is reported as one "[component] what; how to fix" line, never
/// thrown.
int run_cli(int argc, const char* const* argv, const CliOptions& options = {});

/// Under torchrun, writes `e` to the file its agent named in TORCHELASTIC_ERROR_FILE, in the
/// layout of Python's @record, so that torchrun's failure summary shows this worker's error
/// (and picks the first failure as the root cause) instead of "error_file: <N/A>". Does nothing
/// when the variable is unset; never throws (a write that fails is logged). run_cli calls it
/// for every error; call it from your own main's catch when you drive the Trainer directly.
void record_error_for_torchrun(const std::exception& e) noexcept;

}  // namespace volt
