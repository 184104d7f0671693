#pragma once
/// Which host memory allocator serves this process's malloc (libtorch's CPU tensors included):
/// the C library's, or jemalloc / tcmalloc preloaded with LD_PRELOAD (scripts/with_allocator.sh)
/// as the reference's "Switch Host Memory Allocator" describes. The Trainer logs it once per
/// process at the start of the first run.

#include <cstddef>
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

/// reuse_freed_host_memory()'s thresholds unless given others: blocks below 256 MiB stay in the
/// heap, and up to 512 MiB of free memory stays at its top.
inline constexpr size_t kReuseMmapThreshold = size_t(256) << 20;
inline constexpr size_t kReuseTrimThreshold = size_t(512) << 20;

/// What reuse_freed_host_memory() did.
struct HostMemoryReuse {
  /// True when this process's malloc now keeps freed memory for reuse.
  bool applied = false;
  /// One line for the run log: what was set, or why nothing was.
  std::string detail;
};

/// glibc's malloc hands large freed blocks back to the kernel: a block above its mmap threshold
/// (128 KiB at first, rising with the blocks freed, to 32 MiB at most) is unmapped when freed,
/// and free memory at the top of the heap beyond its trim threshold is trimmed. A training step
/// frees its gradients, activations and temporaries and allocates them again in the next step,
/// whose every page then faults in again, zeroed and charged by the kernel, step after step
/// (what that costs: docs/PERFORMANCE.md, "Host memory reuse"). This keeps blocks below
/// `mmap_threshold` bytes in the heap and up to `trim_threshold` bytes of free memory at its top
/// (mallopt M_MMAP_THRESHOLD, M_TRIM_THRESHOLD), as jemalloc and tcmalloc keep freed memory in
/// their own caches. Both thresholds must be at most INT_MAX (ValueError otherwise).
///
/// It changes the whole process, for good: glibc cannot return to its adaptive thresholds. It
/// does nothing (applied = false, detail says why) unless glibc's malloc serves the process
/// (host_allocator().name == "default") and the environment leaves its thresholds alone
/// (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_, a
/// glibc.malloc tunable in GLIBC_TUNABLES): whoever set those chose for themselves. Only the
/// first call acts; later ones return its result. Call it early, before the program's threads
/// allocate (glibc sets the thresholds without synchronising with them); the Trainer calls it
/// at the start of its first run, before its strategy starts processes or threads, unless
/// TrainerOptions::reuse_host_memory is false.
HostMemoryReuse reuse_freed_host_memory(size_t mmap_threshold = kReuseMmapThreshold,
                                        size_t trim_threshold = kReuseTrimThreshold);

}  // namespace volt
