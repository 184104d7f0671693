#include "volt/kernels/kernel_cache.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <ostream>
#include <tuple>

#include "core/detail/ascii.h"
#include "core/detail/file_lock.h"
#include "core/detail/log_order.h"
#include "core/detail/machine.h"
#include "core/detail/numbers.h"
#include "core/detail/temp_files.h"
#include "volt/core/atomic_file.h"
#include "volt/core/check.h"
#include "volt/core/env.h"
#include "volt/core/errors.h"
#include "volt/core/log.h"

namespace volt {
namespace {

constexpr const char* kLockName = "eviction.lock";
constexpr const char* kComponent = "KernelCache";

bool is_valid_key(const std::string& key) {
  if (key.empty() || key[0] == '.' || key == kLockName) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return detail::ascii_alnum(c) || c == '.' || c == '_' || c == '-';
  });
}

void check_key(const std::string& key) {
  VOLT_CHECK(is_valid_key(key), ValueError, "[KernelCache] key '", key,
             "' is not a file name made of letters, digits, '.', '_' and '-' (not starting with "
             "'.', not '",
             kLockName, "'); derive keys from a hash.");
}

std::string human_bytes(int64_t b) {
  auto os = detail::c_stream<std::ostringstream>();
  os.setf(std::ios::fixed);
  os.precision(1);
  if (b >= (int64_t{1} << 20)) {
    os << static_cast<double>(b) / (1 << 20) << " MiB";
  } else if (b >= 1024) {
    os << static_cast<double>(b) / 1024 << " KiB";
  } else {
    os << b << " B";
  }
  return os.str();
}

// When this process started, from the kernel's boot time and the process's start tick: the
// same instant however late the cache is opened, which clear_at_start needs.
struct timespec process_start_time() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);  // fallback: now
  auto stat_file = detail::c_stream<std::ifstream>("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos) return ts;
  auto fields = detail::c_stream<std::istringstream>(stat.substr(paren + 2));
  std::string field;
  unsigned long long start_ticks = 0;
  // Fields after the command name start at field 3 (state); starttime is field 22.
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) start_ticks = std::stoull(field);
  }
  auto proc_stat = detail::c_stream<std::ifstream>("/proc/stat");
  long long btime = -1;
  for (std::string line; std::getline(proc_stat, line);) {
    if (line.rfind("btime ", 0) == 0) btime = std::stoll(line.substr(6));
  }
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (btime < 0 || hz <= 0 || start_ticks == 0) return ts;
  struct timespec start {};
  start.tv_sec = static_cast<time_t>(btime + static_cast<long long>(start_ticks / hz));
  start.tv_nsec = static_cast<long>((start_ticks % hz) * (1000000000LL / hz));
  return start;
}

struct DiskEntry {
  std::string key;
  int64_t bytes;
  struct timespec mtime;
};

// The finished entries in `dir` (not the lock, not temp files of writers), oldest first.
std::vector<DiskEntry> scan(const std::string& dir) {
  std::vector<DiskEntry> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!is_valid_key(name) || detail::is_temp_name(name)) continue;
    struct stat st;
    if (::stat((dir + "/" + name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    out.push_back({name, static_cast<int64_t>(st.st_size), st.st_mtim});
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const DiskEntry& a, const DiskEntry& b) {
    return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec, a.key) <
           std::tie(b.mtime.tv_sec, b.mtime.tv_nsec, b.key);
  });
  return out;
}

std::string lock_path(const std::string& dir) {
  return dir + "/" + kLockName;
}

}  // namespace

// The largest cap in MiB whose byte count fits an int64 (the eviction compares bytes).
constexpr int64_t kMaxSizeMb = std::numeric_limits<int64_t>::max() >> 20;

