#pragma once
// Private: checkpoint folders of per-rank shards (DeepSpeedStrategy's ZeRO folders,
// ModelParallelStrategy's distributed checkpoints), and the archive copying their consolidation
// needs. libtorch archives cannot be edited: the helpers copy them key by key (sub-archives
// recursively; every other entry, tensors included, as an IValue, which every reader accepts).

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace volt {

class Strategy;

namespace detail {

using Entries = std::vector<std::pair<std::string, c10::IValue>>;
/// A place in a checkpoint's tree of archives: the keys from the root.
using ArchivePath = std::vector<std::string>;

/// One entry that is not a sub-archive.
void copy_value(torch::serialize::InputArchive& in, const std::string& key,
                torch::serialize::OutputArchive& out);
/// Every entry of `in` (sub-archives recursively).
void copy_archive(torch::serialize::InputArchive& in, torch::serialize::OutputArchive& out);
/// The entries of `in` that are not sub-archives, in its order.
Entries entries_of(torch::serialize::InputArchive& in);
/// An archive holding `entries` (written and read back in memory).
torch::serialize::InputArchive archive_of(const Entries& entries);
/// An OutputArchive read back as an InputArchive (in memory).
torch::serialize::InputArchive reread(torch::serialize::OutputArchive& out);
/// Entry `key` of `ar`; CheckpointError naming `where` when it is missing.
c10::IValue read_value(torch::serialize::InputArchive& ar, const std::string& key,
                       const std::string& where);
/// Sub-archive `key` of `ar`; CheckpointError naming `where` when it is missing.
torch::serialize::InputArchive read_sub(torch::serialize::InputArchive& ar, const std::string& key,
                                        const std::string& where);
/// The sub-archive of `root` at `path` (not empty); CheckpointError when a key is missing.
torch::serialize::InputArchive sub_at(torch::serialize::InputArchive& root,
                                      const ArchivePath& path);
/// The places in a checkpoint's tree (`at`, below `path`) of the state dicts a shard folder keeps
/// in pieces (those holding a sub-archive `dict_marker`) and of the optimizer states (those
/// holding an entry `optimizer_marker`), depth first: the Trainer's "state_dict" and
/// "optimizers/optimizer_<i>", a Fabric state's modules and optimizers.
void find_sharded_places(torch::serialize::InputArchive& at, const ArchivePath& path,
                         const std::string& dict_marker, const std::string& optimizer_marker,
                         std::vector<ArchivePath>& dicts, std::vector<ArchivePath>& optimizers);
/// The strings of a list value (an optimizer group's parameter names).
std::vector<std::string> names_of(const c10::IValue& v);
/// An optimizer's state whole, in volt::save_optimizer_state's format, from the shards' `parts`
/// (rank order): each param group's options and parameter names are rank 0's, each parameter's
/// state `join(name, states)`, `states` being every shard's state archive of that group (nullopt:
/// the parameter has no state, it never stepped). The consolidations of ZeRO and tensor-parallel
/// folders differ only in `join`.
void join_optimizer_state(
    std::vector<torch::serialize::InputArchive>& parts, torch::serialize::OutputArchive& full,
    const std::function<c10::optional<Entries>(
        const std::string& name, std::vector<torch::serialize::InputArchive>& states)>& join);
/// The state dict an optimizer's archive belongs to: the place its "weights_at" names (a
/// Fabric state's), else the Trainer's "state_dict".
ArchivePath dict_of_optimizer(torch::serialize::InputArchive& optimizer);

/// Rank 0's tree (`in` at `path`) written to `out`, with whole weights (`weights`: a state
/// dict's entries by its place) and whole optimizer states (`optimizers`: a serialized archive
/// by its place) in place of their shards; the places in `drop` are left out.
void write_consolidated(torch::serialize::InputArchive& in, const ArchivePath& path,
                        torch::serialize::OutputArchive& out,
                        const std::map<ArchivePath, Entries>& weights,
                        const std::map<ArchivePath, std::string>& optimizers,
                        const std::set<ArchivePath>& drop = {});

bool is_directory(const std::string& path);
/// Whether `path` is a complete checkpoint folder: a directory holding `meta_file` (every kind
/// of folder writes its metadata file last).
bool is_complete_folder(const std::string& path, const std::string& meta_file);
/// A complete checkpoint folder of any kind (ZeRO's or model_parallel's).
bool is_checkpoint_folder(const std::string& path);
/// ZeRO folders' metadata file (DeepSpeedStrategy).
constexpr const char* kZeroMetaFile = "zero_checkpoint.txt";

/// One save of a folder of shards.
struct FolderSave {
  std::string path;                 ///< the folder
  std::string shard;                ///< this rank's file inside it ("": this rank writes none)
  std::string meta_file;            ///< the metadata file's name, written last
  std::string meta;                 ///< its contents
  std::string tag;                  ///< the component, for errors
  std::vector<std::string> shards;  ///< every rank's files: all must be there to swap it in
};

/// Every rank of `strategy` calls it, and saves into global rank 0's `path` (broadcast, as
/// Lightning's strategies broadcast the file path: ranks may name different ones). Rank 0 makes
/// `<path>.partial`; the ranks with a shard write `archive` there (and flush the CheckpointIO, so
/// a background writer is done); rank 0 checks that every one of `shards` is there, writes the
/// metadata file last and swaps the staging folder in with one rename (exchanged with an
/// earlier folder at `path`, which is then removed; a file at `path`, or a folder where the
/// file system cannot exchange, is moved aside to `<path>.old` first, so `path` is missing only
/// between those two renames, and the next save puts `.old` back if it stopped there). A save
/// that fails removes its staging folder; one killed mid-save leaves it, and the next save to
/// `path` removes it. After each part the ranks agree on its success, so a failure on one rank
/// is a CheckpointError on every rank at once. CheckpointError when a folder cannot be made or
/// moved, when the ranks do not share the folder (a shard missing from rank 0's view; the
/// staging folders the CheckpointIO made on the other nodes' disks then stay there), and for a
/// folder at `path` that is no checkpoint folder (it would be replaced, its contents deleted).
void save_checkpoint_folder(Strategy& strategy, torch::serialize::OutputArchive& archive,
                            const FolderSave& save);

// ------------------------------------------- ModelParallelStrategy's distributed checkpoints
// A folder of one shard file per tensor-parallel rank (the first group's) and the metadata file,
// written last: "format 1", "tensor_parallel_size T", "world_size W".

/// In each state dict of a shard: "rank" and "size" (tensor-parallel), and "layouts": each
/// split parameter's [dim, packed] (TensorParallelEngine::SplitLayout).
constexpr const char* kTpRecord = "__tensor_parallel__";
/// In each optimizer state of a shard: the tensor-parallel rank and size that wrote it.
constexpr const char* kTpOptimizerRank = "tensor_parallel_rank";
constexpr const char* kTpOptimizerSize = "tensor_parallel_size";
constexpr const char* kTpMetaFile = "model_parallel_checkpoint.txt";

/// The shard file's name inside the folder.
std::string tp_shard_name(int64_t tp_rank, int64_t tp_size);
/// The folder's tensor-parallel size (its metadata); CheckpointError when it is damaged.
int64_t tp_folder_size(const std::string& folder);
/// The folder consolidated in memory (consolidate_model_parallel_checkpoint's contents).
torch::serialize::InputArchive read_model_parallel_checkpoint(const std::string& folder,
                                                              bool weights_only);

}  // namespace detail
}  // namespace volt
