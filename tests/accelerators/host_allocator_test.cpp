// Host allocator: which malloc serves the process, and the real `volt fit` run briefly under each
// allocator scripts/with_allocator.sh preloads (default, jemalloc, tcmalloc), with the
// allocator's own exit statistics as independent proof that it served the process.

#include "volt/accelerators/host_allocator.h"

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "accelerators/detail/malloc_env.h"
#include "volt/core/env.h"
#include "volt/core/errors.h"

#include "build_paths.h"
#include "processes.h"
#include "tiny.h"

namespace {

const std::string kScript = volt_test::source_dir() + "/scripts/with_allocator.sh";

TEST(HostAllocator, NamesTheLibraryThatDefinesMalloc) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // In a sanitized build the sanitizer runtime defines malloc: another allocator, named.
  const volt::HostAllocator s = volt::host_allocator();
  EXPECT_EQ(s.name, "other") << s.library;
  EXPECT_NE(s.library.find("san"), std::string::npos) << s.library;
  return;
#endif
  const char* preload = std::getenv("LD_PRELOAD");
  const std::string p = preload == nullptr ? "" : preload;
  const std::string expected = p.find("jemalloc") != std::string::npos   ? "jemalloc"
                               : p.find("tcmalloc") != std::string::npos ? "tcmalloc"
                                                                         : "default";
  const volt::HostAllocator a = volt::host_allocator();
  EXPECT_EQ(a.name, expected) << a.library;
  ASSERT_FALSE(a.library.empty());
  EXPECT_TRUE(std::filesystem::exists(a.library)) << a.library;
  if (expected == "default") {
    EXPECT_NE(a.library.find("libc.so"), std::string::npos) << a.library;
    EXPECT_NE(volt::describe(a).find("host allocator: default (" + a.library +
                                     "); to try jemalloc or tcmalloc"),
              std::string::npos)
        << volt::describe(a);
  }
}

struct CliRun {
  int code;
  std::string output;
};

/// `volt fit` of the Fashion-MNIST MLP for 3 steps (no validation) under `allocator`, asking
/// jemalloc and tcmalloc to print their statistics at exit; `extra` arguments and environment.
CliRun fit_under(const std::string& allocator, const std::string& dir,
                 const std::vector<std::string>& extra = {},
                 std::map<std::string, std::string> env = {}) {
  std::vector<std::string> args{kScript,
                                allocator,
                                volt_test::cli_binary(),
                                "fit",
                                "--model=MlpClassifier",
                                "--data=FashionMNIST",
                                "--trainer.max_steps=3",
                                "--trainer.limit_val_batches=0",
                                "--trainer.num_sanity_val_steps=0",
                                "--trainer.enable_progress_bar=false",
                                "--trainer.enable_checkpointing=false",
                                "--trainer.log_every_n_steps=1",
                                "--trainer.default_root_dir=" + dir};
  args.insert(args.end(), extra.begin(), extra.end());
  env["MALLOC_CONF"] = "stats_print:true";
  env["MALLOCSTATS"] = "1";
  volt_test::Process p("/bin/bash", args, env);
  const int code = p.exit_code(std::chrono::seconds(120));
  return {code, p.output()};
}

TEST(HostAllocator, TheCliTrainsUnderEachAllocatorAndLogsWhichOneServesMalloc) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizer runtime replaces malloc in the sanitized `volt` binary, whatever is preloaded
  // (the run logs "host allocator: other (libtsan.so.2)").
  GTEST_SKIP() << "a sanitized build's malloc is the sanitizer's, not a preloaded allocator";
