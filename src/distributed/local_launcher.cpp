#include "volt/distributed/local_launcher.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <iterator>
#include <mutex>
#include <set>
#include <thread>

#include "core/detail/numbers.h"
#include "detail/net.h"
#include "volt/core/check.h"
#include "volt/core/log.h"

extern char** environ;

namespace volt {
namespace {

constexpr const char* kTag = "[LocalLauncher]";
// How long kill_all waits for SIGKILLed workers to be reaped (they die at once unless stuck in
// the kernel, e.g. uninterruptible I/O).
constexpr std::chrono::seconds kReapBound{10};

std::vector<std::string> read_cmdline() {
  auto f = detail::c_stream<std::ifstream>("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> argv;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    argv.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  VOLT_CHECK(!argv.empty(), NotAvailable, kTag,
             " cannot read /proc/self/cmdline to re-execute "
             "this program; is /proc mounted?");
  return argv;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

}  // namespace

std::string WorkerExit::describe() const {
  std::string who = "rank " + std::to_string(global_rank) + " (local rank " +
                    std::to_string(local_rank) + ", pid " + std::to_string(pid) + ")";
  if (signaled) {
    return who + " was killed by signal " + std::to_string(code) + " (" + signal_name(code) + ")";
  }
  if (code < 0) return who + " ended (its exit status was collected elsewhere)";
  return who + " exited with code " + std::to_string(code);
}

struct LocalLauncher::Monitor {
  struct Child {
    int64_t local_rank;
    int64_t global_rank;
    pid_t pid = -1;
    int pidfd = -1;
    bool running = false;
  };

  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::vector<Child> children;
  std::vector<WorkerExit> exits;
  std::optional<WorkerExit> failure;
  std::function<void(const WorkerExit&)> callback;
  bool callback_fired = false;
  // Set by kill_all: the exits that follow are volt's doing, not failures.
  bool killing = false;
  bool started = false;
  std::string start_error;
  int stop_fd = -1;
  std::thread thread;

  // Stops the monitor thread (the workers it watches must have been killed first, or they die
  // with it: PR_SET_PDEATHSIG), reaps what is left and closes every descriptor. Once, by the
  // destructor or by a constructor that could not start every worker.
  void stop_thread() {
    const uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(stop_fd, &one, sizeof(one));
    if (thread.joinable()) thread.join();
    for (auto& c : children) {
      if (c.running && c.pidfd >= 0) {
        pollfd p{c.pidfd, POLLIN, 0};
        ::poll(&p, 1, 1000);
        ::waitpid(c.pid, nullptr, WNOHANG);
      }
      if (c.pidfd >= 0) ::close(c.pidfd);
      c.pidfd = -1;
    }
    ::close(stop_fd);
    stop_fd = -1;
  }

  size_t running() const {
    size_t n = 0;
    for (const auto& c : children) n += c.running ? 1 : 0;
    return n;
  }

  // Runs on the monitor thread: forks the workers (so that their PR_SET_PDEATHSIG follows this
  // thread, i.e. the launcher's lifetime) and reaps them as they end.
  void run(const std::vector<std::vector<std::string>>& envs,
           const std::vector<std::string>& argv) {
    const pid_t parent = ::getpid();
    // Everything the child needs is built before fork: between fork and exec only
    // async-signal-safe calls are allowed.
    std::vector<char*> cargv;
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    {
      std::lock_guard<std::mutex> lock(mu);
      for (size_t i = 0; i < children.size(); ++i) {
        std::vector<char*> cenv;
        for (const auto& e : envs[i]) cenv.push_back(const_cast<char*>(e.c_str()));
        cenv.push_back(nullptr);
        const pid_t pid = ::fork();
        if (pid == 0) {
          sigset_t none;
          sigemptyset(&none);
          ::sigprocmask(SIG_SETMASK, &none, nullptr);
          ::prctl(PR_SET_PDEATHSIG, SIGKILL);
          if (::getppid() != parent) ::_exit(111);  // the parent died before prctl
          ::execve("/proc/self/exe", cargv.data(), cenv.data());
          ::_exit(127);
        }
        if (pid < 0) {
          start_error = std::string("fork failed: ") + std::strerror(errno);
          break;
        }
        children[i].pid = pid;
        children[i].running = true;
        children[i].pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
        if (children[i].pidfd < 0) {
          start_error =
              std::string("pidfd_open failed (Linux >= 5.3 needed): ") + std::strerror(errno);
          // Unwatched, the loop could not reap it: ended here (the launcher then kills the
          // workers started before it).
          ::kill(pid, SIGKILL);
          while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
          }
          children[i].running = false;
          break;
        }
      }
      started = true;
    }
    cv.notify_all();
    loop();
  }

