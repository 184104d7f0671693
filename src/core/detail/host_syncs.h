#pragma once
// Private: which libtorch ops make the host wait for an accelerator, shared by HostSyncMonitor
// (live, inside training steps), `volt perf` (after the fact, from a trace) and TracedFunction
// (which refuses the host reads while it traces). No torch.

#include <string_view>

namespace volt {
namespace detail {

/// Ops that read a value or a data-dependent shape on the host, so on an accelerator the host
/// stops until the device has computed it: item() / float() / bool() of a tensor
/// (_local_scalar_dense), is_nonzero (a tensor as a condition), equal, nonzero (boolean-mask
/// indexing calls it), masked_select and unique, plus the CUDA runtime's explicit
/// synchronisations that kineto traces show. An op nested inside one of these is part of the
/// same sync and is not counted again.
inline bool is_host_sync_op(std::string_view name) {
  return name == "aten::_local_scalar_dense" || name == "aten::is_nonzero" ||
         name == "aten::equal" || name == "aten::nonzero" || name == "aten::masked_select" ||
         name == "aten::_unique2" || name == "aten::unique_dim" ||
         name == "aten::unique_consecutive" || name == "cudaStreamSynchronize" ||
         name == "cudaDeviceSynchronize";
}

/// The RecordFunction user scope around the Trainer's own loss read (detect_nonfinite_loss),
/// so that its host read is reported apart from the user's.
constexpr const char* kNonfiniteLossScope = "volt::detect_nonfinite_loss";

/// What the user wrote that runs `name` (for messages), e.g. "item(), float() or bool() of a
/// tensor"; "" when the op's name says it.
inline const char* host_sync_source(std::string_view name) {
  if (name == "aten::_local_scalar_dense") return "item(), float() or bool() of a tensor";
  if (name == "aten::is_nonzero") return "a tensor used as a condition";
  if (name == "aten::nonzero") return "nonzero() or boolean-mask indexing";
  if (name == "aten::equal") return "equal() of two tensors";
  return "";
}

}  // namespace detail
}  // namespace volt
