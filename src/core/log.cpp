#include "volt/core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <set>
#include <utility>

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
std::atomic<int64_t> g_rank{0};

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "?";
}

bool prints(LogLevel level) {
  return level == LogLevel::kError || g_rank.load() == 0;
}

void emit(LogLevel level, const std::string& component, const std::string& message) {
  const int64_t rank = g_rank.load();
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
  return g_rank.load();
}

namespace detail {

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
