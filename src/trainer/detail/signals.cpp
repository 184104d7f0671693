#include "trainer/detail/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace volt {
namespace detail {
namespace {

constexpr int kSignals[2] = {SIGINT, SIGTERM};

std::atomic<int> g_received{0};
std::atomic<bool> g_announce{false};
std::atomic<int> g_watches{0};  // watches that installed a handler and are alive
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

constexpr char kFirstInt[] =
    "\n[Trainer] SIGINT received: stopping at the end of this batch (every rank at the same "
    "one); press Ctrl-C again to stop at once.\n";
constexpr char kFirstTerm[] =
    "\n[Trainer] SIGTERM received: stopping at the end of this batch (every rank at the same "
    "one); a second SIGTERM stops at once.\n";

extern "C" void volt_on_stop_signal(int sig) {
  int expected = 0;
  if (g_received.compare_exchange_strong(expected, sig)) {
    if (g_announce.load()) {
      const char* text = sig == SIGINT ? kFirstInt : kFirstTerm;
      const size_t n = sig == SIGINT ? sizeof(kFirstInt) - 1 : sizeof(kFirstTerm) - 1;
      [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, text, n);
    }
    return;
  }
  // The second one: what the signal would have done without volt (sigaction and raise are
  // async-signal-safe).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
}

}  // namespace

SignalWatch::SignalWatch(bool enabled) {
  if (!enabled) return;
  // Inside another watch (a Trainer run from a callback of another): its handlers stay, and
  // what they receive stops this run too.
  const bool enclosed = g_watches.load() > 0;
  for (int i = 0; i < 2; ++i) {
    struct sigaction current {};
    if (::sigaction(kSignals[i], nullptr, &current) != 0) continue;
    if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) continue;
    if (!installed_[0] && !installed_[1]) g_received.store(0);
    struct sigaction ours {};
    ours.sa_handler = volt_on_stop_signal;
    sigemptyset(&ours.sa_mask);
    // Interrupted system calls resume: the flag is read at the next batch boundary.
    ours.sa_flags = SA_RESTART;
    installed_[i] = ::sigaction(kSignals[i], &ours, nullptr) == 0;
  }
  if (installed_[0] || installed_[1]) g_watches.fetch_add(1);
  active_ = enclosed || installed_[0] || installed_[1];
}

SignalWatch::~SignalWatch() {
  for (int i = 0; i < 2; ++i) {
    if (!installed_[i]) continue;
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(kSignals[i], &dfl, nullptr);
  }
  if (installed_[0] || installed_[1]) {
    g_announce.store(false);
    g_watches.fetch_sub(1);
  }
}

void SignalWatch::announce(bool on) {
  if (installed_[0] || installed_[1]) g_announce.store(on);
}

int SignalWatch::received() const {
  return active_ ? g_received.load() : 0;
}

const char* signal_text(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

}  // namespace detail
}  // namespace volt
