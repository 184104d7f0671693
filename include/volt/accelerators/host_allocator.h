#pragma once
/// Which host memory allocator serves this process's malloc (libtorch's CPU tensors included):
/// the C library's, or jemalloc / tcmalloc preloaded with LD_PRELOAD (scripts/with_allocator.sh)
/// as the reference's "Switch Host Memory Allocator" describes. The Trainer logs it once per
/// process at the start of the first run.

#include <string>

namespace volt {

struct HostAllocator {
  /// "jemalloc", "tcmalloc", "default" (the C library's malloc), or "other" (malloc defined
  /// elsewhere, e.g. by a sanitizer runtime linked into the program).
  std::string name;
  /// The file that defines the malloc this process calls, e.g.
  /// /lib/x86_64-linux-gnu/libjemalloc.so.2; "" when the dynamic linker cannot tell.
  std::string library;
};

/// The allocator behind `malloc` as the dynamic linker bound it (the object defining the symbol
/// the process resolves), so a library counts only when it really serves the calls.
HostAllocator host_allocator();

/// One line for the run log, e.g. "host allocator: jemalloc (/lib/.../libjemalloc.so.2)".
std::string describe(const HostAllocator& allocator);

}  // namespace volt
