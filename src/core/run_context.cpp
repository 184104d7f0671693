#include "volt/core/run_context.h"

#include <ostream>

#include "detail/print.h"

namespace volt {
namespace {

const char* reduce_name(Reduce r) {
  switch (r) {
    case Reduce::kMean: return "mean";
    case Reduce::kSum: return "sum";
    case Reduce::kMax: return "max";
    case Reduce::kMin: return "min";
  }
  return "?";
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const LogOptions& o) {
  return os << "LogOptions(prog_bar=" << o.prog_bar()
            << ", on_step=" << detail::optional_text(o.on_step())
            << ", on_epoch=" << detail::optional_text(o.on_epoch())
            << ", reduce=" << reduce_name(o.reduce())
            << ", batch_size=" << detail::optional_text(o.batch_size()) << ", logger=" << o.logger()
            << ", sync_dist=" << o.sync_dist() << ", add_dataloader_idx=" << o.add_dataloader_idx()
            << ")";
}

}  // namespace volt
