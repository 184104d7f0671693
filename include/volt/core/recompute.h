#pragma once
/// Whether this thread is recomputing a forward for activation checkpointing. It lives in core
/// because both sides need it: nn/ (volt::checkpoint) sets it, and layers below nn/ that update
/// state in their forward (precision/: fp8's amax histories and step counts) read it.

namespace volt {

/// True on this thread while volt::checkpoint re-runs a checkpointed function in backward.
/// Layers that update state in their forward skip the update then, so the recomputation counts
/// as the same forward, not a second one, and a checkpointed model trains exactly as an
/// unchecked one.
bool in_checkpoint_recompute();

/// Marks this thread as recomputing while alive (nestable).
class CheckpointRecomputeScope {
 public:
  CheckpointRecomputeScope();
  ~CheckpointRecomputeScope();
  CheckpointRecomputeScope(const CheckpointRecomputeScope&) = delete;
  CheckpointRecomputeScope& operator=(const CheckpointRecomputeScope&) = delete;
};

}  // namespace volt
