#include "strategies/detail/checkpoint_folder.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>

#include "core/detail/numbers.h"
#include "core/detail/remove_tree.h"
#include "strategies/detail/agree.h"
#include "volt/core/atomic_file.h"
#include "volt/core/check.h"
#include "volt/io/checkpoint_io.h"
#include "volt/strategies/strategy.h"

namespace volt {
namespace detail {

namespace fs = std::filesystem;
using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

namespace {
constexpr const char* kTag = "[Checkpoint]";
}  // namespace

void copy_value(InputArchive& in, const std::string& key, OutputArchive& out) {
  c10::IValue v;
  if (!in.try_read(key, v)) return;
  if (v.isTensor()) {
    out.write(key, v.toTensor());
  } else {
    out.write(key, v);
  }
}

void copy_archive(InputArchive& in, OutputArchive& out) {
  for (const auto& key : in.keys()) {
    InputArchive sub;
    if (in.try_read(key, sub)) {
      OutputArchive sub_out;
      copy_archive(sub, sub_out);
      out.write(key, sub_out);
      continue;
    }
    copy_value(in, key, out);
  }
}

Entries entries_of(InputArchive& in) {
  Entries out;
  for (const auto& key : in.keys()) {
    c10::IValue v;
    if (in.try_read(key, v)) out.emplace_back(key, v);
  }
  return out;
}

InputArchive reread(OutputArchive& out) {
  auto buffer = detail::c_stream<std::stringstream>();
  out.save_to(buffer);
  InputArchive in;
  in.load_from(buffer);
  return in;
}

InputArchive archive_of(const Entries& entries) {
  OutputArchive out;
  for (const auto& [k, v] : entries) out.write(k, v);
  return reread(out);
}

c10::IValue read_value(InputArchive& ar, const std::string& key, const std::string& where) {
  c10::IValue v;
  VOLT_CHECK(ar.try_read(key, v), CheckpointError, kTag, " ", where, " has no '", key,
             "'; the checkpoint is damaged or was not written by volt.");
  return v;
}

InputArchive read_sub(InputArchive& ar, const std::string& key, const std::string& where) {
  InputArchive sub;
  VOLT_CHECK(ar.try_read(key, sub), CheckpointError, kTag, " ", where, " has no '", key,
             "'; the checkpoint is damaged or was not written by volt.");
  return sub;
}

InputArchive sub_at(InputArchive& root, const ArchivePath& path) {
  VOLT_CHECK(!path.empty(), InternalError, kTag, " sub_at() needs a path below the root.");
  InputArchive at = read_sub(root, path[0], "a shard");
  for (size_t i = 1; i < path.size(); ++i) {
    InputArchive next = read_sub(at, path[i], "a shard");
    at = std::move(next);
  }
  return at;
}

void find_sharded_places(InputArchive& at, const ArchivePath& path, const std::string& dict_marker,
                         const std::string& optimizer_marker, std::vector<ArchivePath>& dicts,
                         std::vector<ArchivePath>& optimizers) {
  c10::IValue marker;
  if (at.try_read(optimizer_marker, marker)) {
    optimizers.push_back(path);
    return;
  }
  InputArchive record;
  if (at.try_read(dict_marker, record)) {
    dicts.push_back(path);
    return;
  }
  for (const auto& key : at.keys()) {
    InputArchive sub;
    if (!at.try_read(key, sub)) continue;
    ArchivePath next = path;
    next.push_back(key);
    find_sharded_places(sub, next, dict_marker, optimizer_marker, dicts, optimizers);
  }
}

std::vector<std::string> names_of(const c10::IValue& v) {
  std::vector<std::string> out;
  for (const auto& s : c10::impl::toTypedList<std::string>(v.toList())) out.push_back(s);
  return out;
}

ArchivePath dict_of_optimizer(InputArchive& optimizer) {
  ArchivePath dict{"state_dict"};
  c10::IValue at_iv;
  if (optimizer.try_read("weights_at", at_iv) && at_iv.isString()) {
    dict.clear();
    auto keys = detail::c_stream<std::istringstream>(at_iv.toStringRef());
    for (std::string k; std::getline(keys, k, '/');) dict.push_back(k);
  }
  return dict;
}

// Rank 0's tree (`in` at `path`) written to `out`, with the whole weights and optimizer states
// in place of their shards.
// Entries at the places in `drop` are left out.
void write_consolidated(InputArchive& in, const ArchivePath& path, OutputArchive& out,
                        const std::map<ArchivePath, Entries>& weights,
                        const std::map<ArchivePath, std::string>& optimizers,
                        const std::set<ArchivePath>& drop) {
  for (const auto& key : in.keys()) {
    InputArchive sub;
    if (!in.try_read(key, sub)) {
      copy_value(in, key, out);
      continue;
    }
    ArchivePath next = path;
    next.push_back(key);
    if (drop.count(next) != 0) continue;
    OutputArchive sub_out;
    if (auto w = weights.find(next); w != weights.end()) {
      for (const auto& [name, v] : w->second) sub_out.write(name, v.toTensor());
    } else if (auto o = optimizers.find(next); o != optimizers.end()) {
      auto bytes = detail::c_stream<std::istringstream>(o->second);
      InputArchive whole;
      whole.load_from(bytes);
      copy_archive(whole, sub_out);
    } else {
      write_consolidated(sub, next, sub_out, weights, optimizers, drop);
    }
    out.write(key, sub_out);
  }
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void join_optimizer_state(
    std::vector<InputArchive>& parts, OutputArchive& full,
    const std::function<c10::optional<Entries>(const std::string&, std::vector<InputArchive>&)>&
        join) {
  const c10::IValue num_groups = read_value(parts[0], "num_groups", "an optimizer shard");
  full.write("num_groups", num_groups);
  for (int64_t g = 0; g < num_groups.toInt(); ++g) {
    const std::string gk = "group_" + std::to_string(g);
    std::vector<InputArchive> states;
    InputArchive group0 = read_sub(parts[0], gk, "an optimizer shard");
    for (auto& p : parts) {
      InputArchive group = read_sub(p, gk, "an optimizer shard");
      states.push_back(read_sub(group, "state", gk));
    }
    OutputArchive group_out, options_out, states_out;
    InputArchive options_in = read_sub(group0, "options", gk);
    copy_archive(options_in, options_out);
    group_out.write("options", options_out);
    const c10::IValue names = read_value(group0, "params", gk);
    group_out.write("params", names);
    for (const auto& name : names_of(names)) {
      const c10::optional<Entries> merged = join(name, states);
      if (!merged) continue;
      InputArchive merged_in = archive_of(*merged);
      OutputArchive one_out;
      copy_archive(merged_in, one_out);
      states_out.write(name, one_out);
    }
    group_out.write("state", states_out);
    full.write(gk, group_out);
  }
}

bool is_complete_folder(const std::string& path, const std::string& meta_file) {
  struct stat st;
  return is_directory(path) && ::stat((path + "/" + meta_file).c_str(), &st) == 0;
}

bool is_checkpoint_folder(const std::string& path) {
  return is_complete_folder(path, kZeroMetaFile) || is_complete_folder(path, kTpMetaFile);
}

namespace {

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

void fsync_parent(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  const int dir = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

// Rank 0's part before any shard is written: the staging folder made, `path` checked.
void stage(const FolderSave& save, const std::string& staging, const std::string& old) {
  const std::string& path = save.path;
  // A save that stopped between the two renames of the fallback below left the previous
  // checkpoint at <path>.old and nothing at <path>: put it back first.
  if (!exists(path) && exists(old)) ::rename(old.c_str(), path.c_str());
  VOLT_CHECK(!is_directory(path) || is_checkpoint_folder(path), CheckpointError, save.tag, " '",
             path,
             "' is a folder that holds no volt checkpoint; a checkpoint folder would replace it "
             "(and delete what it holds). Save to another path.");
  remove_tree(staging);
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  VOLT_CHECK(::mkdir(staging.c_str(), 0755) == 0, CheckpointError, save.tag,
             " cannot create the checkpoint folder '", staging, "' (", std::strerror(errno),
             "); check that the folder is writable.");
}

// Rank 0's check before the swap: every rank's shard is in the folder it staged.
void check_shards(const FolderSave& save, const std::string& staging) {
  for (const auto& shard : save.shards) {
    VOLT_CHECK(exists(staging + "/" + shard), CheckpointError, save.tag, " the shard '", shard,
               "' is missing from '", staging,
               "' although its rank wrote it: the ranks do not share this folder (a disk local "
               "to each node?); save checkpoints to a folder every node sees.");
  }
}

// Rank 0's last part: the staged folder, complete with its metadata, put at `path`. A folder
// there is exchanged with it in one renameat2; where the file system has no exchange (NFS,
// some FUSE ones), and for a single-file checkpoint at `path`, the old one is moved aside to
// <path>.old, the new one moved in, and the old one removed: `path` is missing only between
// those two renames, and the next save puts <path>.old back if it stopped there.
void swap_in(const FolderSave& save, const std::string& staging, const std::string& old) {
  const std::string& path = save.path;
  atomic_write_file(staging + "/" + save.meta_file, save.meta);
  if (is_directory(path) &&
      ::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_parent(path);
    remove_tree(staging);  // the old folder now
    return;
  }
  if (exists(path)) {
    remove_tree(old);
    VOLT_CHECK(::rename(path.c_str(), old.c_str()) == 0, CheckpointError, save.tag,
               " cannot move the previous checkpoint '", path, "' aside (", std::strerror(errno),
               "); it is kept, the new one is in '", staging, "'.");
  }
  VOLT_CHECK(::rename(staging.c_str(), path.c_str()) == 0, CheckpointError, save.tag,
             " cannot move the checkpoint into '", path, "' (", std::strerror(errno),
             "); the previous one is in '", old, "'.");
  fsync_parent(path);
  remove_tree(old);
}

}  // namespace

void save_checkpoint_folder(Strategy& strategy, OutputArchive& archive, const FolderSave& given) {
  strategy.barrier("checkpoint_folder_begin");
  FolderSave save = given;
  save.path = broadcast_string(strategy, given.path);
  const std::string& path = save.path;
  const std::string staging = path + ".partial", old = path + ".old";
  // Each part runs where it belongs, then every rank learns whether all of them succeeded: a
  // rank that failed rethrows its own error, the others stop at once naming the part, and the
  // previous checkpoint at `path` stays. A failure before the swap removes the staging folder.
  auto part = [&](bool mine, const std::function<void()>& work, const char* what, bool clean) {
    const bool ok = [&] {
      try {
        return run_agreeing(strategy, mine, work);
      } catch (...) {
        if (clean && strategy.is_global_zero()) remove_tree(staging);
        throw;
      }
    }();
    if (!ok && clean && strategy.is_global_zero()) remove_tree(staging);
    VOLT_CHECK(ok, CheckpointError, save.tag, " another rank failed ", what, " '", path,
               "' (its error says why); the previous checkpoint there is kept.");
  };
  part(
      strategy.is_global_zero(), [&] { stage(save, staging, old); }, "to stage", true);
  part(
      !save.shard.empty(),
      [&] {
        strategy.checkpoint_io().save(archive, staging + "/" + save.shard);
        // The folder is swapped in below only once every shard is on disk: a CheckpointIO that
        // writes in the background (AsyncCheckpointIO) finishes here.
        strategy.checkpoint_io().flush();
      },
      "to write its shard of", true);
  part(
      strategy.is_global_zero(), [&] { check_shards(save, staging); }, "to find every shard of",
      true);
  part(
      strategy.is_global_zero(), [&] { swap_in(save, staging, old); }, "to swap in", false);
}

}  // namespace detail
}  // namespace volt
