// libFuzzer target: volt's safetensors reader (detail::parse_safetensors, which
// load_safetensors calls on the bytes of a file). The input is the whole file. Bad bytes must end
// in a CheckpointError; a file it accepts must decode into tensors that exactly tile the data
// section. Anything else is a finding.

#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_common.h"
#include "io/detail/safetensors_parse.h"
#include "volt/core/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file(reinterpret_cast<const char*>(data), size);
  try {
    const volt::SafetensorsFile f = volt::detail::parse_safetensors(file, "fuzz.safetensors");
    uint64_t header = 0;
    std::memcpy(&header, file.data(), 8);  // accepted, so at least 8 bytes
    uint64_t bytes = 0;
    for (const auto& [name, t] : f.tensors) {
      bytes += static_cast<uint64_t>(t.numel()) * t.element_size();
    }
    if (bytes != size - 8 - header) {
      volt_fuzz::finding("accepted tensors hold " + std::to_string(bytes) +
                         " bytes but the data section has " + std::to_string(size - 8 - header));
    }
    volt_fuzz::trace("accepted: " + std::to_string(f.tensors.size()) + " tensors, " +
                     std::to_string(f.metadata.size()) + " metadata entries");
  } catch (const volt::CheckpointError& e) {
    volt_fuzz::trace(std::string("refused: ") + e.what());
  } catch (const std::exception& e) {
    volt_fuzz::finding(std::string("parse_safetensors let a non-CheckpointError escape: ") +
                       e.what());
  }
  return 0;
}
