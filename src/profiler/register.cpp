// Registers this folder's built-in names; called once from registry() (src/trainer/builtins.cpp).
#include "volt/core/registry.h"
#include "volt/profiler/simple.h"
#include "volt/profiler/torch.h"

namespace volt::detail {

void register_profilers(Registry& r) {
  r.profilers.add(
      "SimpleProfiler", "wall time per hook and loop stage, reported when a run ends",
      Params()
          .add("dirpath", "", "folder for the report; \"\" = the run's log folder")
          .add("filename", "", "report file stem (<stage>-<filename>.txt); \"\" prints it"),
      [](const Args& a) -> std::shared_ptr<Profiler> {
        return std::make_shared<SimpleProfiler>(SimpleProfilerOptions()
                                                    .dirpath(a.get<std::string>("dirpath"))
                                                    .filename(a.get<std::string>("filename")));
      });

  // Parameter defaults come from the Options struct, so they have one source.
  const TorchProfilerOptions t;
  r.profilers.add(
      "TorchProfiler",
      "libtorch ops and volt regions of scheduled steps: Chrome trace per rank + summary table",
      Params()
          .add("dirpath", t.dirpath(), "folder for trace and summary; \"\" = the run's log folder")
          .add("filename", t.filename(),
               "file stem: <stage>[-<filename>]-rank<R>.pt.trace.json / .txt; \"\" prints the "
               "summary")
          .add("record_ops", t.record_ops(), "record libtorch ops (false: volt regions only)")
          .add("record_shapes", t.record_shapes(), "record each op's input shapes")
          .add("wait", t.wait(), "schedule: steps skipped per cycle")
          .add("warmup", t.warmup(), "schedule: steps recorded then discarded per cycle")
          .add("active", t.active(), "schedule: steps kept per cycle; 0 = the whole run")
          .add("repeat", t.repeat(), "schedule: cycles; 0 = until the run ends")
          .add("row_limit", t.row_limit(), "rows in the summary table (top N by self time)")
          .add("tensorboard", t.tensorboard(),
               "name the trace for TensorBoard's PyTorch profiler plugin: "
               "<stage>[-<filename>]-rank<R>.<ms>.pt.trace.json"),
      [](const Args& a) -> std::shared_ptr<Profiler> {
        return std::make_shared<TorchProfiler>(TorchProfilerOptions()
                                                   .dirpath(a.get<std::string>("dirpath"))
                                                   .filename(a.get<std::string>("filename"))
                                                   .record_ops(a.get<bool>("record_ops"))
                                                   .record_shapes(a.get<bool>("record_shapes"))
                                                   .wait(a.get<int64_t>("wait"))
                                                   .warmup(a.get<int64_t>("warmup"))
                                                   .active(a.get<int64_t>("active"))
                                                   .repeat(a.get<int64_t>("repeat"))
                                                   .row_limit(a.get<int64_t>("row_limit"))
                                                   .tensorboard(a.get<bool>("tensorboard")));
      });
}

}  // namespace volt::detail
