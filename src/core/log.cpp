#include "volt/core/log.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include <sys/ioctl.h>
#include <unistd.h>

#include "core/detail/live_rows.h"
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
// The progress bar's rows on a terminal (detail::show_live_rows), under mutex().
struct LiveRows {
  std::FILE* out = nullptr;
  std::vector<std::string> rows;
  size_t drawn = 0;  // terminal rows they occupy below and on the cursor's
};
LiveRows& live() {
  static LiveRows l;
  return l;
}

// Redraws the live rows as `rows`: the rows below the first first (going down with newlines,
// which scroll at the bottom of the screen), then back up to the first, drawn last so that the
// cursor stays at its end. Rows no longer shown are erased.
void paint(std::FILE* out, const std::vector<std::string>& rows) {
  LiveRows& l = live();
  if (l.out != nullptr && l.out != out) l.drawn = 0;  // another stream's rows: left as they are
  if (rows.empty() && l.drawn == 0) return;           // nothing shown: the line is not ours
  const int64_t columns = detail::terminal_columns(out);
  const size_t n = std::max(rows.size(), l.drawn);
  std::string s = "\r";
  for (size_t i = 1; i < n; ++i) {
    s += "\n\r";
    if (i < rows.size()) s += detail::cut_to_columns(rows[i], columns - 1);
    s += "\033[K";
  }
  if (n > 1) s += "\033[" + std::to_string(n - 1) + "A\r";
  if (!rows.empty()) s += detail::cut_to_columns(rows[0], columns - 1);
  s += "\033[K";
  std::fputs(s.c_str(), out);
  std::fflush(out);
  l.out = rows.empty() ? nullptr : out;
  l.rows = rows;
  l.drawn = rows.size();
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
  } else if (live().out == stderr && !live().rows.empty()) {
    // Above the progress bar's rows: erase them, print the line where they began, draw them
    // again below it.
    const std::vector<std::string> rows = live().rows;
    paint(stderr, {});
    std::fprintf(stderr, "%s\n", line.c_str());
    paint(stderr, rows);
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
  live();
}

void show_live_rows(std::FILE* out, const std::vector<std::string>& rows) {
  std::lock_guard<std::mutex> lock(mutex());
  paint(out, rows);
}

void end_live_rows(std::FILE* out, size_t keep) {
  std::lock_guard<std::mutex> lock(mutex());
  LiveRows& l = live();
  if (l.out != out) return;
  std::vector<std::string> rows = l.rows;
  const size_t kept = std::min(keep, rows.size());
  if (kept < rows.size()) {
    rows.resize(kept);
    paint(out, rows);
  }
  // From the end of the first row to the line after the last one kept (tqdm's close writes
  // "\n" too: the terminal's output processing returns the carriage).
  if (kept > 0) {
    std::fputs(std::string(kept, '\n').c_str(), out);
    std::fflush(out);
  }
  l = LiveRows{};
}

void write_line(std::FILE* out, const std::string& line) {
  std::lock_guard<std::mutex> lock(mutex());
  std::fprintf(out, "%s\n", line.c_str());
  std::fflush(out);
}

int64_t terminal_columns(std::FILE* out) {
  struct winsize ws {};
  if (out == nullptr || ::ioctl(::fileno(out), TIOCGWINSZ, &ws) != 0) return 0;
  return ws.ws_col;
}

std::string cut_to_columns(const std::string& text, int64_t columns) {
  if (columns <= 0) return text;
  int64_t seen = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    // A character starts at every byte that is not a UTF-8 continuation byte (10xxxxxx).
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80 && seen++ == columns) {
      return text.substr(0, i);
    }
  }
  return text;
}

}  // namespace detail

LogSink set_log_sink(LogSink s) {
  std::lock_guard<std::mutex> lock(mutex());
  std::swap(sink(), s);
  return s;
}

}  // namespace volt
