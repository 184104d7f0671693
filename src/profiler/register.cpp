// Registers this folder's built-in names; called once from registry() (src/trainer/builtins.cpp).
#include "volt/core/registry.h"
#include "volt/profiler/simple.h"

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
}

}  // namespace volt::detail
