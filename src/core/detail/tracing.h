#pragma once
// Private: whether libtorch's tracer is recording on this thread (a TracedFunction tracing its
// function). volt's fused kernels then run their reference compositions: a trace records
// libtorch ops, and a kernel's own loops write memory the trace cannot see, so a replay would
// read tensors nothing filled. The trace fuses the reference's elementwise ops again.

namespace volt {
namespace detail {

/// True while libtorch's tracer records on this thread.
bool tracing();

/// The reason the kernels give for their reference path while tracing.
constexpr const char* kTracingReason =
    "libtorch's tracer is recording (a trace holds libtorch ops, not a fused kernel's loops)";

}  // namespace detail
}  // namespace volt
