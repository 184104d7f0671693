#pragma once
// Reading back what a test wrote into an archive, as a checkpoint file round trip would.

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sstream>

namespace volt_test {

/// Writes `out` to memory and returns it read back: what a component would find on resume.
inline torch::serialize::InputArchive reread(torch::serialize::OutputArchive& out) {
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  return in;
}

}  // namespace volt_test
