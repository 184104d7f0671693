// The counting CPU allocator: exact deltas for tensors of known size, frees routed back through
// it, thread-safe counts, peaks and their reset, and the reference's ten metric names.

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <thread>

#include "tiny.h"

namespace {

volt::CpuMemoryStats fresh() {
  volt::install_counting_cpu_allocator();
  return volt::cpu_memory_stats();
}

TEST(CpuMemory, ATensorOfKnownSizeMovesEveryCounterExactly) {
  const auto before = fresh();
  EXPECT_TRUE(volt::counting_cpu_allocator_installed());
  auto t = torch::empty({1000}, torch::kFloat);  // 4000 bytes
  const auto during = volt::cpu_memory_stats();
  EXPECT_EQ(during.in_use - before.in_use, 4000);
  EXPECT_EQ(during.num_allocs - before.num_allocs, 1);
  EXPECT_EQ(during.num_frees - before.num_frees, 0);
  EXPECT_EQ(during.active_allocs - before.active_allocs, 1);
  EXPECT_GE(during.max_in_use, during.in_use);
  EXPECT_GE(during.max_alloc_size, 4000);
  // The data is usable and aligned like libtorch's own allocator (64 bytes).
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
  t.fill_(2.0f);
  EXPECT_EQ(t.sum().item<float>(), 2000.0f);
  t = torch::Tensor();  // the free comes back through the counting deleter
  const auto after = volt::cpu_memory_stats();
  EXPECT_EQ(after.num_frees - before.num_frees, 2);  // the tensor and sum()'s result
  EXPECT_EQ(after.num_allocs - before.num_allocs, 2);
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_EQ(after.active_allocs, before.active_allocs);
  // No caching layer on the CPU: the system counts equal the allocation counts.
  EXPECT_EQ(after.total_system_allocs, after.num_allocs);
  EXPECT_EQ(after.total_system_frees, after.num_frees);
  EXPECT_EQ(after.total_active_allocs, after.active_allocs);
  EXPECT_GT(after.limit, 0);
}

TEST(CpuMemory, SeveralTensorsAndEmptyOnes) {
  const auto before = fresh();
  {
    auto a = torch::empty({10, 10}, torch::kDouble);  // 800 bytes
    auto b = torch::empty({3}, torch::kLong);         // 24 bytes
    auto c = torch::empty({0}, torch::kFloat);        // no memory: not counted
    auto d = torch::empty({7}, torch::kUInt8);        // 7 bytes
    const auto s = volt::cpu_memory_stats();
    EXPECT_EQ(s.in_use - before.in_use, 831);
    EXPECT_EQ(s.num_allocs - before.num_allocs, 3);
    EXPECT_EQ(s.active_allocs - before.active_allocs, 3);
  }
  const auto after = volt::cpu_memory_stats();
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_EQ(after.num_frees - before.num_frees, 3);
}

TEST(CpuMemory, RawAllocateAndDeallocateAreCounted) {
  const auto before = fresh();
  c10::Allocator* alloc = c10::GetCPUAllocator();
  void* p = alloc->raw_allocate(123);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(volt::cpu_memory_stats().in_use - before.in_use, 123);
  alloc->raw_deallocate(p);
  EXPECT_EQ(volt::cpu_memory_stats().in_use, before.in_use);
  EXPECT_EQ(volt::cpu_memory_stats().num_frees - before.num_frees, 1);
}

TEST(CpuMemory, CountsFromManyThreadsAreExact) {
  const auto before = fresh();
  constexpr int kThreads = 4, kTensors = 500;
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([] {
      for (int i = 0; i < kTensors; ++i) {
        auto x = torch::empty({32}, torch::kFloat);  // 128 bytes, freed at once
      }
    });
  }
  for (auto& th : pool) th.join();
  const auto after = volt::cpu_memory_stats();
  EXPECT_EQ(after.num_allocs - before.num_allocs, kThreads * kTensors);
  EXPECT_EQ(after.num_frees - before.num_frees, kThreads * kTensors);
  EXPECT_EQ(after.in_use, before.in_use);
}

