// The component registry: parameter declarations, typed reads, built-ins, suggestions.

#include <gtest/gtest.h>

#include <volt/volt.h>

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
  // A name registered later is resolved by resolve_plan like a built-in.
  volt::registry().accelerators.add("zz_cpu_for_test", "test",
                                    [] { return std::make_shared<volt::CpuAccelerator>(); });
  auto plan = volt::resolve_plan("zz_cpu_for_test", -1, "auto", "32-true");
  EXPECT_EQ(plan.accelerator->name(), "cpu");
}

}  // namespace
