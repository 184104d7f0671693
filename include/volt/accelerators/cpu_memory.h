#pragma once
/// Exact CPU tensor-memory counters: volt's counting allocator, installed as libtorch's CPU
/// allocator, wraps the one that was there and counts every allocation and free through it.
/// docs/OBSERVABILITY.md defines each metric.

#include <cstdint>
#include <map>
#include <string>

namespace volt {

/// One reading of the counters. Bytes are the sizes libtorch requested (a tensor's storage
/// nbytes), not what the system allocator rounded them up to. Each field is read atomically,
/// but a reading taken while other threads allocate is not one consistent instant.
struct CpuMemoryStats {
  int64_t limit = 0;           ///< physical memory available to the process (cgroup limit if lower)
  int64_t in_use = 0;          ///< bytes held by live CPU tensors allocated since install
  int64_t max_in_use = 0;      ///< peak of in_use since install or the last reset_peak
  int64_t num_allocs = 0;      ///< allocations since install
  int64_t num_frees = 0;       ///< frees of those allocations since install
  int64_t active_allocs = 0;   ///< num_allocs - num_frees: allocations alive now
  int64_t max_alloc_size = 0;  ///< largest single allocation since install or reset_peak
  int64_t total_system_allocs = 0;  ///< requests passed to the wrapped allocator (= num_allocs)
  int64_t total_system_frees = 0;   ///< frees passed to the wrapped allocator (= num_frees)
  int64_t total_active_allocs = 0;  ///< system allocations alive now (= active_allocs)

  /// The reference's names: Limit, InUse, MaxInUse, NumAllocs, NumFrees, ActiveAllocs,
  /// MaxAllocSize, TotalSystemAllocs, TotalSystemFrees, TotalActiveAllocs.
  std::map<std::string, double> to_metrics() const;
};

/// Installs the counting allocator as libtorch's CPU allocator (once per process; later calls do
/// nothing). Tensors allocated before stay with their own allocator and are not counted. Throws
/// NotAvailable when another allocator with a higher priority is installed.
void install_counting_cpu_allocator();
/// Whether install_counting_cpu_allocator() has run.
bool counting_cpu_allocator_installed();
/// The counters now (all zero but `limit` before install).
CpuMemoryStats cpu_memory_stats();
/// Restarts the peaks: max_in_use = in_use now, max_alloc_size = 0.
void reset_cpu_memory_peaks();
/// Caps the counted CPU tensor memory, as a GPU's size caps device memory: an allocation that
/// would take `in_use` above `bytes` throws c10::OutOfMemoryError ("can't allocate memory")
/// without allocating. 0 = no cap (the default). Installs the counting allocator when needed;
/// tensors allocated before it was installed are not counted. Throws ConfigError for bytes < 0.
void set_cpu_memory_limit(int64_t bytes);
/// The cap set_cpu_memory_limit() set; 0 = none.
int64_t cpu_memory_limit();

}  // namespace volt
