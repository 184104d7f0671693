// KernelCache: entries on disk, the size cap with oldest-first eviction, the eviction lock
// between caches sharing a folder, clear_at_start, VOLT_KERNEL_CACHE_CONFIG and the failures
// that must only disable the cache. Real files in temporary folders.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <thread>

#include "error_text.h"
#include "file_text.h"
#include "log_capture.h"
#include "scoped_env.h"
#include "tiny.h"
#include "volt/kernels/kernel_cache.h"

namespace {

using volt_test::file_text;

using volt::KernelCache;
using volt::KernelCacheOptions;

constexpr int64_t kKiB = 1024;

using volt_test::ScopedEnv;

// Content that tells entries apart: `n` bytes derived from the key.
std::string payload(const std::string& key, int64_t n) {
  std::string s(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i < n; ++i) s[i] = static_cast<char>(key[i % key.size()] + i % 7);
  return s;
}

// Sets a file's modification time `seconds` into the past (tests must not wait for clocks).
void age(const std::string& path, int64_t seconds) {
  struct timespec now;
  ::clock_gettime(CLOCK_REALTIME, &now);
  struct timespec t[2] = {now, now};
  t[1].tv_sec -= seconds;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, 0), 0) << path;
}

std::vector<std::string> keys_of(const KernelCache& cache) {
  std::vector<std::string> keys;
  for (const auto& e : cache.entries()) keys.push_back(e.key);
  return keys;
}

bool contains(const std::vector<std::string>& lines, const std::string& text) {
  for (const auto& l : lines) {
    if (l.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(KernelCache, StoreThenFindReturnsTheBytes) {
  volt_test::TempDir dir;
  KernelCache cache(KernelCacheOptions(dir / "cache"));
  EXPECT_FALSE(cache.find("k1.so").has_value());
  cache.store("k1.so", payload("k1", 5000));
  cache.flush();
  auto path = cache.find("k1.so");
  ASSERT_TRUE(path.has_value());
  EXPECT_EQ(file_text(*path), payload("k1", 5000));
  const auto s = cache.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.stores, 1);
  EXPECT_EQ(s.evictions, 0);
  ASSERT_EQ(cache.entries().size(), 1u);
  EXPECT_EQ(cache.entries()[0].bytes, 5000);
  // Only the entry and the lock: the write went through a temp file that is gone.
  int files = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir / "cache")) {
    ++files;
    EXPECT_TRUE(f.path().filename() == "k1.so" || f.path().filename() == "eviction.lock")
        << f.path();
  }
  EXPECT_EQ(files, 2);
}

TEST(KernelCache, EvictsTheOldestEntriesDownToNinetyNinePercentOfTheCap) {
  volt_test::TempDir dir;
  KernelCache cache(KernelCacheOptions(dir / "c").size_mb(1));
  // 300 KiB entries: three fit under 0.99 MiB, a fourth does not.
  for (int i = 0; i < 3; ++i) {
    const std::string key = "e" + std::to_string(i) + ".so";
    cache.store(key, payload(key, 300 * kKiB));
    cache.flush();
    age(dir / "c/" + key, 300 - 100 * i);  // e0 oldest
  }
  EXPECT_EQ(keys_of(cache), (std::vector<std::string>{"e0.so", "e1.so", "e2.so"}));
  auto lines = volt_test::capture_logs([&] {
    cache.store("e3.so", payload("e3.so", 300 * kKiB));
    cache.flush();
  });
  EXPECT_EQ(keys_of(cache), (std::vector<std::string>{"e1.so", "e2.so", "e3.so"}));
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_TRUE(
      contains(lines, "Removed e0.so successfully. Disk cache size after removal: 900.0 KiB"))
      << (lines.empty() ? "" : lines[0]);
  EXPECT_TRUE(contains(lines, "raise size_mb"));
  int64_t total = 0;
  for (const auto& e : cache.entries()) total += e.bytes;
  EXPECT_LE(total, (int64_t{1} << 20) * 99 / 100);
}

