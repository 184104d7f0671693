// AutocastGuard, autocast_forward and the user op lists (LOWER_LIST / FP32_LIST): the dtype each
// op really produced, on real tensors through the real dispatcher.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include <volt/volt.h>

#include <cstdlib>
#include <fstream>

#include "error_text.h"
#include "tiny.h"

namespace {

at::Tensor a() {
  return torch::randn({4, 8});
}
at::Tensor b() {
  return torch::randn({8, 3});
}

using volt_test::error_of;

}  // namespace

TEST(Autocast, GuardLowersMatmulsAndRestoresTheStateItFound) {
  EXPECT_FALSE(volt::AutocastGuard::is_enabled(c10::kCPU));
  EXPECT_EQ(torch::mm(a(), b()).scalar_type(), at::kFloat);
  {
    volt::AutocastGuard bf16(c10::kCPU);
    EXPECT_TRUE(volt::AutocastGuard::is_enabled(c10::kCPU));
    EXPECT_EQ(torch::mm(a(), b()).scalar_type(), at::kBFloat16);
    {
      volt::AutocastGuard island(c10::kCPU, at::kBFloat16, /*enabled=*/false);
      EXPECT_FALSE(volt::AutocastGuard::is_enabled(c10::kCPU));
      EXPECT_EQ(torch::mm(a(), b()).scalar_type(), at::kFloat);
    }
    EXPECT_TRUE(volt::AutocastGuard::is_enabled(c10::kCPU));
    EXPECT_EQ(torch::mm(a(), b()).scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(volt::AutocastGuard::is_enabled(c10::kCPU));
  EXPECT_EQ(torch::mm(a(), b()).scalar_type(), at::kFloat);
}

TEST(Autocast, GradientsOfFp32LeavesStayFp32) {
  auto w = torch::randn({8, 3}, torch::requires_grad());
  {
    volt::AutocastGuard bf16(c10::kCPU);
    torch::mm(a(), w).sum().backward();
  }
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
}

TEST(Autocast, DecoratorFormRunsTheCallableUnderAutocast) {
  torch::nn::Linear lin(8, 3);
  auto fwd = volt::autocast_forward(c10::kCPU, at::kBFloat16,
                                    [&](const at::Tensor& x) { return lin->forward(x); });
  EXPECT_EQ(fwd(a()).scalar_type(), at::kBFloat16);
  EXPECT_EQ(lin->forward(a()).scalar_type(), at::kFloat);
  EXPECT_FALSE(volt::AutocastGuard::is_enabled(c10::kCPU));
}

TEST(Autocast, UnsupportedDevicesAndDtypesAreTypedErrors) {
  EXPECT_THROW(volt::AutocastGuard(c10::kCPU, at::kFloat), volt::ConfigError);
  EXPECT_THROW(volt::AutocastGuard(c10::kMeta), volt::ConfigError);
  // Disabled too, as torch.autocast(device_type="meta", enabled=False) raises.
  EXPECT_THROW(volt::AutocastGuard(c10::kMeta, at::kBFloat16, /*enabled=*/false),
               volt::ConfigError);
  // A disabled guard needs no usable dtype or device: it switches autocast off.
  { volt::AutocastGuard off(c10::kCPU, at::kFloat, /*enabled=*/false); }
  { volt::AutocastGuard off(c10::kCUDA, at::kBFloat16, /*enabled=*/false); }
#if !VOLT_TORCH_AT_LEAST(2, 4)
  const auto msg = error_of([] { volt::AutocastGuard g(c10::kCPU, at::kHalf); });
  EXPECT_NE(msg.find("supports bf16 only"), std::string::npos) << msg;
#endif
  if (!torch::cuda::is_available()) {
    EXPECT_THROW(volt::AutocastGuard(c10::kCUDA), volt::NotAvailable);
  }
  // A failed guard leaves nothing behind.
  EXPECT_FALSE(volt::AutocastGuard::is_enabled(c10::kCPU));
}

// "mm" names every functional overload of aten::mm: "mm" alone in libtorch 1.13, "mm" and
// "mm.dtype" in 2.x.
static void expect_overloads_of_mm(const std::vector<std::string>& got) {
  EXPECT_NE(std::find(got.begin(), got.end(), "mm"), got.end());
  for (const auto& name : got) EXPECT_TRUE(name == "mm" || name.rfind("mm.", 0) == 0) << name;
}

TEST(AutocastOps, ListsOverrideTheBuiltInPolicyAndDestructionRestoresIt) {
  {
    volt::AutocastOpLists lists(c10::kCPU, at::kBFloat16, {"add.Tensor"}, {"mm"});
    EXPECT_EQ(lists.lower_overloads(), std::vector<std::string>{"add.Tensor"});
    expect_overloads_of_mm(lists.fp32_overloads());
    volt::AutocastGuard bf16(c10::kCPU);
    EXPECT_EQ(torch::mm(a(), b()).scalar_type(), at::kFloat);      // built-in: bf16
    EXPECT_EQ(torch::add(a(), a()).scalar_type(), at::kBFloat16);  // built-in: untouched
    // Autograd runs through the override kernels.
    auto w = torch::randn({4, 8}, torch::requires_grad());
    torch::add(w, a()).sum().backward();
    ASSERT_TRUE(w.grad().defined());
    EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
  }
  volt::AutocastGuard bf16(c10::kCPU);
  EXPECT_EQ(torch::mm(a(), b()).scalar_type(), at::kBFloat16);
  EXPECT_EQ(torch::add(a(), a()).scalar_type(), at::kFloat);
}

TEST(AutocastOps, ABareNameCoversEveryFunctionalOverload) {
  volt::AutocastOpLists lists(c10::kCPU, at::kBFloat16, {"aten::add"}, {});
  const auto& l = lists.lower_overloads();
  EXPECT_NE(std::find(l.begin(), l.end(), "add.Tensor"), l.end());
  EXPECT_NE(std::find(l.begin(), l.end(), "add.Scalar"), l.end());
  EXPECT_EQ(std::find(l.begin(), l.end(), "add.out"), l.end());  // mutable: skipped
  volt::AutocastGuard bf16(c10::kCPU);
  EXPECT_EQ(torch::add(a(), 1.5).scalar_type(), at::kBFloat16);
}

TEST(AutocastOps, BadNamesAreActionableErrors) {
  auto make = [](std::vector<std::string> lower, std::vector<std::string> fp32) {
    return error_of([&] { volt::AutocastOpLists l(c10::kCPU, at::kBFloat16, lower, fp32); });
  };
  auto msg = make({"matmull"}, {});
  EXPECT_NE(msg.find("unknown operator \"matmull\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean: matmul"), std::string::npos) << msg;
  {
    // A name of a million characters gets no suggestion: compared with each of the ~2,000
    // operators it cost its length times theirs (tens of seconds).
    const auto t0 = std::chrono::steady_clock::now();
    msg = make({std::string(1 << 20, 'm')}, {});
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(msg.find("check the spelling"), std::string::npos) << msg.substr(0, 200);
    EXPECT_LT(secs, 2.0);
  }
  msg = make({}, {"relu_"});
  EXPECT_NE(msg.find("functional ops only"), std::string::npos) << msg;
  EXPECT_NE(msg.find("use \"relu\""), std::string::npos) << msg;
  msg = make({"add.out"}, {});
  EXPECT_NE(msg.find("writes into its arguments"), std::string::npos) << msg;
  msg = make({"add.Bogus"}, {});
  EXPECT_NE(msg.find("no overload \"Bogus\""), std::string::npos) << msg;
  msg = make({"mm"}, {"mm"});
  EXPECT_NE(msg.find("in both"), std::string::npos) << msg;
  msg = make({"quantized::linear"}, {});
  EXPECT_NE(msg.find("only aten operators"), std::string::npos) << msg;
  // Nothing was left registered by the failed attempts.
  volt::AutocastGuard bf16(c10::kCPU);
  EXPECT_EQ(torch::mm(a(), b()).scalar_type(), at::kBFloat16);
}

TEST(AutocastOps, ListFilesAndTheReferenceEnvironmentVariables) {
  volt_test::TempDir dir;
  {
    std::ofstream f(dir / "lower.txt");
    f << "# ops to run in bf16\n\nadd.Tensor, sub.Tensor\n  mul.Tensor  # trailing comment\n";
  }
  EXPECT_EQ(volt::AutocastOpLists::read_list_file(dir / "lower.txt"),
            (std::vector<std::string>{"add.Tensor", "sub.Tensor", "mul.Tensor"}));
  auto msg = error_of([&] { volt::AutocastOpLists::read_list_file(dir / "missing.txt"); });
  EXPECT_NE(msg.find("cannot read the op-list file"), std::string::npos) << msg;

  {
    std::ofstream f(dir / "fp32.txt");
    f << "mm\n";
  }
  ::setenv("LOWER_LIST", (dir / "lower.txt").c_str(), 1);
  ::setenv("FP32_LIST", (dir / "fp32.txt").c_str(), 1);
  // cpu_policy off: this CPU's measured policy would add its own fp32 ops to the lists.
  volt::MixedPrecision p(
      volt::MixedPrecisionOptions().cpu_policy(false));  // reads both variables once, here
  ::unsetenv("LOWER_LIST");
  ::unsetenv("FP32_LIST");
  volt::MixedPrecision no_env(volt::MixedPrecisionOptions().read_env_lists(false));
  p.setup(torch::kCPU);
  ASSERT_NE(p.op_lists(), nullptr);
  EXPECT_EQ(p.op_lists()->lower_overloads().size(), 3u);
  expect_overloads_of_mm(p.op_lists()->fp32_overloads());
  {
    auto ctx = p.forward_context();
    EXPECT_EQ(torch::sub(a(), a()).scalar_type(), at::kBFloat16);
    EXPECT_EQ(torch::mm(a(), b()).scalar_type(), at::kFloat);
  }
  p.teardown();
  EXPECT_EQ(p.op_lists(), nullptr);
  auto ctx = p.forward_context();
  EXPECT_EQ(torch::mm(a(), b()).scalar_type(), at::kBFloat16);
}
