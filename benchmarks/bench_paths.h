#pragma once
// Where the benchmarks' own sources are (the Python scripts beside them). CMake defines the path
// for bench_paths.cpp alone: on a benchmark TU's command line it would make that TU compile
// differently in each clone, and ccache could not serve it to a fresh clone (CI).
#include <string>

namespace volt_bench {

/// benchmarks/ in the source tree.
std::string source_dir();

}  // namespace volt_bench