TEST(KernelCache, AnEntryFoundIsKeptOverOlderUnusedOnes) {
  volt_test::TempDir dir;
  KernelCache cache(KernelCacheOptions(dir.path).size_mb(1));
  for (int i = 0; i < 3; ++i) {
    const std::string key = "e" + std::to_string(i) + ".so";
    cache.store(key, payload(key, 300 * kKiB));
    cache.flush();
    age(dir / key, 300 - 100 * i);
  }
  ASSERT_TRUE(cache.find("e0.so").has_value());  // used now: the least recently used is e1
  cache.store("e3.so", payload("e3.so", 300 * kKiB));
  cache.flush();
  EXPECT_EQ(keys_of(cache), (std::vector<std::string>{"e2.so", "e0.so", "e3.so"}));
}

TEST(KernelCache, AnEntryBiggerThanTheCapIsNotKeptAndSaysSo) {
  volt_test::TempDir dir;
  KernelCache cache(KernelCacheOptions(dir.path).size_mb(1));
  auto lines = volt_test::capture_logs([&] {
    cache.store("big.so", payload("big", 1100 * kKiB));
    cache.flush();
  });
  EXPECT_TRUE(keys_of(cache).empty());
  EXPECT_TRUE(contains(lines, "does not fit the cache's cap of 1 MiB"));
}

// flock locks belong to an open file description, so caches on one folder in one process
// exclude each other exactly as processes do. Four caches write into a folder already twice
// over its cap, so four eviction passes start on the same overfull folder. One at a time, the
// first pass brings it under the cap and the others find little to do: the folder ends within
// one entry of the cap. Without the lock, each pass removes what it saw as the oldest (a
// pass whose unlink finds the file gone goes on to younger ones) and the folder ends far below.
TEST(KernelCache, CachesSharingAFolderEvictOneAtATimeAndKeepEveryEntryWhole) {
  volt_test::TempDir dir;
  constexpr int kCaches = 4, kOld = 400;
  constexpr int64_t kEntry = 5 * kKiB;
  for (int i = 0; i < kOld; ++i) {
    const std::string key = "old" + std::to_string(i) + ".so";
    std::ofstream(dir / key, std::ios::binary) << payload(key, kEntry);
    age(dir / key, 10000 - i);  // old0 oldest
  }
  std::vector<std::unique_ptr<KernelCache>> caches;
  for (int c = 0; c < kCaches; ++c) {
    caches.push_back(std::make_unique<KernelCache>(KernelCacheOptions(dir.path).size_mb(1)));
  }
  std::vector<std::thread> threads;
  for (int c = 0; c < kCaches; ++c) {
    threads.emplace_back([&, c] {
      const std::string key = "new" + std::to_string(c) + ".so";
      caches[c]->store(key, payload(key, kEntry));
      caches[c]->flush();
    });
  }
  for (auto& t : threads) t.join();
  int64_t evictions = 0, failures = 0;
  for (const auto& c : caches) {
    evictions += c->stats().evictions;
    failures += c->stats().failures;
  }
  const auto entries = caches[0]->entries();
  std::set<std::string> kept;
  int64_t total = 0;
  for (const auto& e : entries) {
    kept.insert(e.key);
    total += e.bytes;
    EXPECT_EQ(file_text(dir / e.key), payload(e.key, kEntry)) << e.key;
  }
  const int64_t limit = (int64_t{1} << 20) * 99 / 100;
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(evictions + static_cast<int64_t>(entries.size()), kOld + kCaches);
  EXPECT_LE(total, limit);
  EXPECT_GT(total, limit - kEntry) << "over-evicted: " << entries.size() << " entries left";
  for (int c = 0; c < kCaches; ++c) EXPECT_TRUE(kept.count("new" + std::to_string(c) + ".so"));
  // Oldest first: what is left of the old ones is their youngest.
  for (int i = kOld - 1; i >= kOld - static_cast<int>(entries.size()) + kCaches; --i) {
    EXPECT_TRUE(kept.count("old" + std::to_string(i) + ".so")) << i;
  }
  for (const auto& f : std::filesystem::directory_iterator(dir.path)) {
    EXPECT_EQ(f.path().filename().string().find(".tmp."), std::string::npos) << f.path();
  }
}

TEST(KernelCache, ClearAtStartRemovesOnlyEntriesOlderThanThisProcess) {
  volt_test::TempDir dir;
  {
    KernelCache first(KernelCacheOptions(dir.path));
    first.store("old.so", payload("old", 100));
    first.store("new.so", payload("new", 100));
    first.flush();
  }
  age(dir / "old.so", 3600 * 24 * 365 * 5);  // long before this test binary started
  auto lines = volt_test::capture_logs(
      [&] { KernelCache reopened(KernelCacheOptions(dir.path).clear_at_start(true)); });
  EXPECT_FALSE(std::filesystem::exists(dir / "old.so"));
  EXPECT_TRUE(std::filesystem::exists(dir / "new.so"));  // written by this process: kept
  EXPECT_TRUE(contains(lines, "clear_at_start: removed 1 entries"));
  KernelCache without(KernelCacheOptions(dir.path));
  EXPECT_EQ(keys_of(without), (std::vector<std::string>{"new.so"}));
}