  void loop() {
    while (true) {
      std::vector<pollfd> fds{{stop_fd, POLLIN, 0}};
      std::vector<size_t> who;
      {
        std::lock_guard<std::mutex> lock(mu);
        for (size_t i = 0; i < children.size(); ++i) {
          if (children[i].running && children[i].pidfd >= 0) {
            fds.push_back({children[i].pidfd, POLLIN, 0});
            who.push_back(i);
          }
        }
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[0].revents != 0) return;
      for (size_t k = 1; k < fds.size(); ++k) {
        if (fds[k].revents != 0) reap(who[k - 1]);
      }
    }
  }

  void reap(size_t i) {
    std::function<void(const WorkerExit&)> fire;
    WorkerExit exit;
    {
      std::lock_guard<std::mutex> lock(mu);
      Child& c = children[i];
      int status = 0;
      pid_t r;
      do {
        r = ::waitpid(c.pid, &status, 0);
      } while (r < 0 && errno == EINTR);
      exit.local_rank = c.local_rank;
      exit.global_rank = c.global_rank;
      exit.pid = c.pid;
      if (r == c.pid && WIFSIGNALED(status)) {
        exit.signaled = true;
        exit.code = WTERMSIG(status);
      } else if (r == c.pid) {
        exit.code = WEXITSTATUS(status);
      } else {
        exit.code = -1;  // SIGCHLD ignored, or someone else reaped it
      }
      ::close(c.pidfd);
      c.pidfd = -1;
      c.running = false;
      exits.push_back(exit);
      if (killing) {
        // Not reported: the launcher killed it.
      } else if (!exit.ok() && !failure) {
        failure = exit;
      }
      if (!killing && !exit.ok() && callback && !callback_fired) {
        callback_fired = true;
        fire = callback;
      }
    }
    cv.notify_all();
    if (fire) {
      try {
        fire(exit);
      } catch (...) {
      }
    }
  }
};

LocalLauncher::LocalLauncher(ClusterEnvironment env) : env_(std::move(env)) {
  VOLT_CHECK(env_.launches_workers && env_.local_world_size > 1, ConfigError, kTag,
             " this process does not launch workers (", env_,
             "); detect_cluster_environment decides: it launches only for a plain process "
             "without LOCAL_RANK and devices > 1.");
  if (env_.main_port == 0) env_.main_port = detail::find_free_port();
  // An ignored SIGCHLD (SIG_IGN or SA_NOCLDWAIT) has the kernel reap the workers itself: their
  // exit statuses are gone, and a worker that finished would count as one that failed.
  struct sigaction chld {};
  if (::sigaction(SIGCHLD, nullptr, &chld) == 0 &&
      (chld.sa_handler == SIG_IGN || (chld.sa_flags & SA_NOCLDWAIT) != 0)) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGCHLD, &dfl, nullptr);
    log_warning("LocalLauncher",
                "SIGCHLD was ignored in this process, which discards the workers' exit statuses; "
                "it is back to its default action so that a worker's end can be told from its "
                "failure.");
  }
  const std::vector<std::string> argv = read_cmdline();

  // Each worker: this process's environment minus the variables volt sets, plus them.
  const std::set<std::string> ours{"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE",
                                   "NODE_RANK",   "LOCAL_RANK",  kLaunchedChildVar};
  std::vector<std::string> base;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv(*e);
    if (ours.count(kv.substr(0, kv.find('='))) == 0) base.push_back(kv);
  }
  monitor_ = std::make_shared<Monitor>();
  std::vector<std::vector<std::string>> envs;
  for (int64_t local = 1; local < env_.local_world_size; ++local) {
    Monitor::Child c;
    c.local_rank = local;
    c.global_rank = env_.node_rank * env_.local_world_size + local;
    monitor_->children.push_back(c);
    auto vars = base;
    vars.push_back("MASTER_ADDR=" + env_.main_address);
    vars.push_back("MASTER_PORT=" + std::to_string(env_.main_port));
    vars.push_back("WORLD_SIZE=" + std::to_string(env_.world_size));
    vars.push_back("NODE_RANK=" + std::to_string(env_.node_rank));
    vars.push_back("LOCAL_RANK=" + std::to_string(local));
    vars.push_back(std::string(kLaunchedChildVar) + "=1");
    envs.push_back(std::move(vars));
  }
  monitor_->stop_fd = ::eventfd(0, EFD_CLOEXEC);
  VOLT_CHECK(monitor_->stop_fd >= 0, NotAvailable, kTag, " eventfd failed: ", std::strerror(errno));
  auto m = monitor_;
  m->thread = std::thread([m, envs, argv] { m->run(envs, argv); });
  std::unique_lock<std::mutex> lock(m->mu);
  m->cv.wait(lock, [&] { return m->started; });
  if (!m->start_error.empty()) {
    // No destructor runs for a constructor that throws: the workers started so far, the
    // thread and the descriptors end here.
    const std::string why = m->start_error;
    lock.unlock();
    kill_all();
    m->stop_thread();
    VOLT_CHECK(false, NotAvailable, kTag, " cannot start the local workers: ", why, ".");
  }
}

