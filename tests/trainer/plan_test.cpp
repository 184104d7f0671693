#include <gtest/gtest.h>

#include <volt/volt.h>

namespace {

TEST(ResolvePlan, AutoPicksCpuWithoutCuda) {
  if (volt::CudaAccelerator::available()) GTEST_SKIP() << "a GPU is present";
  auto plan = volt::resolve_plan("auto", -1, "auto", "32-true");
  EXPECT_EQ(plan.accelerator->name(), "cpu");
  EXPECT_EQ(plan.devices, 1);
  EXPECT_EQ(plan.strategy->name(), "single_device");
  EXPECT_EQ(plan.precision->name(), "32-true");
  EXPECT_TRUE(plan.strategy->root_device().is_cpu());
}

TEST(ResolvePlan, TypedObjectsPassThrough) {
  auto prec = std::make_shared<volt::Fp32Precision>();
  auto plan =
      volt::resolve_plan(std::make_shared<volt::CpuAccelerator>(), 1, "single_device", prec);
  EXPECT_EQ(plan.precision.get(), prec.get());
  EXPECT_EQ(plan.accelerator->name(), "cpu");
}

TEST(ResolvePlan, UnknownNamesListValidOnes) {
  try {
    volt::resolve_plan("tpu", -1, "auto", "32-true");
    FAIL();
  } catch (const volt::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unknown accelerator \"tpu\""), std::string::npos) << m;
    EXPECT_NE(m.find("\"cpu\""), std::string::npos) << m;
  }
  EXPECT_THROW(volt::resolve_plan("cpu", -1, "fsdp", "32-true"), volt::ConfigError);
  EXPECT_THROW(volt::resolve_plan("cpu", -1, "auto", "bf16-maybe"), volt::ConfigError);
}

TEST(ResolvePlan, CudaWithoutCudaIsNotAvailable) {
  if (volt::CudaAccelerator::available()) GTEST_SKIP() << "a GPU is present";
  try {
    volt::resolve_plan("cuda", -1, "auto", "32-true");
    FAIL();
  } catch (const volt::NotAvailable& e) {
    EXPECT_NE(std::string(e.what()).find("[CudaAccelerator]"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("accelerator=\"cpu\""), std::string::npos);
  }
}

// Lightning's accelerator="gpu" is CUDA: the CUDA accelerator where a GPU is, its NotAvailable
// (naming the CPU as the fix) where none is.
TEST(ResolvePlan, GpuIsLightningsNameForCuda) {
  if (volt::CudaAccelerator::available()) {
    EXPECT_EQ(volt::resolve_plan("gpu", 1, "auto", "32-true").accelerator->name(), "cuda");
    return;
  }
  try {
    volt::resolve_plan("gpu", -1, "auto", "32-true");
    FAIL();
  } catch (const volt::NotAvailable& e) {
    EXPECT_NE(std::string(e.what()).find("[CudaAccelerator]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("accelerator=\"cpu\""), std::string::npos) << e.what();
  }
}

TEST(ResolvePlan, BadDeviceCounts) {
  EXPECT_THROW(volt::resolve_plan("cpu", 0, "auto", "32-true"), volt::ConfigError);
  EXPECT_THROW(volt::resolve_plan("cpu", 1, "auto", "32-true", 0), volt::ConfigError);
  try {
    volt::resolve_plan("cpu", 2, "single_device", "32-true");
    FAIL();
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("use strategy \"ddp\""), std::string::npos) << e.what();
  }
}

}  // namespace
