#pragma once
// The safetensors reader on bytes already in memory: load_safetensors reads the file and calls
// it; fuzz/safetensors_fuzzer.cpp feeds it hostile bytes.

#include <string>

#include "volt/io/safetensors.h"

namespace volt {
namespace detail {

/// Validates and decodes the safetensors bytes `file` (named `path` in messages): header length,
/// JSON, dtypes, shapes, offsets, no overlaps or holes; any defect throws CheckpointError.
SafetensorsFile parse_safetensors(const std::string& file, const std::string& path);

}  // namespace detail
}  // namespace volt
