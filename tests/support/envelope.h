#pragma once
// A libtorch archive in volt's checkpoint envelope, built by hand for tests that need archives
// libtorch or volt's archive check must refuse after the envelope's own checks pass.

#include <zlib.h>

#include <cstdint>
#include <string>

#include <volt/io/checkpoint_io.h>

namespace volt_test {

/// `payload` in a correct envelope (magic, format version, size, CRC-32).
inline std::string envelope_around(const std::string& payload) {
  std::string file = "VOLTCKPT";
  const auto put = [&](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) file.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(volt::TorchCheckpointIO::kFormatVersion, 4);
  put(payload.size(), 8);
  put(crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(payload.data()),
            static_cast<uInt>(payload.size())),
      4);
  return file + payload;
}

}  // namespace volt_test
