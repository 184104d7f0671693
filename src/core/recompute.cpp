#include "volt/core/recompute.h"

namespace volt {
namespace {
thread_local int t_recompute_depth = 0;
}  // namespace

bool in_checkpoint_recompute() {
  return t_recompute_depth > 0;
}
CheckpointRecomputeScope::CheckpointRecomputeScope() {
  ++t_recompute_depth;
}
CheckpointRecomputeScope::~CheckpointRecomputeScope() {
  --t_recompute_depth;
}

}  // namespace volt
