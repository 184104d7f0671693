// The table of environment variables volt reads: values checked against their choices, VOLT_*
// typos warned with the closest name, and the Trainer doing both when a run starts, plus the
// global-batch line it logs at the start of fit.
#include "volt/core/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "error_text.h"
#include "log_capture.h"
#include "scoped_env.h"
#include "tiny.h"
#include "volt/core/errors.h"
#include "volt/trainer/trainer.h"

namespace {

using volt_test::ScopedEnv;

bool contains(const std::vector<std::string>& lines, const std::string& text) {
  for (const auto& l : lines) {
    if (l.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(Env, EveryListedVariableHasOneEntryWithItsValuesAndMeaning) {
  std::set<std::string> names;
  for (const auto& v : volt::env_vars()) {
    EXPECT_TRUE(names.insert(v.name).second) << v.name << " is listed twice";
    EXPECT_FALSE(v.values.empty()) << v.name;
    EXPECT_FALSE(v.meaning.empty()) << v.name;
    EXPECT_EQ(volt::find_env_var(v.name), &v);
  }
  EXPECT_EQ(volt::find_env_var("VOLT_NOT_A_FLAG"), nullptr);
  // The ones read by name elsewhere in volt are all there.
  for (const char* n : {"VOLT_LOG_HOST_SYNCS", "VOLT_CACHE_DIR", "LOWER_LIST", "FP32_LIST",
                        "QUANT_CONFIG", "GLOO_SOCKET_IFNAME", "VOLT_RESTART_CHECKPOINT",
                        "VOLT_LAUNCHED_CHILD", "MASTER_PORT", "SLURM_PROCID",
                        // read by scripts/, listed so that setting them is not called a typo
                        "VOLT_ALLOCATOR", "VOLT_CHROMIUM"}) {
    EXPECT_EQ(names.count(n), 1u) << n;
  }
}

TEST(Env, ValuesOutsideTheChoicesAreConfigErrorsAndEmptyMeansUnset) {
  {
    ScopedEnv e("VOLT_LOG_HOST_SYNCS", "2");
    EXPECT_EQ(volt::env_value("VOLT_LOG_HOST_SYNCS"), std::optional<std::string>("2"));
  }
  {
    ScopedEnv e("VOLT_LOG_HOST_SYNCS", "");
    EXPECT_EQ(volt::env_value("VOLT_LOG_HOST_SYNCS"), std::nullopt);
  }
  ::unsetenv("VOLT_LOG_HOST_SYNCS");
  EXPECT_EQ(volt::env_value("VOLT_LOG_HOST_SYNCS"), std::nullopt);
  ScopedEnv e("VOLT_LOG_HOST_SYNCS", "yes");
  EXPECT_EQ(volt_test::error_of<volt::ConfigError>([] { volt::env_value("VOLT_LOG_HOST_SYNCS"); })
                .rfind("[env] VOLT_LOG_HOST_SYNCS=\"yes\" is not one of 0, 1, 2; "
                       "VOLT_LOG_HOST_SYNCS means: log host syncs",
                       0),
            0u);
  // The Trainer stops before running.
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  EXPECT_NE(volt_test::error_of<volt::ConfigError>([&] {
              volt::Trainer trainer(volt_test::quiet(dir.path).max_steps(1));
              trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
            }).find("VOLT_LOG_HOST_SYNCS=\"yes\" is not one of 0, 1, 2"),
            std::string::npos);
}

TEST(Env, ReadingAnUnlistedNameIsAnInternalError) {
  EXPECT_NE(volt_test::error_of<volt::InternalError>([] {
              volt::env_value("VOLT_NOT_LISTED");
            }).find("VOLT_NOT_LISTED is read but not listed"),
            std::string::npos);
}

TEST(Env, UnknownVoltVariablesAreWarnedWithTheClosestListedName) {
  ScopedEnv typo("VOLT_LOG_HOST_SYNC", "1");
  ScopedEnv prefixed("VOLT_QUANT_CONFIG", "q.json");
  ScopedEnv far("VOLT_ZQXWV", "1");
  ScopedEnv known("VOLT_CACHE_DIR", "/tmp");
  ScopedEnv other("NOT_VOLTS_BUSINESS", "1");
  const auto w = volt::unknown_env_warnings();
  ASSERT_EQ(w.size(), 3u) << ::testing::PrintToString(w);
  EXPECT_EQ(w[0],
            "VOLT_LOG_HOST_SYNC is set but volt reads no such variable; did you mean "
            "VOLT_LOG_HOST_SYNCS?");
  EXPECT_EQ(w[1],
            "VOLT_QUANT_CONFIG is set but volt reads no such variable; did you mean "
            "QUANT_CONFIG?");
  EXPECT_EQ(w[2],
            "VOLT_ZQXWV is set but volt reads no such variable; `volt env` lists the ones it "
            "reads.");
}

TEST(Env, TheTrainerWarnsOnceAboutUnknownVariablesAndListsTheSetOnes) {
  ScopedEnv typo("VOLT_LOG_HOST_SYNC", "1");
  ScopedEnv cache("VOLT_CACHE_DIR", "/tmp/volt-env-test");
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_steps(1));
  const auto first =
      volt_test::capture_logs([&] { trainer.fit(model, volt_test::loader(volt_test::blobs(32))); });
  EXPECT_TRUE(contains(first,
                       "[volt] warning: [env] VOLT_LOG_HOST_SYNC is set but volt reads no such "
                       "variable; did you mean VOLT_LOG_HOST_SYNCS?"))
      << ::testing::PrintToString(first);
  EXPECT_TRUE(contains(first, "[volt] info: [env] set: VOLT_CACHE_DIR=/tmp/volt-env-test"))
      << ::testing::PrintToString(first);
  // Once per process, not per entry point.
  const auto second =
      volt_test::capture_logs([&] { trainer.fit(model, volt_test::loader(volt_test::blobs(32))); });
  EXPECT_FALSE(contains(second, "[env]")) << ::testing::PrintToString(second);
}

TEST(GlobalBatch, FitLogsTheSamplesPerOptimizerStep) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto fit_lines = [&](volt::TrainerOptions opts) {
    volt::Trainer trainer(opts);
    return volt_test::capture_logs(
        [&] { trainer.fit(model, volt_test::loader(volt_test::blobs(64), 16)); });
  };
  auto lines = fit_lines(volt_test::quiet(dir.path).max_steps(1));
  EXPECT_TRUE(contains(lines,
                       "[volt] info: [Trainer] batch: 16 samples per process per "
                       "optimizer step"))
      << ::testing::PrintToString(lines);
  lines = fit_lines(volt_test::quiet(dir.path).max_steps(1).accumulate_grad_batches(4));
  EXPECT_TRUE(contains(lines,
                       "[volt] info: [Trainer] batch: 16 samples per process x 4 "
                       "accumulated batches = 64 samples per optimizer step"))
      << ::testing::PrintToString(lines);
  // 70 samples in batches of 16: the epoch ends with a batch of 6, and the line says so.
  {
    volt::Trainer trainer(volt_test::quiet(dir.path).max_steps(1));
    lines = volt_test::capture_logs(
        [&] { trainer.fit(model, volt_test::loader(volt_test::blobs(70), 16)); });
  }
  EXPECT_TRUE(contains(lines,
                       "[volt] info: [Trainer] batch: 16 samples per process per optimizer "
                       "step; the last batch of each epoch has 6 samples per process"))
      << ::testing::PrintToString(lines);
}

}  // namespace
