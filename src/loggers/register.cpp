// Registers this folder's built-in names; called once from registry() (src/trainer/builtins.cpp).
#include "volt/core/registry.h"
#include "volt/loggers/csv.h"
#include "volt/loggers/tensorboard.h"

namespace volt::detail {
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
               "CSVLogger: write the rows when the step passes a multiple of N (or N rows "
               "wait); TensorBoardLogger: every N log calls"),
      [](const Args& a, const LoggerContext& c) -> std::shared_ptr<Logger> {
        const std::string& dir = a.get<std::string>("save_dir");
        return std::make_shared<L>(
            O(dir.empty() ? c.default_root_dir : dir)
                .name(a.get<std::string>("name"))
                .version(a.get<int64_t>("version"))
                .flush_logs_every_n_steps(a.get<int64_t>("flush_logs_every_n_steps")));
      });
}

}  // namespace

void register_loggers(Registry& r) {
  add_run_folder_logger<CSVLogger, CSVLoggerOptions>(r, "CSVLogger",
                                                     "metrics.csv and hparams.yaml per run");
  add_run_folder_logger<TensorBoardLogger, TensorBoardLoggerOptions>(
      r, "TensorBoardLogger", "TensorBoard event files (scalars, hparams)");
}

}  // namespace volt::detail
