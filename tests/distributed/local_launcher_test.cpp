#include "volt/distributed/local_launcher.h"
#include "requires.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <chrono>
#include <sstream>

#include "build_paths.h"
#include "processes.h"
#include "volt/core/errors.h"

namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using volt_test::Process;

const std::string kWorker = volt_test::dist_worker();
constexpr milliseconds kWait{60000};

// The worker pids the launcher printed ("launcher: pid P started workers a,b,c").
std::vector<int> worker_pids(const std::string& out) {
  std::vector<int> pids;
  auto at = out.find("started workers ");
  if (at == std::string::npos) return pids;
  std::istringstream is(out.substr(at + 16, out.find('\n', at) - at - 16));
  std::string tok;
  while (std::getline(is, tok, ',')) pids.push_back(std::stoi(tok));
  return pids;
}

int count(const std::string& s, const std::string& needle) {
  int n = 0;
  for (auto at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}

TEST(WorkerExit, Describes) {
  volt::WorkerExit e{2, 6, 4242, true, SIGKILL};
  EXPECT_EQ(e.describe(), "rank 6 (local rank 2, pid 4242) was killed by signal 9 (SIGKILL)");
  EXPECT_FALSE(e.ok());
  volt::WorkerExit c{1, 1, 7, false, 3};
  EXPECT_EQ(c.describe(), "rank 1 (local rank 1, pid 7) exited with code 3");
  EXPECT_TRUE((volt::WorkerExit{1, 1, 7, false, 0}.ok()));
}

TEST(LocalLauncher, RefusesAnEnvironmentThatDoesNotLaunch) {
  volt::ClusterEnvironment env;  // one process
  try {
    volt::LocalLauncher l(env);
    FAIL() << "no error";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("[LocalLauncher] this process does not launch workers"),
              std::string::npos);
  }
}

// A plain process with devices=N starts N-1 copies of itself; all N ranks run collectives and
// every worker exits 0.
void launch_and_finish(int devices) {
  Process parent(kWorker, {"collectives", "--devices", std::to_string(devices)});
  EXPECT_EQ(parent.exit_code(kWait), 0) << parent.output();
  const std::string& out = parent.output();
  EXPECT_EQ(count(out, "collectives ok"), devices) << out;
  EXPECT_EQ(count(out, " launched"), devices - 1) << "workers see VOLT_LAUNCHED_CHILD\n" << out;
  EXPECT_NE(out.find("launcher: all " + std::to_string(devices - 1) + " workers exited 0"),
            std::string::npos)
      << out;
  for (int pid : worker_pids(out)) EXPECT_FALSE(volt_test::process_alive(pid));
}

TEST(LocalLauncher, TwoRanksStartAndFinish) {
  VOLT_REQUIRE_GLOO();
  launch_and_finish(2);
}

TEST(LocalLauncher, FourRanksStartAndFinish) {
  VOLT_REQUIRE_GLOO();
  launch_and_finish(4);
}

// A worker SIGKILLed mid-run: the launcher reports it by rank, and every surviving rank's failed
// collective names it (the launcher wrote it to the rendezvous store).
TEST(LocalLauncher, KilledWorkerIsNamedByEverySurvivor) {
  VOLT_REQUIRE_GLOO();
  Process parent(kWorker, {"hold", "--devices", "4", "--victim", "2", "--timeout-ms", "20000"});
  ASSERT_TRUE(parent.wait_for_output("rank 2: victim waiting", kWait)) << parent.output();
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(parent.wait_for_output("rank " + std::to_string(r) + ": entering", kWait))
        << parent.output();
  }
  auto pids = worker_pids(parent.output());
  ASSERT_EQ(pids.size(), 3u) << parent.output();
  const int victim = pids[1];  // local rank 2
  ::kill(victim, SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(parent.exit_code(kWait), 3) << parent.output();
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20)) << "within the timeout";
  const std::string& out = parent.output();
  const std::string lost =
      "rank 2 (local rank 2, pid " + std::to_string(victim) + ") was killed by signal 9 (SIGKILL)";
  EXPECT_NE(out.find("launcher: lost " + lost), std::string::npos) << out;
  for (int r : {0, 1, 3}) {
    const std::string line = "rank " + std::to_string(r) + ": error: [ProcessGroup] all_reduce";
    auto at = out.find(line);
    ASSERT_NE(at, std::string::npos) << out;
    EXPECT_NE(out.substr(at, out.find('\n', at) - at).find("lost: " + lost), std::string::npos)
        << "rank " << r << " names the lost rank\n"
        << out;
  }
  for (int pid : pids) EXPECT_FALSE(volt_test::process_alive(pid)) << pid;
}

// The launcher's destructor kills and reaps its workers: none is left, not even as a zombie.
TEST(LocalLauncher, DestructionKillsAndReapsWorkers) {
  const auto start = std::chrono::steady_clock::now();
  Process parent(kWorker, {"reap", "--devices", "3"});
  EXPECT_EQ(parent.exit_code(kWait), 0) << parent.output();
  // Quick: no failure callback (it would try to reach a store that does not exist) fires for
  // workers the launcher killed itself.
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(10));
  EXPECT_EQ(parent.output().find("launcher: lost"), std::string::npos) << parent.output();
  EXPECT_NE(parent.output().find("launcher: reaped all workers"), std::string::npos)
      << parent.output();
}

// A constructor that fails half way (a worker started, its pidfd refused) throws NotAvailable
// at once and leaves no worker, thread or descriptor (start_fails in dist_worker.cpp).
TEST(LocalLauncher, AFailedStartLeavesNothingBehind) {
  Process parent(kWorker, {"start-fails", "--devices", "3"});
  EXPECT_EQ(parent.exit_code(kWait), 0) << parent.output();
  EXPECT_NE(parent.output().find("launcher: a failed start left nothing behind"), std::string::npos)
      << parent.output();
}

// The parent SIGKILLed: its workers die with it (PR_SET_PDEATHSIG). This test process becomes a
// child subreaper, so the orphans are reparented here and reaped by waitpid, proving they died.
TEST(LocalLauncher, KilledParentLeavesNoWorkers) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  std::vector<int> pids;
  {
    Process parent(kWorker, {"orphan", "--devices", "3"});
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(parent.wait_for_output("rank " + std::to_string(r) + ": waiting", kWait))
          << parent.output();
    }
    pids = worker_pids(parent.output());
    ASSERT_EQ(pids.size(), 2u) << parent.output();
    ::kill(parent.pid(), SIGKILL);
    EXPECT_EQ(parent.exit_code(kWait), -SIGKILL);
  }
  for (int pid : pids) {
    // Reparented to this process: a blocking waitpid returns once the worker died.
    Process::Clock::time_point start = Process::Clock::now();
    int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      EXPECT_EQ(::poll(&p, 1, 10000), 1) << "worker " << pid << " still running";
      ::close(pidfd);
    }
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, WNOHANG), pid) << "worker " << pid << " not reaped here";
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    EXPECT_LT(Process::Clock::now() - start, seconds(10));
    EXPECT_FALSE(volt_test::process_alive(pid));
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

}  // namespace