LocalLauncher::~LocalLauncher() {
  if (!monitor_) return;
  try {
    kill_all();
    // The thread's end SIGKILLs any worker kill_all could not reap (PR_SET_PDEATHSIG); what is
    // collectable is collected so that no zombie stays.
    monitor_->stop_thread();
  } catch (...) {
  }
}

std::vector<int> LocalLauncher::pids() const {
  std::lock_guard<std::mutex> lock(monitor_->mu);
  std::vector<int> out;
  for (const auto& c : monitor_->children) out.push_back(c.pid);
  return out;
}

std::optional<WorkerExit> LocalLauncher::wait_for_failure(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(monitor_->mu);
  monitor_->cv.wait_for(lock, timeout,
                        [&] { return monitor_->failure.has_value() || monitor_->running() == 0; });
  return monitor_->failure;
}

bool LocalLauncher::wait_all(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(monitor_->mu);
  return monitor_->cv.wait_for(lock, timeout, [&] { return monitor_->running() == 0; });
}

std::vector<WorkerExit> LocalLauncher::exits() const {
  std::lock_guard<std::mutex> lock(monitor_->mu);
  return monitor_->exits;
}

void LocalLauncher::on_failure(std::function<void(const WorkerExit&)> callback) {
  std::optional<WorkerExit> already;
  {
    std::lock_guard<std::mutex> lock(monitor_->mu);
    monitor_->callback = callback;
    if (monitor_->failure && !monitor_->callback_fired) {
      monitor_->callback_fired = true;
      already = monitor_->failure;
    }
  }
  if (already && callback) callback(*already);
}

void LocalLauncher::kill_all() {
  std::unique_lock<std::mutex> lock(monitor_->mu);
  monitor_->killing = true;
  for (const auto& c : monitor_->children) {
    if (c.running) ::kill(c.pid, SIGKILL);
  }
  monitor_->cv.wait_for(lock, kReapBound, [&] { return monitor_->running() == 0; });
}

}  // namespace volt
