#include <ATen/Parallel.h>

#include <fstream>
#include <string>

#include "volt/trainer/trainer.h"

namespace volt {

bool reference_blas_active() {
  // libtorch resolves BLAS through Debian's libblas.so.3 alternative; /proc/self/maps shows
  // which implementation was really loaded.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool reference = false;
  while (std::getline(maps, line)) {
    if (line.find("openblas") != std::string::npos || line.find("libmkl") != std::string::npos ||
        line.find("blis") != std::string::npos) {
      return false;
    }
    if (line.find("/blas/libblas.so") != std::string::npos) reference = true;
  }
  return reference;
}

int64_t configure_threads(int64_t requested) {
  // Measured on the 2-core reference machine (docs/PERFORMANCE.md): one intra-op thread lets
  // OpenBLAS use its own threads for GEMMs without oversubscribing the cores.
  const int64_t n = requested > 0 ? requested : 1;
  if (at::get_num_threads() != n) at::set_num_threads(static_cast<int>(n));
  return n;
}

}  // namespace volt
