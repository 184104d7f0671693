#include "bench_paths.h"

namespace volt_bench {

std::string source_dir() {
  return VOLT_BENCH_DIR;
}

}  // namespace volt_bench
