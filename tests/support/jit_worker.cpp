// A separate process for the kernel cache's multi-process tests (tests/kernels/).
//
//   volt_jit_worker kernel NAME          runs FusedElementwise NAME (GELU of x + bias) once,
//                                        checks it against reference(), waits for the cache
//                                        write, prints "compiles=C disk_hits=D memory_hits=M
//                                        fallbacks=F"
//   volt_jit_worker store DIR KEY BYTES  stores one entry through a KernelCache on DIR (1 MiB
//                                        cap) and waits for its write and eviction pass
//
// Exit 0 when it did that, 1 when a check failed. The cache folder of `kernel` comes from
// VOLT_KERNEL_CACHE_CONFIG, which the test sets.

#include <torch/torch.h>
#include <volt/kernels/fused_elementwise.h>
#include <volt/kernels/kernel_cache.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>

#include <csignal>
#include <cstdio>
#include <string>

namespace {

// Where an address is: "module(+offset) symbol", offsets for addr2line.
void describe(const char* what, uintptr_t addr) {
  Dl_info info{};
  if (addr != 0 && ::dladdr(reinterpret_cast<void*>(addr), &info) != 0 && info.dli_fname) {
    ::dprintf(2, "  %s %#lx = %s(+%#lx) %s\n", what, static_cast<unsigned long>(addr),
              info.dli_fname,
              static_cast<unsigned long>(addr - reinterpret_cast<uintptr_t>(info.dli_fbase)),
              info.dli_sname ? info.dli_sname : "");
  } else {
    ::dprintf(2, "  %s %#lx (no module)\n", what, static_cast<unsigned long>(addr));
  }
}

// A crash prints where it happened (the faulting instruction, the return address on top of
// the stack, the stack) before dying.
void on_fatal_signal(int sig, siginfo_t* si, void* context) {
  const auto* uc = static_cast<const ucontext_t*>(context);
  const auto rip = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  const auto rsp = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]);
  ::dprintf(2, "volt_jit_worker: signal %d, fault address %p\n", sig, si->si_addr);
  describe("pc", rip);
  for (int i = 0; i < 4; ++i) describe("stack word", reinterpret_cast<const uintptr_t*>(rsp)[i]);
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, 2);
  ::_exit(128 + sig);
}

}  // namespace

int main(int argc, char** argv) {
  struct sigaction sa {};
  sa.sa_sigaction = on_fatal_signal;
  sa.sa_flags = SA_SIGINFO;
  ::sigaction(SIGSEGV, &sa, nullptr);
  ::sigaction(SIGABRT, &sa, nullptr);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "kernel" && argc == 3) {
    using namespace volt::jit;  // NOLINT
    Expr y = input(0) + input(1);
    volt::FusedElementwise k(argv[2],
                             {0.5 * y * (1.0 + tanh(0.7978845608 * (y + 0.044715 * y * y * y)))});
    torch::manual_seed(0);
    const auto x = torch::randn({64, 32}), b = torch::randn({32});
    const auto got = k({x, b})[0], want = k.reference({x, b})[0];
    volt::KernelCache::global().flush();
    if (!torch::allclose(got, want, 1e-5, 1e-6)) {
      std::printf("mismatch\n");
      return 1;
    }
    const auto s = volt::jit::stats();
    std::printf("compiles=%lld disk_hits=%lld memory_hits=%lld fallbacks=%lld\n",
                static_cast<long long>(s.compiles), static_cast<long long>(s.disk_hits),
                static_cast<long long>(s.memory_hits), static_cast<long long>(s.fallbacks));
    return 0;
  }
  if (mode == "store" && argc == 5) {
    volt::KernelCache cache(volt::KernelCacheOptions(argv[2]).size_mb(1));
    const std::string key = argv[3];
    std::string bytes(std::stoul(argv[4]), '\0');
    for (size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<char>(key[i % key.size()] + i % 7);
    cache.store(key, bytes);
    cache.flush();
    return cache.stats().failures == 0 ? 0 : 1;
  }
  std::fprintf(stderr, "usage: volt_jit_worker kernel NAME | store DIR KEY BYTES\n");
  return 2;
}
