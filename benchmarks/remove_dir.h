#pragma once
// Removing a benchmark's scratch folder. Not std::filesystem::remove_all: the torch 2.x wheels'
// libtorch.so exports its own copy of it, which crashes when called (src/core/detail/
// remove_tree.h); the benchmarks run on the GPU machine against that libtorch too.

#include <cstdio>
#include <cstdlib>
#include <string>

namespace volt_bench {

/// Removes `path` and everything under it (a path without single quotes).
inline void remove_dir(const std::string& path) {
  const std::string cmd = "rm -rf '" + path + "'";
  if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", path.c_str());
}

}  // namespace volt_bench
