// Registers this folder's built-in names; called once from registry() (src/trainer/builtins.cpp).
#include "volt/core/registry.h"
#include "volt/loggers/csv.h"
#include "volt/loggers/tensorboard.h"

namespace volt::detail {
namespace {

/// A logger writing save_dir/name/version_N (CSVLogger, TensorBoardLogger): the parameters they
/// share, with defaults read from its Options.
template <typename O>
Params run_folder_params() {
  const O d("");
  Params p;
  p.add("save_dir", "", "root folder of all runs; \"\" = trainer.default_root_dir")
      .add("name", d.name(), "experiment name (sub-folder)")
      .add("version", d.version(), "version_N folder; -1 = next free")
      .add("prefix", d.prefix(), "put before every metric name, joined with \"-\"")
      .add("flush_logs_every_n_steps", d.flush_logs_every_n_steps(),
           "CSVLogger: write the rows when the step passes a multiple of N (or N rows "
           "wait); TensorBoardLogger: every N log calls (the Trainer writes after each row)");
  return p;
}

template <typename O>
O run_folder_options(const Args& a, const LoggerContext& c) {
  const std::string& dir = a.get<std::string>("save_dir");
  return O(dir.empty() ? c.default_root_dir : dir)
      .name(a.get<std::string>("name"))
      .version(a.get<int64_t>("version"))
      .prefix(a.get<std::string>("prefix"))
      .flush_logs_every_n_steps(a.get<int64_t>("flush_logs_every_n_steps"));
}

}  // namespace

void register_loggers(Registry& r) {
  r.loggers.add("CSVLogger", "metrics.csv and hparams.yaml per run",
                run_folder_params<CSVLoggerOptions>(),
                [](const Args& a, const LoggerContext& c) -> std::shared_ptr<Logger> {
                  return std::make_shared<CSVLogger>(run_folder_options<CSVLoggerOptions>(a, c));
                });
  const TensorBoardLoggerOptions tb("");
  r.loggers.add(
      "TensorBoardLogger", "TensorBoard event files (scalars, hparams)",
      run_folder_params<TensorBoardLoggerOptions>()
          .add("default_hp_metric", tb.default_hp_metric(),
               "log hp_metric = -1 with the hyper-parameters (a metric column for the HParams "
               "tab)")
          .add("flush_secs", tb.flush_secs(),
               "also write at a log call this many seconds after the last write"),
      [](const Args& a, const LoggerContext& c) -> std::shared_ptr<Logger> {
        return std::make_shared<TensorBoardLogger>(
            run_folder_options<TensorBoardLoggerOptions>(a, c)
                .default_hp_metric(a.get<bool>("default_hp_metric"))
                .flush_secs(a.get<double>("flush_secs")));
      });
}

}  // namespace volt::detail
