#pragma once
/// LocalLauncher: Lightning's subprocess launcher in C++. A plain process that must run N local
/// ranks re-executes its own binary N-1 times with rank variables and stays local rank 0.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/distributed/cluster_environment.h"

namespace volt {

/// How one launched worker ended.
struct WorkerExit {
  int64_t local_rank = 0;
  int64_t global_rank = 0;
  int pid = 0;
  /// True when a signal ended it (`code` is then the signal number), false for an exit code.
  bool signaled = false;
  int code = 0;
  /// Exit code 0.
  bool ok() const { return !signaled && code == 0; }
  /// "rank 1 (local rank 1, pid 4242) was killed by signal 9 (SIGKILL)" or "... exited with
  /// code 3".
  std::string describe() const;
};

/// Starts local ranks 1..local_world_size-1 as copies of this process: /proc/self/exe with this
/// process's original argv (/proc/self/cmdline) and its environment plus MASTER_ADDR,
/// MASTER_PORT, WORLD_SIZE, NODE_RANK, LOCAL_RANK and VOLT_LAUNCHED_CHILD=1. Each worker gets
/// PR_SET_PDEATHSIG=SIGKILL, tied to the launcher's own monitor thread: workers die when this
/// process dies or the launcher is destroyed, never orphaned. The monitor thread reaps each
/// worker as it exits (pidfd + waitpid of that pid only; other children of the process are left
/// alone) and records how it ended.
class LocalLauncher {
 public:
  /// `env` must have launches_workers set (detect_cluster_environment decides). A main_port of 0
  /// is replaced by a free port. Throws ConfigError when env does not launch workers and
  /// NotAvailable when the kernel lacks pidfd_open (Linux < 5.3).
  explicit LocalLauncher(ClusterEnvironment env);
  /// Kills (SIGKILL) every worker still running and reaps it; bounded, never throws.
  ~LocalLauncher();
  LocalLauncher(const LocalLauncher&) = delete;
  LocalLauncher& operator=(const LocalLauncher&) = delete;

  /// This process's environment as local rank 0 (with the chosen port).
  const ClusterEnvironment& environment() const { return env_; }
  /// The workers' pids; index i is local rank i + 1.
  std::vector<int> pids() const;

  /// The first worker that ended abnormally (non-zero code or a signal), waiting up to `timeout`
  /// for one; nullopt when none did.
  std::optional<WorkerExit> wait_for_failure(std::chrono::milliseconds timeout) const;
  /// Waits up to `timeout` for every worker to end; true when all did.
  bool wait_all(std::chrono::milliseconds timeout) const;
  /// The workers that ended so far, in the order they ended.
  std::vector<WorkerExit> exits() const;
  /// Calls `callback` once, on the monitor thread, for the first abnormal exit (at once if it
  /// already happened). Use it to report_lost_rank so that the other ranks' errors name it.
  /// Workers killed by kill_all or the destructor are recorded in exits() but are no failure.
  /// The callback delays the reaping of other workers: keep it short.
  void on_failure(std::function<void(const WorkerExit&)> callback);
  /// Sends SIGKILL to every worker still running and waits (bounded) until they are reaped.
  void kill_all();

 private:
  struct Monitor;
  ClusterEnvironment env_;
  std::shared_ptr<Monitor> monitor_;
};

}  // namespace volt
