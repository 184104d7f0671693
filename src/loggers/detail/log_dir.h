#pragma once
// Run-folder helpers shared by the loggers: save_dir/name/version_N.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "volt/core/types.h"

namespace torch {
namespace serialize {
class InputArchive;
class OutputArchive;
}  // namespace serialize
}  // namespace torch

namespace volt {
namespace detail {

/// mkdir -p; throws ConfigError "[<component>] cannot create folder ..." on failure.
void make_dirs(const std::string& path, const std::string& component);

/// max(N of existing root/version_N) + 1, or 0 when there is none.
int64_t next_version(const std::string& root);

/// Creates root/version_N for the next free N and returns N. The folder is claimed by its own
/// mkdir: two runs starting at once into one root get different versions (next_version alone
/// would give both the same).
int64_t claim_next_version(const std::string& root, const std::string& component);

/// `save_dir/name` as a checkpoint records it: absolute and lexically normal.
std::string version_root(const std::string& save_dir, const std::string& name);

/// Whether a resumed logger numbering the folder `root` (version_root) with the version option
/// `option_version` continues the checkpoint's version `saved` of the folder `saved_root` ("" in
/// checkpoints before session 99: taken as the same). Only the same folder continues, and only
/// when no other version is asked for: a run resumed into another save_dir or name (or told
/// another version) would otherwise drop a different run's rows after the checkpoint's step and
/// write into its folder. Otherwise warns (as `component`) and returns false: the logger keeps
/// its own version.
bool continues_saved_version(const std::string& saved_root, int64_t saved, const std::string& root,
                             int64_t option_version, const std::string& component);

/// A logger's checkpoint state: its version (-1: none claimed yet) and version_root(save_dir,
/// name).
void save_version_state(torch::serialize::OutputArchive& archive, int64_t version,
                        const std::string& save_dir, const std::string& name);

/// The version a resumed logger continues: the checkpoint's when it claimed one and
/// continues_saved_version agrees, else -1 (the logger keeps its own). A version the logger had
/// already claimed (`claimed` >= 0, numbered by it: `option_version` -1) is given back when the
/// resume switches away from it and its folder is still empty (a profiler's early log_dir()
/// left an empty version_N+1 beside the run's own).
int64_t resumed_version(torch::serialize::InputArchive& archive, const std::string& save_dir,
                        const std::string& name, int64_t option_version, int64_t claimed,
                        const std::string& component);

/// `metrics` with every name behind `prefix` and "-" (Lightning's _add_prefix with
/// LOGGER_JOIN_CHAR); unchanged without a prefix.
Metrics with_prefix(const Metrics& metrics, const std::string& prefix);

/// Whether `s` is a number as C++ and Python print one ("12", "-0.5", "1e-05"): text that YAML
/// and TensorBoard readers take back as that number. Other text a parser would accept ("0x1F",
/// "010", " 12", "+5", ".5") is not.
bool is_printed_number(const std::string& s);

/// Writes `hparams` to dir/hparams.yaml atomically, as Lightning's save_hparams_to_yaml: one
/// string value per key, quoted where a YAML 1.1 reader (PyYAML) would read another type.
void write_hparams_yaml(const std::string& dir, const std::map<std::string, std::string>& hparams);

/// While one is alive, the loggers of this process that claim the next version of one of `roots`
/// (claim_next_version) share it: the first claim makes the folder, the later ones take its
/// number. The CLI's loggers of one run write one version_N this way, claimed when the first of
/// them writes (a run that fails before writing leaves no folder, and a run started at the same
/// time into the same root gets a version of its own). One set at a time per process; a root
/// already shared by another live set is left to that set.
class SharedVersionClaims {
 public:
  explicit SharedVersionClaims(const std::vector<std::string>& roots);
  ~SharedVersionClaims();
  SharedVersionClaims(const SharedVersionClaims&) = delete;
  SharedVersionClaims& operator=(const SharedVersionClaims&) = delete;

 private:
  std::vector<std::string> roots_;  // the ones this set registered
};

}  // namespace detail
}  // namespace volt
