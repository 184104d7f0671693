#pragma once
// CRC-32 (zlib's) over buffers of any size: the checkpoint envelope's checksum and the ZIP
// records' that the archive check verifies.

#include <zlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace volt {
namespace detail {

/// Continues `crc` over n bytes; zlib's crc32 takes a uInt length, so large buffers go in chunks.
inline uLong crc32_update(uLong crc, const char* data, size_t n) {
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    n -= chunk;
  }
  return crc;
}

/// The CRC-32 of n bytes.
inline uint32_t crc32_of(const char* data, size_t n) {
  return static_cast<uint32_t>(crc32_update(crc32(0L, Z_NULL, 0), data, n));
}

}  // namespace detail
}  // namespace volt