#endif
  volt_test::TempDir dir;
  for (const std::string name : {"default", "jemalloc", "tcmalloc"}) {
    SCOPED_TRACE(name);
    const CliRun r = fit_under(name, dir / name);
    if (r.code == 2 && r.output.find("is not installed") != std::string::npos) {
      GTEST_SKIP() << name << " is not installed on this machine (scripts/setup.sh installs it)";
    }
    ASSERT_EQ(r.code, 0) << r.output;
    // It trained and wrote its metrics.
    EXPECT_TRUE(std::filesystem::exists(dir / (name + "/volt_logs/version_0/metrics.csv")))
        << r.output;
    // volt's own detection (once, at the start of the run).
    const std::string logged = "[volt] info: [Trainer] host allocator: " + name + " (";
    ASSERT_NE(r.output.find(logged), std::string::npos) << r.output;
    const size_t at = r.output.find(logged) + logged.size();
    const std::string library = r.output.substr(at, r.output.find(')', at) - at);
    EXPECT_EQ(r.output.find(logged, at), std::string::npos) << "logged twice:\n" << r.output;
    // Independent proof: each allocator's exit statistics appear only when it served malloc.
    const bool je_stats = r.output.find("___ Begin jemalloc statistics ___") != std::string::npos;
    const bool tc_stats = r.output.find("Bytes in use by application") != std::string::npos;
    // Host memory reuse: the C library's malloc is tuned, the others are left alone.
    const std::string reuse = name == "default"
                                  ? "[Trainer] host memory reuse: malloc keeps freed blocks up "
                                    "to 256 MiB and up to 512 MiB of free heap for reuse"
                                  : "[Trainer] host memory reuse: left to the " + name +
                                        " allocator (volt tunes only the C library's malloc)";
    EXPECT_NE(r.output.find(reuse), std::string::npos) << r.output;
    if (name == "jemalloc") {
      EXPECT_NE(library.find("libjemalloc.so.2"), std::string::npos) << library;
      EXPECT_TRUE(je_stats) << r.output;
      EXPECT_FALSE(tc_stats);
    } else if (name == "tcmalloc") {
      EXPECT_NE(library.find("libtcmalloc_minimal.so.4"), std::string::npos) << library;
      EXPECT_TRUE(tc_stats) << r.output;
      EXPECT_FALSE(je_stats);
    } else {
      EXPECT_NE(library.find("libc.so"), std::string::npos) << library;
      EXPECT_FALSE(je_stats);
      EXPECT_FALSE(tc_stats);
    }
  }
}

TEST(HostAllocator, TheCliLeavesMallocAloneWhenToldToOrWhenTheEnvironmentConfiguresIt) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitized build's malloc is the sanitizer's: volt never tunes it";
#endif
  volt_test::TempDir dir;
  const CliRun off = fit_under("default", dir / "off", {"--trainer.reuse_host_memory=false"});
  ASSERT_EQ(off.code, 0) << off.output;
  EXPECT_EQ(off.output.find("host memory reuse"), std::string::npos) << off.output;
  const CliRun env = fit_under("default", dir / "env", {},
                               {{"GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576"}});
  ASSERT_EQ(env.code, 0) << env.output;
  EXPECT_NE(env.output.find("[Trainer] host memory reuse: left to the environment "
                            "(GLIBC_TUNABLES configures malloc's thresholds)"),
            std::string::npos)
      << env.output;
}

TEST(HostAllocator, TheEnvironmentConfiguresMallocThroughItsVariablesOrGlibcTunables) {
  auto with = [](std::map<std::string, std::string> vars) {
    return volt::detail::malloc_configured_by(
        [&vars](const std::string& name) -> std::optional<std::string> {
          auto it = vars.find(name);
          if (it == vars.end()) return std::nullopt;
          return it->second;
        });
  };
  EXPECT_EQ(with({}), "");
  EXPECT_EQ(with({{"MALLOC_ARENA_MAX", "2"}, {"MALLOCSTATS", "1"}}), "");
  EXPECT_EQ(with({{"MALLOC_TRIM_THRESHOLD_", "0"}}), "MALLOC_TRIM_THRESHOLD_");
  EXPECT_EQ(with({{"MALLOC_MMAP_THRESHOLD_", "65536"}}), "MALLOC_MMAP_THRESHOLD_");
  EXPECT_EQ(with({{"MALLOC_TOP_PAD_", "0"}}), "MALLOC_TOP_PAD_");
  EXPECT_EQ(with({{"MALLOC_MMAP_MAX_", "0"}}), "MALLOC_MMAP_MAX_");
  EXPECT_EQ(with({{"GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=512"}}), "");
  EXPECT_EQ(with({{"GLIBC_TUNABLES", "glibc.rtld.nns=2:glibc.malloc.mmap_threshold=1"}}),
            "GLIBC_TUNABLES");
}

