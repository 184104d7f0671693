#pragma once
/// Model weights in the safetensors format, readable by Python's `safetensors` / PyTorch:
/// an 8-byte little-endian header length, a JSON header mapping each name to
/// {"dtype", "shape", "data_offsets": [begin, end]} (plus an optional "__metadata__" object of
/// strings), then the raw little-endian tensor bytes, with no gaps or overlaps.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <map>
#include <string>

namespace volt {

/// The contents of one safetensors file.
struct SafetensorsFile {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// Writes `tensors` (copied to CPU, made contiguous) atomically to `path`.
/// Supported dtypes: float64/32/16, bfloat16, int64/32/16/8, uint8, bool.
void save_safetensors(const std::map<std::string, at::Tensor>& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata = {});
/// Writes every named parameter and buffer of `module`.
void save_safetensors(const torch::nn::Module& module, const std::string& path,
                      const std::map<std::string, std::string>& metadata = {});

/// Reads and validates a safetensors file (header length, JSON, dtypes, shapes, offsets in
/// range, no overlaps or holes); any defect throws CheckpointError naming it.
SafetensorsFile load_safetensors(const std::string& path);
/// Copies a file's tensors into the module's parameters and buffers by name (converting the
/// dtype). strict: every name must match both ways with equal shapes (else CheckpointError
/// listing each mismatch); non-strict loads the names that match and skips the rest.
void load_safetensors(torch::nn::Module& module, const std::string& path, bool strict = true);

}  // namespace volt
