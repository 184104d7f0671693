#include "volt/accelerators/cpu_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "core/detail/numbers.h"
#include "detail/cgroup_memory.h"
#include "volt/core/check.h"
#include "volt/core/version.h"

namespace volt {
namespace {

// Each allocation carries a 64-byte header in front of the data: the requested size and the
// wrapped allocator's context and deleter, so a free needs no lookup table and no lock, and the
// data keeps the 64-byte alignment libtorch's default allocator gives.
constexpr size_t kHeader = 64;
struct Header {
  uint64_t size;
  void* wrapped_ctx;
  c10::DeleterFnPtr wrapped_deleter;
};
static_assert(sizeof(Header) <= kHeader, "header must fit in front of the data");

struct Counters {
  std::atomic<int64_t> in_use{0}, max_in_use{0}, num_allocs{0}, num_frees{0}, max_alloc{0};
  std::atomic<int64_t> cap{0};  // set_cpu_memory_limit; 0 = none
};
Counters& counters() {
  static Counters c;
  return c;
}

void raise_to(std::atomic<int64_t>& target, int64_t v) {
  int64_t cur = target.load(std::memory_order_relaxed);
  while (v > cur && !target.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

void counting_free(void* data) {
  if (data == nullptr) return;
  auto* h = reinterpret_cast<Header*>(static_cast<char*>(data) - kHeader);
  Counters& c = counters();
  c.in_use.fetch_sub(static_cast<int64_t>(h->size), std::memory_order_relaxed);
  c.num_frees.fetch_add(1, std::memory_order_relaxed);
  // Copy out before handing the block back: the header lives inside it.
  const c10::DeleterFnPtr deleter = h->wrapped_deleter;
  void* ctx = h->wrapped_ctx;
  if (deleter != nullptr) deleter(ctx);
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}

#if VOLT_TORCH_AT_LEAST(2, 3)
  // libtorch 2.3 made allocate() non-const and copy_data() pure virtual.
  c10::DataPtr allocate(size_t n) override {
#else
  c10::DataPtr allocate(size_t n) const override {
#endif
    // Zero-byte storages (empty tensors) hold no memory: not counted, as in the wrapped one.
    if (n == 0) return wrapped_->allocate(0);
    Counters& c = counters();
    // The bytes are counted before the block is taken, so that concurrent allocations cannot
    // pass a cap together; a refused or failed allocation gives them back.
    const int64_t bytes = static_cast<int64_t>(n);
    const int64_t now = c.in_use.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    const int64_t cap = c.cap.load(std::memory_order_relaxed);
    if (cap > 0 && now > cap) {
      c.in_use.fetch_sub(bytes, std::memory_order_relaxed);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "[CpuMemory] can't allocate memory: ", n,
                       " bytes would take CPU tensor memory to ", now,
                       " bytes, above the limit of ", cap,
                       " bytes that set_cpu_memory_limit() set.");
    }
    c10::DataPtr inner;
    try {
      inner = wrapped_->allocate(n + kHeader);
    } catch (...) {
      c.in_use.fetch_sub(bytes, std::memory_order_relaxed);
      throw;
    }
    char* base = static_cast<char*>(inner.get());
    auto* h = reinterpret_cast<Header*>(base);
    h->size = n;
    h->wrapped_deleter = inner.get_deleter();
    h->wrapped_ctx = inner.release_context();
    const c10::Device device = inner.device();
    c.num_allocs.fetch_add(1, std::memory_order_relaxed);
    raise_to(c.max_in_use, now);
    raise_to(c.max_alloc, static_cast<int64_t>(n));
    void* data = base + kHeader;
    // context == data, so raw_deleter() works (Allocator::raw_allocate checks it).
    return {data, data, &counting_free, device};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &counting_free;
  }
#if VOLT_TORCH_AT_LEAST(2, 3)
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

 private:
  c10::Allocator* wrapped_;
};

int64_t memory_limit() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  int64_t limit = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
  // A container's memory limit is what the process can really use.
  auto in = detail::c_stream<std::ifstream>("/proc/self/cgroup");
  auto text = detail::c_stream<std::stringstream>();
  text << in.rdbuf();
  const int64_t l = detail::cgroup_memory_limit("/sys/fs/cgroup", text.str());
  if (l > 0 && (limit == 0 || l < limit)) limit = l;
  return limit;
}

std::mutex& install_mutex() {
  static std::mutex m;
  return m;
}
std::atomic<bool> g_installed{false};

}  // namespace

void install_counting_cpu_allocator() {
  if (g_installed.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(install_mutex());
  if (g_installed.load(std::memory_order_relaxed)) return;
  c10::Allocator* previous = c10::GetCPUAllocator();
  // Never destroyed: tensors it allocated may outlive any owner, and their frees come back here.
  static CountingAllocator* counting = new CountingAllocator(previous);
  // Priority 1 beats libtorch's default (0), and a later default-priority set cannot silently
  // replace it and break the counts.
  c10::SetCPUAllocator(counting, /*priority=*/1);
  VOLT_CHECK(c10::GetCPUAllocator() == counting, NotAvailable,
             "[CpuMemoryStats] another CPU allocator with a higher priority is installed, so "
             "volt cannot count CPU memory; drop DeviceStatsMonitor or that allocator.");
  g_installed.store(true, std::memory_order_release);
}

bool counting_cpu_allocator_installed() {
  return g_installed.load(std::memory_order_acquire);
}

CpuMemoryStats cpu_memory_stats() {
  static const int64_t limit = memory_limit();
  const Counters& c = counters();
  CpuMemoryStats s;
  s.limit = limit;
  s.in_use = c.in_use.load(std::memory_order_relaxed);
  s.max_in_use = c.max_in_use.load(std::memory_order_relaxed);
  s.num_frees = c.num_frees.load(std::memory_order_relaxed);
  s.num_allocs = c.num_allocs.load(std::memory_order_relaxed);
  s.active_allocs = s.num_allocs - s.num_frees;
  s.max_alloc_size = c.max_alloc.load(std::memory_order_relaxed);
  // Nothing is cached between libtorch and the system allocator on the CPU: every tensor
  // allocation is one system allocation.
  s.total_system_allocs = s.num_allocs;
  s.total_system_frees = s.num_frees;
  s.total_active_allocs = s.active_allocs;
  return s;
}

void reset_cpu_memory_peaks() {
  Counters& c = counters();
  c.max_in_use.store(c.in_use.load(std::memory_order_relaxed), std::memory_order_relaxed);
  c.max_alloc.store(0, std::memory_order_relaxed);
}

void set_cpu_memory_limit(int64_t bytes) {
  VOLT_CHECK(bytes >= 0, ConfigError, "[CpuMemory] set_cpu_memory_limit(", bytes,
             "): the limit must be >= 0 bytes (0 = no limit).");
  if (bytes > 0) install_counting_cpu_allocator();
  counters().cap.store(bytes, std::memory_order_relaxed);
}

int64_t cpu_memory_limit() {
  return counters().cap.load(std::memory_order_relaxed);
}

std::map<std::string, double> CpuMemoryStats::to_metrics() const {
  return {{"Limit", static_cast<double>(limit)},
          {"InUse", static_cast<double>(in_use)},
          {"MaxInUse", static_cast<double>(max_in_use)},
          {"NumAllocs", static_cast<double>(num_allocs)},
          {"NumFrees", static_cast<double>(num_frees)},
          {"ActiveAllocs", static_cast<double>(active_allocs)},
          {"MaxAllocSize", static_cast<double>(max_alloc_size)},
          {"TotalSystemAllocs", static_cast<double>(total_system_allocs)},
          {"TotalSystemFrees", static_cast<double>(total_system_frees)},
          {"TotalActiveAllocs", static_cast<double>(total_active_allocs)}};
}

}  // namespace volt
