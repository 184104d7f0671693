#pragma once
// Private: the checkpoint key of one rank's own copy of an entry ("rank<r>.<key>": its random
// state, its part-accumulated gradient), shared by the strategies that write them (DDP, the
// pipeline), so that each reads the other's checkpoints.

#include <cstdint>
#include <string>

namespace volt::detail {

inline std::string rank_key(int64_t rank, const std::string& key) {
  return "rank" + std::to_string(rank) + "." + key;
}

}  // namespace volt::detail
