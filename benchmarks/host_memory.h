#pragma once
// Side-by-side benchmarks put every contender under the same malloc. The Trainer makes the C
// library's malloc keep freed memory at its first run (TrainerOptions::reuse_host_memory), for
// the rest of the process: without this, contenders timed before the first fit would run under
// glibc's defaults and those after it would not.

#include <cstdio>
#include <cstdlib>
#include <string>

#include <volt/accelerators/host_allocator.h>

namespace volt_bench {

/// Applies volt's host memory reuse to this process before any contender runs, and gives child
/// processes (the Python loops) the same thresholds through glibc's variables. Prints what it
/// did.
inline void same_host_malloc_for_every_contender() {
  const volt::HostMemoryReuse r = volt::reuse_freed_host_memory();
  if (r.applied) {
    ::setenv("MALLOC_MMAP_THRESHOLD_", std::to_string(volt::kReuseMmapThreshold).c_str(), 1);
    ::setenv("MALLOC_TRIM_THRESHOLD_", std::to_string(volt::kReuseTrimThreshold).c_str(), 1);
  }
  std::printf("%s%s\n", r.detail.c_str(),
              r.applied ? "; child processes get the same thresholds" : "");
}

}  // namespace volt_bench
