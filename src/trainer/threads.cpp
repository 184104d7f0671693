#include "volt/trainer/threads.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <string>

#include "core/detail/numbers.h"

namespace volt {
namespace {

/// Which BLAS libtorch really loaded, from /proc/self/maps (Debian resolves it through the
/// libblas.so.3 alternative).
enum class Blas { kOpenBlas, kOther, kReference };

Blas loaded_blas() {
  auto maps = detail::c_stream<std::ifstream>("/proc/self/maps");
  std::string line;
  bool reference = false;
  while (std::getline(maps, line)) {
    if (line.find("openblas") != std::string::npos) return Blas::kOpenBlas;
    if (line.find("libmkl") != std::string::npos || line.find("blis") != std::string::npos) {
      return Blas::kOther;
    }
    if (line.find("/blas/libblas.so") != std::string::npos) reference = true;
  }
  return reference ? Blas::kReference : Blas::kOther;
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return CPU_COUNT(&set);
}

int64_t resolve(int64_t requested) {
  return requested > 0 ? requested : default_num_threads();
}

}  // namespace

bool reference_blas_active() {
  return loaded_blas() == Blas::kReference;
}

int64_t default_num_threads() {
  // Measured on the 2-vCPU reference machine (docs/PERFORMANCE.md): one intra-op thread lets
  // OpenBLAS use its own threads for GEMMs without oversubscribing the cores.
  static const int64_t n = available_cpus() <= 2 && loaded_blas() == Blas::kOpenBlas ? 1 : 0;
  return n;
}

IntraOpThreads::IntraOpThreads(int64_t requested)
    : previous_(at::get_num_threads()), count_(resolve(requested)) {
  if (count_ <= 0) count_ = previous_;
  if (count_ != previous_) at::set_num_threads(static_cast<int>(count_));
}

IntraOpThreads::~IntraOpThreads() {
  if (at::get_num_threads() != previous_) at::set_num_threads(previous_);
}

int64_t configure_threads(int64_t requested) {
  int64_t n = resolve(requested);
  if (n <= 0) return at::get_num_threads();
  if (at::get_num_threads() != n) at::set_num_threads(static_cast<int>(n));
  return n;
}

}  // namespace volt
