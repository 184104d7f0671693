#include "volt/core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <utility>

#include "core/detail/log_every_rank.h"
#include "core/detail/log_order.h"

namespace volt {
namespace {

std::mutex& mutex() {
  static std::mutex mu;
  return mu;
}
LogSink& sink() {
  static LogSink s;
  return s;
}
std::set<std::string>& seen_keys() {
  static std::set<std::string> keys;
  return keys;
}
// The rank set by set_log_rank; -1 until then, when the launcher's environment tells it.
std::atomic<int64_t> g_rank{-1};

// Before a strategy sets the rank (a worker's set-up, or anything a program logs before fit),
// the one its launcher gave it: RANK, LOCAL_RANK, SLURM_PROCID, as Lightning's rank_zero_only
// reads them at import. Without one, 0.
int64_t rank_from_environment() {
  for (const char* name : {"RANK", "LOCAL_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long long r = std::strtoll(v, &end, 10);
    if (*end == '\0' && r >= 0) return r;
  }
  return 0;
}

int64_t current_rank() {
  int64_t r = g_rank.load();
  if (r >= 0) return r;
  int64_t unset = -1;
  g_rank.compare_exchange_strong(unset, rank_from_environment());
  return g_rank.load();
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "?";
}

bool prints(LogLevel level) {
  return level == LogLevel::kError || current_rank() == 0;
}

void emit(LogLevel level, const std::string& component, const std::string& message) {
  const int64_t rank = current_rank();
  std::string line = rank == 0 ? "[volt] " : "[volt rank " + std::to_string(rank) + "] ";
  line += level_name(level);
  line += ": ";
  if (!component.empty()) line += "[" + component + "] ";
  line += message;
  // Called with mutex() held: lines from several threads never interleave.
  if (sink()) {
    sink()(level, line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }
}

}  // namespace

void log_message(LogLevel level, const std::string& component, const std::string& message) {
  if (!prints(level)) return;
  std::lock_guard<std::mutex> lock(mutex());
  emit(level, component, message);
}

bool warn_once(const std::string& key, const std::string& component, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex());
  if (!seen_keys().insert(key).second || !prints(LogLevel::kWarning)) return false;
  emit(LogLevel::kWarning, component, message);
  return true;
}

void set_log_rank(int64_t rank) {
  g_rank.store(rank);
}
int64_t log_rank() {
  return current_rank();
}

namespace detail {

void log_on_every_rank(LogLevel level, const std::string& component, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex());
  emit(level, component, message);
}

void keep_log_alive() {
  mutex();
  sink();
  seen_keys();
}

}  // namespace detail

LogSink set_log_sink(LogSink s) {
  std::lock_guard<std::mutex> lock(mutex());
  std::swap(sink(), s);
  return s;
}

}  // namespace volt
