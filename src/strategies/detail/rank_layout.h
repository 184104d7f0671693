#pragma once
// Private: the layout (two group sizes) whose ranks wrote the "rank<r>." partial sums beside an
// accumulated-gradient checkpoint, shared by the strategies that split ranks two ways (the
// pipeline: stages x replicas; model_parallel: replicas x tensor-parallel ranks). A rank's own
// entry is its partial sum only under the layout that wrote it; any other reads the mean.

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>

#include <cstdint>

namespace volt::detail {

enum class RankLayout { kNotRecorded, kSame, kOther };

inline void write_rank_layout(torch::serialize::OutputArchive& ar, const char* key, int64_t a,
                              int64_t b) {
  ar.write(key, torch::tensor({a, b}, torch::kLong));
}

inline RankLayout read_rank_layout(torch::serialize::InputArchive& ar, const char* key, int64_t a,
                                   int64_t b) {
  at::Tensor layout;
  if (!ar.try_read(key, layout)) return RankLayout::kNotRecorded;
  const bool same =
      layout.numel() == 2 && layout[0].item<int64_t>() == a && layout[1].item<int64_t>() == b;
  return same ? RankLayout::kSame : RankLayout::kOther;
}

}  // namespace volt::detail
