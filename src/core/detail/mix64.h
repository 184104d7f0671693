#pragma once
// splitmix64 (Steele, Lea and Flood): one 64-bit value turned into a well-mixed one, so that
// nearby inputs (seed and epoch, seed and rank) give unrelated random streams.

#include <cstdint>

namespace volt {
namespace detail {

/// splitmix64's next output for the state `z`: z advanced by the golden-ratio increment, then
/// finalized.
inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace detail
}  // namespace volt
