// ModelParallelStrategy's distributed checkpoints (save_distributed_checkpoint) as one ordinary
// checkpoint: the tensor-parallel ranks' shards joined by the layouts recorded beside them.
#include <sys/stat.h>

#include <torch/torch.h>

#include <map>
#include <set>

#include "core/detail/numbers.h"
#include "strategies/detail/checkpoint_folder.h"
#include "volt/core/check.h"
#include "volt/io/checkpoint_io.h"
#include "volt/strategies/model_parallel.h"

namespace volt {
namespace {

using detail::ArchivePath;
using detail::Entries;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;
using Layout = TensorParallelEngine::SplitLayout;

constexpr const char* kTag = "[ModelParallelStrategy]";
constexpr int64_t kFormat = 1;

std::string where(const ArchivePath& path) {
  std::string s;
  for (const auto& k : path) s += (s.empty() ? "" : "/") + k;
  return s.empty() ? "the root" : "'" + s + "'";
}

// One state dict's split parameters: layout and this shard's shape, by name.
struct SplitParam {
  Layout layout;
  std::vector<int64_t> shard_sizes;
};
using Splits = std::map<std::string, SplitParam>;

// Shard `r`'s record of the dict at `path`, checked against the folder's size; its layouts.
Splits read_record(InputArchive& dict, const ArchivePath& path, int64_t r, int64_t size) {
  InputArchive record = detail::read_sub(dict, detail::kTpRecord, "a shard's state dict");
  const int64_t rank = detail::read_value(record, "rank", "a shard's record").toInt();
  const int64_t recorded = detail::read_value(record, "size", "a shard's record").toInt();
  VOLT_CHECK(rank == r && recorded == size, CheckpointError, kTag, " shard ", r, " of ", size,
             " holds the weights (", where(path), ") of tensor-parallel rank ", rank, " of ",
             recorded, "; the folder mixes checkpoints. Load a folder one save wrote.");
  InputArchive layouts = detail::read_sub(record, "layouts", "a shard's record");
  Splits out;
  for (const auto& name : layouts.keys()) {
    at::Tensor l;
    layouts.read(name, l);
    VOLT_CHECK(l.numel() == 2, CheckpointError, kTag, " the layout of '", name,
               "' is damaged; load a folder volt wrote.");
    at::Tensor shard;
    VOLT_CHECK(dict.try_read(name, shard), CheckpointError, kTag, " shard ", r, " has no '", name,
               "' though its record splits it; the folder is damaged.");
    out[name] = {Layout{l[0].item<int64_t>(), l[1].item<int64_t>() != 0}, shard.sizes().vec()};
  }
  return out;
}

at::Tensor joined(std::vector<at::Tensor>& pieces, const Layout& layout, const std::string& what) {
  try {
    return TensorParallelEngine::join_shards(pieces, layout);
  } catch (const ValueError& e) {
    throw CheckpointError(std::string(kTag) + " cannot join the shards of " + what + ": " +
                          e.what() + "; the folder mixes checkpoints.");
  }
}

// A state dict whole: its entries in rank 0's order, split parameters joined, the record
// dropped.
Entries whole_dict(std::vector<InputArchive>& dicts, const Splits& splits) {
  Entries out;
  for (const auto& key : dicts[0].keys()) {
    if (key == detail::kTpRecord) continue;
    c10::IValue v;
    if (!dicts[0].try_read(key, v) || !v.isTensor()) continue;
    if (auto s = splits.find(key); s != splits.end()) {
      std::vector<at::Tensor> pieces;
      for (auto& d : dicts) {
        at::Tensor t;
        VOLT_CHECK(d.try_read(key, t), CheckpointError, kTag, " a shard lacks '", key,
                   "'; the folder mixes checkpoints.");
        pieces.push_back(t);
      }
      v = joined(pieces, s->second.layout, "'" + key + "'");
    }
    out.emplace_back(key, v);
  }
  return out;
}

// An optimizer's state whole (volt::save_optimizer_state's format), serialized: each split
// parameter's per-element state (its shard's shape) joined as the parameter, anything else (a
// step count) rank 0's.
std::string whole_optimizer(std::vector<InputArchive>& parts, const Splits& splits) {
  OutputArchive full;
  detail::join_optimizer_state(
      parts, full,
      [&](const std::string& name, std::vector<InputArchive>& states) -> c10::optional<Entries> {
        InputArchive one0;
        if (!states[0].try_read(name, one0)) return c10::nullopt;  // never stepped
        Entries merged = detail::entries_of(one0);
        const auto s = splits.find(name);
        if (s == splits.end()) return merged;  // whole: rank 0's
        std::vector<Entries> per_rank;
        for (size_t r = 0; r < states.size(); ++r) {
          InputArchive one;
          VOLT_CHECK(states[r].try_read(name, one), CheckpointError, kTag, " shard ", r,
                     " has no optimizer state for '", name,
                     "' (rank 0 has); the folder mixes checkpoints.");
          per_rank.push_back(detail::entries_of(one));
        }
        for (auto& [key, v] : merged) {
          if (!v.isTensor() || !v.toTensor().sizes().equals(s->second.shard_sizes)) continue;
          std::vector<at::Tensor> pieces;
          for (auto& e : per_rank) {
            for (auto& [k2, v2] : e) {
              if (k2 == key && v2.isTensor()) pieces.push_back(v2.toTensor());
            }
          }
          v = joined(pieces, s->second.layout,
                     "the optimizer state '" + key + "' of '" + name + "'");
        }
        return merged;
      });
  auto bytes = detail::c_stream<std::ostringstream>();
  full.save_to(bytes);
  return bytes.str();
}

OutputArchive consolidated(const std::string& folder, bool weights_only) {
  VOLT_CHECK(is_model_parallel_checkpoint(folder), CheckpointError, kTag, " '", folder,
             "' is not a complete model_parallel checkpoint folder (no ", detail::kTpMetaFile,
             ": a save was interrupted); load the previous checkpoint.");
  const int64_t size = detail::tp_folder_size(folder);
  TorchCheckpointIO io;
  std::vector<InputArchive> shards;
  for (int64_t r = 0; r < size; ++r) {
    const std::string file = folder + "/" + detail::tp_shard_name(r, size);
    struct stat st;
    VOLT_CHECK(::stat(file.c_str(), &st) == 0, CheckpointError, kTag, " '", folder,
               "' lacks the shard of tensor-parallel rank ", r, " of ", size, " ('",
               detail::tp_shard_name(r, size), "'); the folder is incomplete.");
    shards.push_back(io.load(file));
  }
  std::vector<ArchivePath> dict_paths, optimizer_paths;
  detail::find_sharded_places(shards[0], {}, detail::kTpRecord, detail::kTpOptimizerRank,
                              dict_paths, optimizer_paths);
  std::map<ArchivePath, Entries> weights;
  std::map<ArchivePath, Splits> splits;
  for (const auto& path : dict_paths) {
    std::vector<InputArchive> dicts;
    for (int64_t r = 0; r < size; ++r) {
      dicts.push_back(detail::sub_at(shards[r], path));
      Splits mine = read_record(dicts.back(), path, r, size);
      if (r == 0) splits[path] = std::move(mine);
    }
    weights[path] = whole_dict(dicts, splits[path]);
  }
  std::map<ArchivePath, std::string> optimizers;
  std::set<ArchivePath> drop;
  for (const auto& path : optimizer_paths) {
    if (weights_only) {
      drop.insert(path);  // validate / test / predict, load_weights: no optimizer state
      continue;
    }
    std::vector<InputArchive> parts;
    for (int64_t r = 0; r < size; ++r) {
      parts.push_back(detail::sub_at(shards[r], path));
      const int64_t rank =
          detail::read_value(parts.back(), detail::kTpOptimizerRank, "an optimizer shard").toInt();
      VOLT_CHECK(rank == r, CheckpointError, kTag, " shard ", r,
                 " holds the optimizer state of tensor-parallel rank ", rank,
                 "; the folder mixes checkpoints.");
    }
    const ArchivePath dict = detail::dict_of_optimizer(parts[0]);
    const auto s = splits.find(dict);
    VOLT_CHECK(s != splits.end(), CheckpointError, kTag, " the optimizer state at ", where(path),
               " belongs to the weights at ", where(dict),
               ", which the folder does not hold; load a folder volt wrote.");
    optimizers[path] = whole_optimizer(parts, s->second);
  }
  OutputArchive root;
  detail::write_consolidated(shards[0], {}, root, weights, optimizers, drop);
  return root;
}

}  // namespace

namespace detail {

std::string tp_shard_name(int64_t tp_rank, int64_t tp_size) {
  return "tp_rank_" + std::to_string(tp_rank) + "_of_" + std::to_string(tp_size) + ".ckpt";
}

int64_t tp_folder_size(const std::string& folder) {
  auto f = detail::c_stream<std::ifstream>(folder + "/" + kTpMetaFile);
  std::string key;
  int64_t format = 0, size = 0;
  while (f >> key) {
    if (key == "format") f >> format;
    if (key == "tensor_parallel_size") f >> size;
  }
  VOLT_CHECK(format == kFormat && size >= 1, CheckpointError, kTag, " '", folder, "/", kTpMetaFile,
             "' is damaged or from another volt (format ", format, ", tensor_parallel_size ", size,
             "); re-save the checkpoint.");
  return size;
}

InputArchive read_model_parallel_checkpoint(const std::string& folder, bool weights_only) {
  OutputArchive root = consolidated(folder, weights_only);
  return reread(root);
}

}  // namespace detail

bool is_model_parallel_checkpoint(const std::string& path) {
  return detail::is_complete_folder(path, detail::kTpMetaFile);
}

void consolidate_model_parallel_checkpoint(const std::string& folder, const std::string& out,
                                           bool weights_only) {
  OutputArchive root = consolidated(folder, weights_only);
  TorchCheckpointIO().save(root, out);
}

}  // namespace volt