KernelCacheOptions KernelCacheOptions::from_env() {
  const auto config = env_value("VOLT_KERNEL_CACHE_CONFIG");
  if (!config) {
    const std::string root = detail::volt_cache_dir();
    return KernelCacheOptions(root.empty() ? std::string() : root + "/kernels");
  }
  std::vector<std::string> fields;
  auto in = detail::c_stream<std::stringstream>(*config);
  for (std::string f; std::getline(in, f, ',');) fields.push_back(f);
  const char* how =
      "; write VOLT_KERNEL_CACHE_CONFIG=<folder>,<clear_at_start: true|false>,<size cap in MiB>, "
      "e.g. /tmp/volt_kernels,false,1024.";
  VOLT_CHECK(fields.size() == 3, ConfigError, "[KernelCache] VOLT_KERNEL_CACHE_CONFIG=\"", *config,
             "\" has ", fields.size(), " comma-separated fields, not 3", how);
  VOLT_CHECK(!fields[0].empty(), ConfigError,
             "[KernelCache] VOLT_KERNEL_CACHE_CONFIG names no folder", how);
  const std::string& clear = fields[1];
  VOLT_CHECK(clear == "true" || clear == "false" || clear == "1" || clear == "0", ConfigError,
             "[KernelCache] VOLT_KERNEL_CACHE_CONFIG: clear_at_start \"", clear,
             "\" is not true, false, 1 or 0", how);
  int64_t size_mb = 0;
  size_t used = 0;
  try {
    size_mb = std::stoll(fields[2], &used);
  } catch (const std::exception&) {
    used = 0;
  }
  VOLT_CHECK(used == fields[2].size() && used > 0 && size_mb >= 1 && size_mb <= kMaxSizeMb,
             ConfigError, "[KernelCache] VOLT_KERNEL_CACHE_CONFIG: size \"", fields[2],
             "\" is not a whole number of MiB from 1 to ", kMaxSizeMb, how);
  return KernelCacheOptions(fields[0])
      .clear_at_start(clear == "true" || clear == "1")
      .size_mb(size_mb);
}

std::ostream& operator<<(std::ostream& os, const KernelCacheOptions& o) {
  return os << "KernelCacheOptions(dir=" << (o.dir().empty() ? "<none>" : o.dir())
            << ", clear_at_start=" << (o.clear_at_start() ? "true" : "false")
            << ", size_mb=" << o.size_mb() << ")";
}

KernelCache::KernelCache(KernelCacheOptions options) : options_(std::move(options)) {
  VOLT_CHECK(options_.size_mb() >= 1, ConfigError, "[KernelCache] size_mb=", options_.size_mb(),
             " is below 1; give the cache at least 1 MiB.");
  VOLT_CHECK(options_.size_mb() <= kMaxSizeMb, ConfigError,
             "[KernelCache] size_mb=", options_.size_mb(),
             " is more bytes than 64 bits count; give at most ", kMaxSizeMb, " MiB.");
  std::string why = "no cache folder: none of VOLT_CACHE_DIR, XDG_CACHE_HOME, HOME is set";
  std::error_code ec;
  if (!options_.dir().empty()) {
    std::filesystem::create_directories(options_.dir(), ec);
    if (!ec && !std::filesystem::is_directory(options_.dir(), ec)) {
      ec = std::make_error_code(std::errc::not_a_directory);
    }
    why = ec.message();
  }
  if (options_.dir().empty() || ec) {
    enabled_ = false;
    warn_once("kernel-cache-open:" + options_.dir(), kComponent,
              "cannot use the kernel cache folder '" + options_.dir() + "' (" + why +
                  "); kernels are compiled in every process until this is fixed (set "
                  "VOLT_KERNEL_CACHE_CONFIG=<writable folder>,false,1024).");
    return;
  }
  if (options_.clear_at_start()) clear_stale_at_start();
}

KernelCache::~KernelCache() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void KernelCache::clear_stale_at_start() {
  detail::FileLock lock(lock_path(options_.dir()));
  const struct timespec start = process_start_time();
  int64_t removed = 0;
  for (const auto& e : scan(options_.dir())) {
    const bool older =
        std::tie(e.mtime.tv_sec, e.mtime.tv_nsec) < std::tie(start.tv_sec, start.tv_nsec);
    if (older && ::unlink((options_.dir() + "/" + e.key).c_str()) == 0) ++removed;
  }
  log_info(kComponent, "clear_at_start: removed " + std::to_string(removed) +
                           " entries written before this process started from '" + options_.dir() +
                           "'");
}

std::optional<std::string> KernelCache::find(const std::string& key) {
  check_key(key);
  std::unique_lock<std::mutex> lock(mu_);
  if (!enabled_) return std::nullopt;
  const std::string path = options_.dir() + "/" + key;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    ++stats_.misses;
    return std::nullopt;
  }
  // Refresh the time: eviction removes the least recently used entry, not the oldest written.
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
  ++stats_.hits;
  return path;
}

