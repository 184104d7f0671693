#pragma once
// Whether an exception is an allocation that failed: one definition for the CLI's exit message
// and for scale_batch_size, which searches for the largest batch that does not raise one.

#include <exception>

namespace volt {
namespace detail {

/// True for c10::OutOfMemoryError (CUDA, volt's CPU memory limit, CPU in libtorch 2.x),
/// std::bad_alloc, and libtorch 1.13's plain c10::Error from DefaultCPUAllocator ("can't
/// allocate memory") or a CUDA "out of memory".
bool is_out_of_memory(const std::exception& e);

}  // namespace detail
}  // namespace volt
