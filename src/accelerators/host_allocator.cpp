#include "volt/accelerators/host_allocator.h"

#include <dlfcn.h>

#include <limits>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "accelerators/detail/malloc_env.h"
#include "volt/core/check.h"
#include "volt/core/env.h"

namespace volt {

HostAllocator host_allocator() {
  // The symbol binding, not /proc/self/maps: a mapped library is only loaded, while the object
  // that defines the `malloc` every caller resolves (LD_PRELOAD comes first in that search) is
  // the one serving the calls.
  HostAllocator a{"other", ""};
  Dl_info info{};
  void* malloc_fn = ::dlsym(RTLD_DEFAULT, "malloc");
  if (malloc_fn != nullptr && ::dladdr(malloc_fn, &info) != 0 && info.dli_fname != nullptr) {
    a.library = info.dli_fname;
  }
  const std::string base = a.library.substr(a.library.find_last_of('/') + 1);
  if (base.rfind("libjemalloc", 0) == 0) {
    a.name = "jemalloc";
  } else if (base.rfind("libtcmalloc", 0) == 0) {
    a.name = "tcmalloc";
  } else if (base.rfind("libc.so", 0) == 0 || base.rfind("libc-", 0) == 0) {
    a.name = "default";
  }
  return a;
}

std::string describe(const HostAllocator& a) {
  std::string line = "host allocator: " + a.name;
  if (!a.library.empty()) line += " (" + a.library + ")";
  if (a.name == "default") {
    line += "; to try jemalloc or tcmalloc: scripts/with_allocator.sh (docs/PERFORMANCE.md)";
  }
  return line;
}

namespace detail {

std::string malloc_configured_by(
    const std::function<std::optional<std::string>(const std::string&)>& env) {
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                           "MALLOC_MMAP_MAX_"}) {
    if (env(name)) return name;
  }
  const std::optional<std::string> tunables = env("GLIBC_TUNABLES");
  if (tunables && tunables->find("glibc.malloc.") != std::string::npos) return "GLIBC_TUNABLES";
  return "";
}

}  // namespace detail

namespace {

std::string mib(size_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

HostMemoryReuse reuse(size_t mmap_threshold, size_t trim_threshold) {
  const HostAllocator a = host_allocator();
  if (a.name != "default") {
    return {false, "host memory reuse: left to the " + a.name +
                       " allocator (volt tunes only the C library's malloc)"};
  }
  const std::string by = detail::malloc_configured_by(&env_value);
  if (!by.empty()) {
    return {false, "host memory reuse: left to the environment (" + by +
                       " configures malloc's thresholds)"};
  }
#if defined(__GLIBC__)
  if (::mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) == 1 &&
      ::mallopt(M_TRIM_THRESHOLD, static_cast<int>(trim_threshold)) == 1) {
    return {true, "host memory reuse: malloc keeps freed blocks up to " + mib(mmap_threshold) +
                      " and up to " + mib(trim_threshold) +
                      " of free heap for reuse instead of returning them to the kernel every "
                      "step (reuse_host_memory=false keeps the C library's defaults)"};
  }
  return {false, "host memory reuse: mallopt refused the thresholds; malloc keeps its defaults"};
#else
  return {false, "host memory reuse: not a glibc malloc; nothing changed"};
#endif
}

}  // namespace

HostMemoryReuse reuse_freed_host_memory(size_t mmap_threshold, size_t trim_threshold) {
  constexpr auto kMax = static_cast<size_t>(std::numeric_limits<int>::max());
  VOLT_CHECK(mmap_threshold <= kMax && trim_threshold <= kMax, ValueError,
             "[HostAllocator] mmap_threshold=", mmap_threshold,
             " and trim_threshold=", trim_threshold, " must each be at most ", kMax,
             " bytes (mallopt takes an int); pass smaller thresholds.");
  static std::once_flag once;
  static HostMemoryReuse result;
  std::call_once(once, [&] { result = reuse(mmap_threshold, trim_threshold); });
  return result;
}

}  // namespace volt
