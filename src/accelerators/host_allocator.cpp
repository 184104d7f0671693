#include "volt/accelerators/host_allocator.h"

#include <dlfcn.h>

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

}  // namespace volt
