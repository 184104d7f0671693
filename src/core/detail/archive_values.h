#pragma once
// Lists of doubles in torch::serialize archives (checkpoint state of schedulers and callbacks).

#include <torch/serialize/archive.h>

#include <vector>

namespace volt {
namespace detail {

/// `v` as an archive value (a double list).
inline c10::IValue double_list(const std::vector<double>& v) {
  return c10::IValue(c10::List<double>(v));
}

/// The double list written under `key` (libtorch's read throws when the key is missing).
inline std::vector<double> read_double_list(torch::serialize::InputArchive& archive,
                                            const char* key) {
  c10::IValue v;
  archive.read(key, v);
  const auto list = v.toDoubleList();
  return std::vector<double>(list.begin(), list.end());
}

}  // namespace detail
}  // namespace volt