TEST(CpuMemory, PeaksTrackTheHighWaterMarkAndReset) {
  fresh();
  volt::reset_cpu_memory_peaks();
  const auto base = volt::cpu_memory_stats();
  EXPECT_EQ(base.max_in_use, base.in_use);
  EXPECT_EQ(base.max_alloc_size, 0);
  {
    auto big = torch::empty({1 << 18}, torch::kFloat);  // 1 MiB
    auto small = torch::empty({25}, torch::kFloat);     // 100 bytes
  }
  auto s = volt::cpu_memory_stats();
  EXPECT_EQ(s.max_in_use - base.in_use, (1 << 20) + 100);
  EXPECT_EQ(s.max_alloc_size, 1 << 20);
  EXPECT_EQ(s.in_use, base.in_use);
  volt::reset_cpu_memory_peaks();
  auto small = torch::empty({25}, torch::kFloat);
  s = volt::cpu_memory_stats();
  EXPECT_EQ(s.max_alloc_size, 100);
  EXPECT_EQ(s.max_in_use, s.in_use);
}

TEST(CpuMemory, MetricsUseTheReferenceNames) {
  const auto m = fresh().to_metrics();
  for (const char* k :
       {"Limit", "InUse", "MaxInUse", "NumAllocs", "NumFrees", "ActiveAllocs", "MaxAllocSize",
        "TotalSystemAllocs", "TotalSystemFrees", "TotalActiveAllocs"}) {
    EXPECT_EQ(m.count(k), 1u) << k;
  }
  EXPECT_EQ(m.size(), 10u);
  // The accelerator hands out the same metrics.
  const auto acc = volt::CpuAccelerator().device_stats();
  EXPECT_EQ(acc.size(), 10u);
  EXPECT_EQ(acc.at("Limit"), m.at("Limit"));
}

}  // namespace

namespace {

TEST(CpuMemory, ALimitRefusesTheAllocationThatWouldCrossItAndCountsNothingForIt) {
  const auto before = fresh();
  volt::set_cpu_memory_limit(before.in_use + (1 << 20));  // 1 MiB more than is alive now
  EXPECT_EQ(volt::cpu_memory_limit(), before.in_use + (1 << 20));
  auto fits = torch::empty({1 << 17}, torch::kFloat);  // 512 KiB
  try {
    auto too_much = torch::empty({1 << 17}, torch::kFloat);  // another 512 KiB: over by 0
    auto over = torch::empty({1}, torch::kFloat);            // 4 bytes over
    ADD_FAILURE() << "an allocation above the limit was served";
  } catch (const c10::OutOfMemoryError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("can't allocate memory: 4 bytes would take CPU tensor memory to"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("set_cpu_memory_limit()"), std::string::npos) << what;
  }
  // The refused bytes were given back: after the frees in_use is where it was.
  fits = torch::Tensor();
  EXPECT_EQ(volt::cpu_memory_stats().in_use, before.in_use);
  // A failure of the system allocator below gives its bytes back too.
  volt::set_cpu_memory_limit(0);
  EXPECT_EQ(volt::cpu_memory_limit(), 0);
#if !defined(__SANITIZE_ADDRESS__)  // ASan aborts on a 1 PiB request instead of failing it
  EXPECT_THROW(torch::empty({int64_t{1} << 48}, torch::kFloat), c10::Error);
  EXPECT_EQ(volt::cpu_memory_stats().in_use, before.in_use);
#endif
  // Without a limit anything goes; a negative one is a ConfigError.
  auto big = torch::empty({1 << 20}, torch::kFloat);
  EXPECT_THROW(volt::set_cpu_memory_limit(-1), volt::ConfigError);
}

}  // namespace
