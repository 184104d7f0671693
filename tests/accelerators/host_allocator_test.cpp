// Host allocator: which malloc serves the process, and the real `volt fit` run briefly under each
// allocator scripts/with_allocator.sh preloads (default, jemalloc, tcmalloc), with the
// allocator's own exit statistics as independent proof that it served the process.

#include "volt/accelerators/host_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "processes.h"
#include "tiny.h"

namespace {

const std::string kScript = std::string(VOLT_SOURCE_DIR) + "/scripts/with_allocator.sh";

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
/// jemalloc and tcmalloc to print their statistics at exit.
CliRun fit_under(const std::string& allocator, const volt_test::TempDir& dir) {
  volt_test::Process p(
      "/bin/bash",
      {kScript, allocator, VOLT_CLI_BINARY, "fit", "--model=MlpClassifier", "--data=FashionMNIST",
       "--trainer.max_steps=3", "--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0",
       "--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false",
       "--trainer.log_every_n_steps=1", "--trainer.default_root_dir=" + (dir / allocator)},
      {{"MALLOC_CONF", "stats_print:true"}, {"MALLOCSTATS", "1"}});
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
    const CliRun r = fit_under(name, dir);
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