void KernelCache::store(const std::string& key, std::string bytes) {
  check_key(key);
  std::unique_lock<std::mutex> lock(mu_);
  if (!enabled_) return;
  queue_.emplace_back(key, std::move(bytes));
  ++in_flight_;
  if (!thread_.joinable()) thread_ = std::thread([this] { worker(); });
  lock.unlock();
  cv_.notify_all();
}

void KernelCache::remove(const std::string& key) {
  check_key(key);
  if (!enabled()) return;
  detail::FileLock lock(lock_path(options_.dir()));
  ::unlink((options_.dir() + "/" + key).c_str());
}

void KernelCache::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return in_flight_ == 0; });
}

std::vector<KernelCacheEntry> KernelCache::entries() const {
  std::vector<KernelCacheEntry> out;
  if (!enabled()) return out;
  for (const auto& e : scan(options_.dir())) out.push_back({e.key, e.bytes});
  return out;
}

bool KernelCache::enabled() const {
  std::unique_lock<std::mutex> lock(mu_);
  return enabled_;
}

KernelCacheStats KernelCache::stats() const {
  std::unique_lock<std::mutex> lock(mu_);
  return stats_;
}

KernelCache& KernelCache::global() {
  // The destructor waits for pending writes, whose eviction passes log: the log's statics must
  // outlive this one, so they are constructed first (statics die in reverse order).
  static const bool log_first = (detail::keep_log_alive(), true);
  (void)log_first;
  static KernelCache cache(KernelCacheOptions::from_env());
  return cache;
}

void KernelCache::worker() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and every write is done
    auto [key, bytes] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    write_and_evict(key, bytes);
    lock.lock();
    --in_flight_;
    cv_.notify_all();
  }
}

void KernelCache::write_and_evict(const std::string& key, const std::string& bytes) {
  try {
    atomic_write_file(options_.dir() + "/" + key, bytes);
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++stats_.stores;
    }
    evict(key);
  } catch (const std::exception& e) {
    fail(std::string("writing entry ") + key + ": " + e.what());
  }
}

void KernelCache::evict(const std::string& just_written) {
  detail::FileLock lock(lock_path(options_.dir()));
  if (!lock.locked()) {
    fail("cannot lock " + lock_path(options_.dir()) + " (" + std::strerror(errno) + ")");
    return;
  }
  // The size of the next entry is not known before it is written: leave 1% of room for it.
  const int64_t cap = options_.size_mb() * (int64_t{1} << 20);
  const int64_t limit = cap - cap / 100;
  auto entries = scan(options_.dir());
  int64_t total = 0;
  for (const auto& e : entries) total += e.bytes;
  for (const auto& e : entries) {
    if (total <= limit) break;
    if (::unlink((options_.dir() + "/" + e.key).c_str()) != 0) {
      if (errno != ENOENT) fail("removing " + e.key + ": " + std::strerror(errno));
      continue;
    }
    total -= e.bytes;
    {
      std::unique_lock<std::mutex> guard(mu_);
      ++stats_.evictions;
    }
    log_info(kComponent, "Removed " + e.key +
                             " successfully. Disk cache size after removal: " + human_bytes(total));
    if (e.key == just_written) {
      warn_once("kernel-cache-too-big:" + options_.dir(), kComponent,
                "entry " + just_written + " (" + human_bytes(e.bytes) +
                    ") does not fit the cache's cap of " + std::to_string(options_.size_mb()) +
                    " MiB; raise size_mb in VOLT_KERNEL_CACHE_CONFIG.");
    } else {
      warn_once("kernel-cache-evicting:" + options_.dir(), kComponent,
                "the kernel cache '" + options_.dir() + "' is full (" +
                    std::to_string(options_.size_mb()) +
                    " MiB) and evicts its oldest entries; if this repeats every run, kernels "
                    "are recompiled each time: raise size_mb in VOLT_KERNEL_CACHE_CONFIG.");
    }
  }
}

void KernelCache::fail(const std::string& what) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    ++stats_.failures;
  }
  warn_once("kernel-cache-fail:" + options_.dir(), kComponent,
            what + "; the cache skips this entry and kernels are compiled again when needed.");
}

}  // namespace volt
