#pragma once
// The memory limit of the cgroup a process runs in (cpu_memory.cpp's "Limit"; tested on files
// a test writes, apart from this machine's own cgroups).

#include <cstdint>
#include <string>

namespace volt {
namespace detail {

/// The smallest memory limit on the path of the process's memory cgroup and its ancestors, read
/// under `root` (/sys/fs/cgroup): cgroup v2's memory.max from the "0::<path>" line of
/// `proc_self_cgroup` (the text of /proc/self/cgroup), v1's memory.limit_in_bytes under
/// root/memory from the line naming the memory controller. A limit is only as tight as the
/// tightest ancestor, so each level up to the root counts; the root's own files count too (a
/// container whose cgroup namespace shows its cgroup as "/"). -1 when no level sets one
/// ("max", v1's page-rounded 2^63 - 1, missing files).
int64_t cgroup_memory_limit(const std::string& root, const std::string& proc_self_cgroup);

}  // namespace detail
}  // namespace volt
