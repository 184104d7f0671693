// The cgroup memory limit behind CpuMemoryStats' "Limit": the process's own cgroup and its
// ancestors, read from real files laid out as /sys/fs/cgroup lays them out.
#include "accelerators/detail/cgroup_memory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tiny.h"

namespace {

namespace fs = std::filesystem;
using volt::detail::cgroup_memory_limit;

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text << "\n";
}

// cgroup v2: the limit of a job's cgroup below an unlimited root (a systemd slice, a container
// runtime without a cgroup namespace) is found by following /proc/self/cgroup's path; the
// tightest level wins, wherever it is; "max" everywhere is no limit.
TEST(CgroupMemory, CgroupTwoFollowsTheProcesssPathAndTakesTheTightestLevel) {
  volt_test::TempDir root;
  write(root / "memory.max", "max");
  write(root / "jobs/memory.max", "max");
  write(root / "jobs/job7/memory.max", "2147483648");
  const std::string self = "0::/jobs/job7\n";
  EXPECT_EQ(cgroup_memory_limit(root.path, self), 2147483648);  // the root alone said none
  write(root / "jobs/memory.max", "1073741824");                // a tighter parent
  EXPECT_EQ(cgroup_memory_limit(root.path, self), 1073741824);
  write(root / "jobs/memory.max", "max");
  write(root / "jobs/job7/memory.max", "max");
  EXPECT_EQ(cgroup_memory_limit(root.path, self), -1);
  // A container whose cgroup namespace shows its cgroup as "/": the root's own file.
  write(root / "memory.max", "536870912");
  EXPECT_EQ(cgroup_memory_limit(root.path, "0::/\n"), 536870912);
}

// cgroup v1: the memory controller's line, whichever controllers share its hierarchy; v1's
// "unlimited" (2^63 - 1 rounded to a page) is no limit.
TEST(CgroupMemory, CgroupOneReadsTheMemoryControllersHierarchy) {
  volt_test::TempDir root;
  write(root / "memory/memory.limit_in_bytes", "9223372036854771712");
  write(root / "memory/process_api/abc/memory.limit_in_bytes", "9223372036854771712");
  const std::string self = "4:memory:/process_api/abc\n3:cpu,cpuacct:/\n0::/\n";
  EXPECT_EQ(cgroup_memory_limit(root.path, self), -1);
  write(root / "memory/process_api/abc/memory.limit_in_bytes", "3221225472");
  EXPECT_EQ(cgroup_memory_limit(root.path, self), 3221225472);
  // Shared with other controllers on one line, and a v2 unified hierarchy without a limit.
  EXPECT_EQ(cgroup_memory_limit(root.path, "7:cpuset,memory:/process_api/abc\n0::/\n"), 3221225472);
  // Only the root's files without a /proc/self/cgroup (a sandbox hiding /proc): as before.
  EXPECT_EQ(cgroup_memory_limit(root.path, ""), -1);
  write(root / "memory/memory.limit_in_bytes", "4294967296");
  EXPECT_EQ(cgroup_memory_limit(root.path, ""), 4294967296);
  // Garbage in a file is no limit, not an error.
  write(root / "memory/memory.limit_in_bytes", "lots");
  EXPECT_EQ(cgroup_memory_limit(root.path, "garbage line\n4:memory:/process_api/abc\n"),
            3221225472);
}

}  // namespace
