// The component registry: parameter declarations, typed reads, built-ins, suggestions.

#include <gtest/gtest.h>

#include <chrono>

#include <volt/strategies/deepspeed.h>
#include <volt/volt.h>

#include "requires.h"

namespace {

TEST(Registry, ParamsRejectBadDeclarationsAndArgsCatchWrongReads) {
  EXPECT_THROW(volt::Params().add("a", 1.0, "").add("a", 2.0, ""), volt::ConfigError);
  EXPECT_THROW(volt::Params().add("a.b", 1.0, ""), volt::ConfigError);
  EXPECT_THROW(volt::Params().choice("m", "mid", {"min", "max"}, ""), volt::ConfigError);
  auto args = volt::default_args("model X", volt::Params().add("lr", 0.1, ""));
  try {
    args.get<int64_t>("lr");
    FAIL();
  } catch (const volt::InternalError& e) {
    EXPECT_NE(
        std::string(e.what()).find("model X reads parameter \"lr\" as int but it holds float"),
        std::string::npos);
  }
  EXPECT_THROW(args.get<double>("nope"), volt::InternalError);
  EXPECT_THROW(volt::default_args("model X", volt::Params().required<int64_t>("w", "")),
               volt::ConfigError);
}

TEST(Registry, BuiltInsResolveAndUnknownNamesSuggest) {
  auto& r = volt::registry();
  for (const char* n : {"cpu", "cuda"}) EXPECT_TRUE(r.accelerators.contains(n));
  EXPECT_TRUE(r.strategies.contains("single_device"));
  EXPECT_TRUE(r.precisions.contains("32-true"));
  for (const char* n : {"ModelCheckpoint", "EarlyStopping", "LearningRateMonitor", "Timer"}) {
    EXPECT_TRUE(r.callbacks.contains(n)) << n;
  }
  EXPECT_TRUE(r.loggers.contains("CSVLogger"));
  EXPECT_TRUE(r.loggers.contains("TensorBoardLogger"));
  try {
    r.callbacks.at("ModelChekpoint");
    FAIL();
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean \"ModelCheckpoint\"?"), std::string::npos);
  }
  EXPECT_EQ(volt::closest_match("Mlp", {"MlpClassifier", "CnnClassifier"}), "MlpClassifier");
  EXPECT_EQ(volt::closest_match("zzz", {"MlpClassifier", "CnnClassifier"}), "");
  {
    // A word of 40 MB (a pasted value, a hostile config) is no typo: comparing it with each
    // candidate cost its length times theirs (about 20 s for these two before).
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(volt::closest_match(std::string(40 << 20, 'M'), {"MlpClassifier", "CnnClassifier"}),
              "");
    EXPECT_EQ(volt::closest_match(std::string(256, 'M') + "lp", {std::string(256, 'M') + "l"}),
              "");  // 258 characters: past the longest word suggested for
    EXPECT_EQ(volt::closest_match(std::string(250, 'M') + "lp", {std::string(250, 'M') + "l"}),
              std::string(250, 'M') + "l");
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(secs, 1.0);
  }
  // A name registered later is resolved by resolve_plan like a built-in.
  volt::registry().accelerators.add("zz_cpu_for_test", "test",
                                    [] { return std::make_shared<volt::CpuAccelerator>(); });
  auto plan = volt::resolve_plan("zz_cpu_for_test", -1, "auto", "32-true");
  EXPECT_EQ(plan.accelerator->name(), "cpu");
}

TEST(Registry, ANameWithSomeParametersKeepsTheOtherDefaultsAndChecksWhatItGets) {
  const auto params = volt::Params()
                          .add("lr", 0.1, "")
                          .add("steps", int64_t{3}, "")
                          .choice("mode", "min", {"min", "max"}, "")
                          .optional<int64_t>("cap", "");
  auto args = [](std::map<std::string, volt::ParamValue> v) { return volt::Args("given", v); };
  const auto full = volt::complete_args("model X", params, args({{"steps", int64_t{7}}}));
  EXPECT_EQ(full.get<int64_t>("steps"), 7);
  EXPECT_DOUBLE_EQ(full.get<double>("lr"), 0.1);  // defaults fill the rest
  EXPECT_EQ(full.get<std::string>("mode"), "min");
  EXPECT_FALSE(full.get_optional<int64_t>("cap").has_value());
  EXPECT_EQ(full.owner(), "model X");
  // An int passes for a float (C++ literals), and none for a nullable parameter.
  EXPECT_DOUBLE_EQ(
      volt::complete_args("model X", params, args({{"lr", int64_t{2}}})).get<double>("lr"), 2.0);
  EXPECT_NO_THROW(volt::complete_args("model X", params, args({{"cap", std::monostate{}}})));
  auto expect_error = [&](std::map<std::string, volt::ParamValue> v, const std::string& text) {
    try {
      volt::complete_args("model X", params, args(v));
      FAIL() << "accepted; expected: " << text;
    } catch (const volt::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error({{"step", int64_t{1}}},
               "model X has no parameter \"step\" (did you mean \"steps\"?)");
  expect_error({{"steps", 1.5}}, "parameter \"steps\" is int but was given float");
  expect_error({{"mode", std::string("mid")}}, "parameter \"mode\" is \"mid\"; valid values");
  expect_error({{"lr", std::monostate{}}}, "parameter \"lr\" cannot be none");
  EXPECT_THROW(volt::complete_args("model X", volt::Params().required<int64_t>("w", ""), args({})),
               volt::ConfigError);
  // Through the Trainer's plan, as volt::named builds it: ZeRO stage 3 with one setting changed
  // (on the CPU its process group is Gloo's, which the CUDA wheels lack).
  if (!volt_test::gloo()) return;
  auto plan =
      volt::resolve_plan("cpu", 1,
                         volt::named<volt::Strategy>("deepspeed_stage_3",
                                                     {{"param_persistence_threshold", int64_t{0}}}),
                         "32-true");
  auto* ds = dynamic_cast<volt::DeepSpeedStrategy*>(plan.strategy.get());
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->deepspeed_options().stage(), 3);
  EXPECT_EQ(ds->deepspeed_options().param_persistence_threshold(), 0);
  EXPECT_EQ(ds->deepspeed_options().reduce_bucket_size(),
            volt::DeepSpeedStrategyOptions().reduce_bucket_size());
  EXPECT_THROW(volt::resolve_plan("cpu", 1,
                                  volt::named<volt::Strategy>(
                                      "deepspeed_stage_3", {{"param_persistance_threshold", 0.0}}),
                                  "32-true"),
               volt::ConfigError);
}

}  // namespace