TEST(KernelCache, AFolderThatCannotBeCreatedDisablesTheCacheWithOneWarning) {
  volt_test::TempDir dir;
  std::ofstream(dir / "file") << "x";
  std::vector<std::string> lines;
  lines = volt_test::capture_logs([&] {
    KernelCache cache(KernelCacheOptions(dir / "file/sub"));
    EXPECT_FALSE(cache.enabled());
    EXPECT_FALSE(cache.find("a.so").has_value());
    cache.store("a.so", "bytes");  // dropped, no throw
    cache.flush();
    EXPECT_TRUE(cache.entries().empty());
  });
  EXPECT_TRUE(contains(lines, "cannot use the kernel cache folder"));
  EXPECT_TRUE(contains(lines, "VOLT_KERNEL_CACHE_CONFIG"));
}

TEST(KernelCache, KeysMustBePlainFileNames) {
  volt_test::TempDir dir;
  KernelCache cache(KernelCacheOptions(dir.path));
  for (const std::string bad : {"", "../x.so", "a/b", ".hidden", "eviction.lock", "a b"}) {
    const auto msg = volt_test::error_of<volt::ValueError>([&] { cache.find(bad); });
    EXPECT_NE(msg.find("is not a file name"), std::string::npos) << bad;
  }
  EXPECT_NE(volt_test::error_of<volt::ValueError>([&] { cache.store("a/b", "x"); }), "");
  EXPECT_NE(volt_test::error_of<volt::ConfigError>(
                [&] { KernelCache bad(KernelCacheOptions(dir.path).size_mb(0)); }),
            "");
  // A cap whose byte count overflows int64 (the eviction multiplies by 2^20).
  const auto huge = volt_test::error_of<volt::ConfigError>(
      [&] { KernelCache bad(KernelCacheOptions(dir.path).size_mb(int64_t{1} << 43)); });
  EXPECT_NE(huge.find("more bytes than 64 bits count; give at most 8796093022207 MiB"),
            std::string::npos)
      << huge;
}

TEST(KernelCache, ConfigFromTheEnvironment) {
  {
    ScopedEnv e("VOLT_KERNEL_CACHE_CONFIG", "/tmp/volt_k,true,64");
    const auto o = KernelCacheOptions::from_env();
    EXPECT_EQ(o.dir(), "/tmp/volt_k");
    EXPECT_TRUE(o.clear_at_start());
    EXPECT_EQ(o.size_mb(), 64);
  }
  {
    ScopedEnv e("VOLT_KERNEL_CACHE_CONFIG", "");
    ScopedEnv c("VOLT_CACHE_DIR", "/tmp/vc");
    const auto o = KernelCacheOptions::from_env();
    EXPECT_EQ(o.dir(), "/tmp/vc/kernels");
    EXPECT_FALSE(o.clear_at_start());
    EXPECT_EQ(o.size_mb(), 1024);
  }
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"/tmp/x,true", "has 2 comma-separated fields, not 3"},
      {",true,10", "names no folder"},
      {"/tmp/x,yes,10", "clear_at_start \"yes\" is not true, false, 1 or 0"},
      {"/tmp/x,false,0", "size \"0\" is not a whole number of MiB from 1 to 8796093022207"},
      {"/tmp/x,false,8796093022208", "size \"8796093022208\" is not a whole number of MiB"},
      {"/tmp/x,false,12mb", "size \"12mb\""},
  };
  for (const auto& [value, phrase] : bad) {
    ScopedEnv e("VOLT_KERNEL_CACHE_CONFIG", value);
    const auto msg = volt_test::error_of<volt::ConfigError>([] { KernelCacheOptions::from_env(); });
    EXPECT_NE(msg.find(phrase), std::string::npos) << value << " -> " << msg;
    EXPECT_NE(msg.find("e.g. /tmp/volt_kernels,false,1024"), std::string::npos) << msg;
  }
}

}  // namespace
