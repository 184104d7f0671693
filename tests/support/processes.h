#pragma once
// Real child processes for the distributed tests: start a program with a chosen environment,
// read its output (stdout + stderr) with deadlines, wait for it with a deadline, and never leave
// it running (the destructor SIGKILLs and reaps it).

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/detail/net.h"

extern char** environ;

namespace volt_test {

/// Variables that would make a child believe it runs in some cluster: never inherited.
inline bool is_cluster_var(const std::string& name) {
  static const std::set<std::string> exact{
      "MASTER_ADDR", "MASTER_PORT",      "WORLD_SIZE", "NODE_RANK",           "LOCAL_RANK",
      "RANK",        "LOCAL_WORLD_SIZE", "GROUP_RANK", "VOLT_LAUNCHED_CHILD", "GLOO_SOCKET_IFNAME"};
  return exact.count(name) || name.rfind("SLURM_", 0) == 0 || name.rfind("OMPI_", 0) == 0;
}

/// The variables by which an environment tunes glibc's malloc (detail::malloc_configured_by):
/// a child starts without them unless the test passes them, so what volt does and logs about
/// host memory reuse does not depend on the runner's environment.
inline bool is_malloc_tuning_var(const std::string& name) {
  static const std::set<std::string> names{"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                           "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES"};
  return names.count(name) > 0;
}

/// A running program whose output goes into a pipe this object reads. It inherits this
/// process's environment less the cluster and malloc-tuning variables, plus `env`.
class Process {
 public:
  using Clock = std::chrono::steady_clock;

  Process(const std::string& exe, const std::vector<std::string>& args,
          const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> vars;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string kv(*e);
      std::string name = kv.substr(0, kv.find('='));
      if (!is_cluster_var(name) && !is_malloc_tuning_var(name) && env.count(name) == 0) {
        vars.push_back(kv);
      }
    }
    for (const auto& [k, v] : env) vars.push_back(k + "=" + v);
    std::vector<char*> cenv;
    for (auto& v : vars) cenv.push_back(v.data());
    cenv.push_back(nullptr);
    std::vector<std::string> argv{exe};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);

    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    // SIGINT and SIGTERM start at their default action, as in a program run from a terminal:
    // a test runner started in the background (`cmd &` in a script) ignores SIGINT, and its
    // children would inherit that (volt never takes over an ignored signal).
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGTERM);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    int rc = ::posix_spawn(&pid_, exe.c_str(), &fa, &attr, cargv.data(), cenv.data());
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    if (rc != 0) {
      ::close(fds[0]);
      throw std::runtime_error("posix_spawn " + exe + ": " + std::strerror(rc));
    }
    out_ = fds[0];
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  }

  ~Process() {
    if (!status_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
    if (pidfd_ >= 0) ::close(pidfd_);
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  int pid() const { return pid_; }
  const std::string& output() const { return text_; }

  /// Reads output until it contains `needle` (true) or `timeout` passes or the output ends.
  bool wait_for_output(const std::string& needle, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (text_.find(needle) == std::string::npos) {
      if (!read_some(deadline)) return text_.find(needle) != std::string::npos;
    }
    return true;
  }

  /// Waits until the process ends, reading its output meanwhile (not waiting for the end of the
  /// output: its own children may hold the pipe open); its wait status, or nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (!status_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p[2] = {{out_, POLLIN, 0}, {pidfd_, POLLIN, 0}};
      if (::poll(p, 2, static_cast<int>(left.count())) < 0) return std::nullopt;
      if (p[0].revents != 0) read_chunk();
      if (p[1].revents != 0) {
        int st = 0;
        if (::waitpid(pid_, &st, 0) == pid_) status_ = st;
      }
    }
    // What it wrote before it ended is in the pipe already.
    while (out_ >= 0) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0 || !read_chunk()) break;
    }
    return status_;
  }

  /// Waits and returns the exit code (-signal when killed, -1000 on timeout).
  int exit_code(std::chrono::milliseconds timeout) {
    auto st = wait(timeout);
    if (!st) return -1000;
    return WIFEXITED(*st) ? WEXITSTATUS(*st) : -WTERMSIG(*st);
  }

 private:
  // Reads what is available before `deadline`; false when the deadline passed or output ended.
  bool read_some(Clock::time_point deadline) {
    if (out_ < 0) return false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{out_, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r <= 0) return false;
    return read_chunk();
  }

  // One read(); false (and the pipe closed) at the end of the output.
  bool read_chunk() {
    char buf[4096];
    ssize_t n = ::read(out_, buf, sizeof buf);
    if (n <= 0) {
      ::close(out_);
      out_ = -1;
      return false;
    }
    text_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  int pidfd_ = -1;
  std::optional<int> status_;
  std::string text_;
};

/// True while `pid` exists and is not a zombie.
inline bool process_alive(int pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return false;
  char buf[512] = {0};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  std::string s(buf, n);
  auto close = s.rfind(')');
  return close != std::string::npos && close + 2 < s.size() && s[close + 2] != 'Z' &&
         s[close + 2] != 'X';
}

}  // namespace volt_test

namespace volt_test {

/// Starts `world` processes of `exe args`, rank r with the variables `env_of(r)`.
inline std::vector<std::unique_ptr<Process>> start_ranks(
    const std::string& exe, const std::vector<std::string>& args, int world,
    const std::function<std::map<std::string, std::string>(int)>& env_of) {
  std::vector<std::unique_ptr<Process>> out;
  for (int r = 0; r < world; ++r) out.push_back(std::make_unique<Process>(exe, args, env_of(r)));
  return out;
}

/// Plain variables for rank r of a one-node job whose processes a test starts itself.
inline std::map<std::string, std::string> plain_rank_env(int rank, int world, int port) {
  return {{"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)},
          {"WORLD_SIZE", std::to_string(world)},
          {"NODE_RANK", "0"},
          {"LOCAL_RANK", std::to_string(rank)}};
}

/// Starts `world` ranks of `exe args` as one local job on a free loopback port (plain_rank_env).
inline std::vector<std::unique_ptr<Process>> start_local_ranks(const std::string& exe,
                                                               const std::vector<std::string>& args,
                                                               int world) {
  const int port = volt::detail::find_free_port();
  return start_ranks(exe, args, world, [&](int r) { return plain_rank_env(r, world, port); });
}

}  // namespace volt_test
