#pragma once
// Private: a nested torch::serialize archive written in one expression, for the checkpoint
// writers (the Trainer's checkpoint state, Fabric::save) that build their files as trees.

#include <torch/serialize/output-archive.h>

#include <string>
#include <utility>

namespace volt {
namespace detail {

/// Writes a nested archive under `key` of `parent`, filled by `fill(archive)`.
template <typename F>
void write_nested(torch::serialize::OutputArchive& parent, const std::string& key, F&& fill) {
  torch::serialize::OutputArchive ar;
  std::forward<F>(fill)(ar);
  parent.write(key, ar);
}

}  // namespace detail
}  // namespace volt
