// Compiled only into sanitized builds (VOLT_SANITIZE): proves that the sanitizer of this build is
// really active, so that a clean suite means "checked and clean", not "never checked". Each
// defect runs in a death-test child and must be reported there.

#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <thread>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define VOLT_CANARY_ADDRESS 1
#endif
#if __has_feature(thread_sanitizer)
#define VOLT_CANARY_THREAD 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define VOLT_CANARY_ADDRESS 1
#endif
#if defined(__SANITIZE_THREAD__)
#define VOLT_CANARY_THREAD 1
#endif

namespace {

// volatile: the optimiser must neither prove the defects away nor fold them.
volatile int g_index = 4;
volatile float g_nan = std::numeric_limits<float>::quiet_NaN();

class SanitizerCanary : public ::testing::Test {
 protected:
  // libtorch's thread pools may be running: re-execute instead of a plain fork().
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

#if defined(VOLT_CANARY_ADDRESS)
TEST_F(SanitizerCanary, AsanReportsAHeapOverflow) {
  // malloc of a size the compiler cannot see, so that UBSan's object-size check stays out of it.
  EXPECT_DEATH(
      {
        char* p = static_cast<char*>(std::malloc(g_index));
        p[g_index] = 1;  // one past the end
        std::free(p);
      },
      "AddressSanitizer: heap-buffer-overflow");
}

TEST_F(SanitizerCanary, UbsanReportsANanToIntConversion) {
  // The class of the fused attention kernel's exp bug (docs/HARDENING.md).
  EXPECT_DEATH(
      {
        volatile int i = static_cast<int>(g_nan);
        (void)i;
      },
      "runtime error: .* is outside the range of representable values");
}

TEST_F(SanitizerCanary, LsanReportsALeakAtExit) {
  // LeakSanitizer runs at exit and turns the exit status into a failure.
  EXPECT_DEATH(
      {
        void* volatile p = std::malloc(1234);
        p = nullptr;
        std::exit(0);
      },
      "LeakSanitizer: detected memory leaks");
}
#endif

#if defined(VOLT_CANARY_THREAD)
TEST_F(SanitizerCanary, TsanReportsADataRace) {
  // TSan reports at once (halt_on_error=1) or turns the exit status into 66 at exit.
  EXPECT_DEATH(
      {
        int counter = 0;
        std::thread a([&] {
          for (int i = 0; i < 1000; ++i) ++counter;
        });
        std::thread b([&] {
          for (int i = 0; i < 1000; ++i) ++counter;
        });
        a.join();
        b.join();
        std::exit(counter > 0 ? 0 : 1);
      },
      "ThreadSanitizer: data race");
}
#endif

#if !defined(VOLT_CANARY_ADDRESS) && !defined(VOLT_CANARY_THREAD)
TEST(SanitizerCanary, BuildIsSanitized) {
  FAIL() << "tests/sanitizers/canary.cpp is compiled only with VOLT_SANITIZE, but this "
            "translation unit has no sanitizer enabled; check the VOLT_SANITIZE flags in "
            "CMakeLists.txt.";
}
#endif

}  // namespace
