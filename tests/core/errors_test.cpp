#include <gtest/gtest.h>

#include <volt/volt.h>

#include <stdexcept>

#include "core/detail/out_of_memory.h"

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

// What scale_batch_size takes for running out of memory: Lightning's is_oom_error (any CUDA
// message saying out of memory, cuDNN's NOT_SUPPORTED, CPU allocation failures); the CUDA driver's
// form and cuDNN's were not, so the finder stopped with the error instead of trying smaller.
TEST(OutOfMemory, TheMessagesLightningTakesForOutOfMemory) {
  using volt::detail::is_out_of_memory;
  for (const char* oom : {"CUDA out of memory. Tried to allocate 2.00 GiB",
                          "CUDA error: out of memory", "CUDA driver error: out of memory",
                          "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if",
                          "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8"}) {
    EXPECT_TRUE(is_out_of_memory(std::runtime_error(oom))) << oom;
  }
  EXPECT_TRUE(is_out_of_memory(std::bad_alloc()));
  for (const char* other : {"CUDA error: an illegal memory access was encountered",
                            "out of memory budget for this test", "shape mismatch"}) {
    EXPECT_FALSE(is_out_of_memory(std::runtime_error(other))) << other;
  }
}

}  // namespace
