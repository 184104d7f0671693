#include <gtest/gtest.h>

#include <volt/volt.h>

namespace {

TEST(Check, ThrowsTypedErrorWithMessage) {
  try {
    VOLT_CHECK(1 + 1 == 3, volt::ConfigError, "[Unit] value=", 2, "; fix it.");
    FAIL() << "no throw";
  } catch (const volt::ConfigError& e) {
    EXPECT_STREQ(e.what(), "[Unit] value=2; fix it.");
  }
}

TEST(Check, AssertIsInternalError) {
  EXPECT_THROW(VOLT_ASSERT(false, "broken"), volt::InternalError);
  try {
    VOLT_ASSERT(2 < 1);
  } catch (const volt::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("2 < 1"), std::string::npos);
  }
}

TEST(Check, AllErrorsDeriveFromVoltError) {
  EXPECT_THROW(throw volt::NotAvailable("x"), volt::Error);
  EXPECT_THROW(throw volt::CheckpointError("x"), volt::Error);
  EXPECT_THROW(throw volt::DataError("x"), volt::Error);
  EXPECT_THROW(throw volt::DistributedError("x"), volt::Error);
  EXPECT_THROW(throw volt::ValueError("x"), std::runtime_error);
}

TEST(Limit, CountsAndFractions) {
  EXPECT_EQ(volt::Limit(5).resolve(100), 5);
  EXPECT_EQ(volt::Limit(500).resolve(100), 100);
  EXPECT_EQ(volt::Limit(0.25).resolve(100), 25);
  EXPECT_EQ(volt::Limit(0.001).resolve(100), 1);  // a non-zero fraction runs >= 1 batch
  EXPECT_EQ(volt::Limit(0.0).resolve(100), 0);
  EXPECT_EQ(volt::Limit(1.0).resolve(7), 7);
}

TEST(Limit, RejectsInvalid) {
  EXPECT_THROW(volt::Limit(1.5).validate("limit_train_batches"), volt::ConfigError);
  EXPECT_THROW(volt::Limit(-1).validate("limit_val_batches"), volt::ConfigError);
  try {
    volt::Limit(1.5).validate("limit_train_batches");
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("limit_train_batches=1.5"), std::string::npos);
  }
}

}  // namespace