long minor_faults() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

/// Allocates, writes and frees `bytes` `times` over; the minor page faults that took.
long churn(size_t bytes, int times) {
  const long before = minor_faults();
  for (int i = 0; i < times; ++i) {
    char* p = static_cast<char*>(std::malloc(bytes));
    if (p == nullptr) return -1;
    std::memset(p, i + 1, bytes);
    asm volatile("" : : "r"(p) : "memory");  // the writes and the block stay
    std::free(p);
  }
  return minor_faults() - before;
}

TEST(HostAllocator, ReuseKeepsAFreedBlockFromFaultingInAgain) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitized build's malloc is the sanitizer's: volt never tunes it";
#endif
  if (volt::host_allocator().name != "default") GTEST_SKIP() << "malloc is not the C library's";
  if (!volt::detail::malloc_configured_by(&volt::env_value).empty()) {
    GTEST_SKIP() << "the environment configures malloc";
  }
  // In a child process: the tuning is process-wide and for good. 64 MiB is above glibc's
  // largest adaptive mmap threshold (32 MiB), so by default every malloc of it maps fresh pages
  // and every free unmaps them; tuned, the block stays in the heap after the first time.
  constexpr size_t kBytes = size_t(64) << 20;
  constexpr long kPages = static_cast<long>(kBytes / 4096);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    long out[3];
    out[0] = churn(kBytes, 5);
    out[1] = volt::reuse_freed_host_memory().applied ? 1 : 0;
    out[2] = churn(kBytes, 5);
    const bool ok = ::write(fds[1], out, sizeof out) == static_cast<ssize_t>(sizeof out);
    ::_exit(ok ? 0 : 1);
  }
  ::close(fds[1]);
  long got[3] = {0, 0, 0};
  const ssize_t n = ::read(fds[0], got, sizeof got);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_EQ(n, static_cast<ssize_t>(sizeof got));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(got[1], 1) << "reuse_freed_host_memory() did not apply";
  EXPECT_GE(got[0], 4 * kPages) << "glibc's default faulted less than expected";
  EXPECT_LE(got[2], kPages + kPages / 4) << "tuned, only the first allocation may fault";
  std::printf(
      "[ measured ] 5 x malloc/write/free of 64 MiB: %ld page faults by default, %ld "
      "with freed memory kept (%ld pages each)\n",
      got[0], got[2], kPages);
}

TEST(HostAllocator, ThresholdsAboveIntMaxAreAValueError) {
  EXPECT_THROW(volt::reuse_freed_host_memory(size_t(1) << 31, 1), volt::ValueError);
}

TEST(HostAllocator, TheScriptRejectsAnUnknownNameAndAMissingCommand) {
  volt_test::Process unknown("/bin/bash", {kScript, "mimalloc", "/bin/true"});
  EXPECT_EQ(unknown.exit_code(std::chrono::seconds(30)), 2);
  EXPECT_NE(unknown.output().find("unknown allocator 'mimalloc'; use default, jemalloc or "
                                  "tcmalloc"),
            std::string::npos)
      << unknown.output();
  volt_test::Process no_command("/bin/bash", {kScript, "jemalloc"});
  EXPECT_EQ(no_command.exit_code(std::chrono::seconds(30)), 2);
  EXPECT_NE(no_command.output().find("usage: scripts/with_allocator.sh"), std::string::npos)
      << no_command.output();
}

}  // namespace
