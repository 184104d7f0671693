#pragma once
// The CLI's raw configuration: a YAML-like tree in which every node remembers where it came
// from (file:line:column or the --override), merged from config files and overrides in order.
// No torch includes: this TU family compiles in a second.

#include <string>
#include <utility>
#include <vector>

namespace volt {
namespace detail {

struct ConfigNode {
  enum class Kind { kNull, kScalar, kList, kMap };
  Kind kind = Kind::kNull;
  std::string scalar;             // kScalar: the text as written
  bool quoted = false;            // kScalar: written in quotes (never null)
  std::vector<ConfigNode> items;  // kList
  std::vector<std::pair<std::string, ConfigNode>> fields;  // kMap, in file order
  std::string origin;  // "run.yaml:3:15" or "--trainer.max_epochs=3"
  /// A mapping or list read from a command-line value: the text as typed, which a string
  /// parameter takes as it is (--filename={epoch} is a file name, not the mapping {epoch: null}).
  std::string typed;
  /// An init_args entry set for an earlier class_path of its component: as in jsonargparse, the
  /// new class keeps it when it takes a parameter of that name, and it is dropped otherwise.
  bool carried = false;
  /// A list `+=` started where no value was set: its items follow the parameter's default, as
  /// jsonargparse appends to the default (--model.hidden+=64 on [256, 128]: [256, 128, 64]).
  bool extends_default = false;

  bool is_map() const { return kind == Kind::kMap; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_scalar() const { return kind == Kind::kScalar; }
  bool is_null() const { return kind == Kind::kNull; }
  /// nullptr when absent (kMap only).
  const ConfigNode* find(const std::string& key) const;
  ConfigNode* find(const std::string& key);
  /// Inserts an empty node when absent (kMap only).
  ConfigNode& field(const std::string& key, const std::string& origin);
  /// A short description for messages: "\"three\"", "a list", "a mapping", "null".
  std::string describe() const;

  static ConfigNode make_map(std::string origin);
  static ConfigNode make_scalar(std::string text, std::string origin);
};

/// Parses YAML text; `source` names it in origins and errors ("run.yaml"). Malformed YAML throws
/// ConfigError "[cli] <source>:<line>:<col>: malformed YAML (...)".
ConfigNode parse_yaml(const std::string& text, const std::string& source);
/// Parses the text of a config file named `source`: YAML that must be a mapping (an empty file
/// is an empty mapping); ConfigError otherwise. load_yaml_file reads the file and calls it.
ConfigNode parse_config_text(const std::string& text, const std::string& source);
/// Reads and parses a YAML config file (ConfigError when unreadable, malformed or no mapping).
ConfigNode load_yaml_file(const std::string& path);

/// Component slots hold {class_path, init_args}: model, data, trainer.profiler,
/// trainer.checkpoint_io, trainer.callbacks.<i>, trainer.loggers.<i>.
bool is_component_path(const std::vector<std::string>& path);
/// Rewrites shorthand into the canonical form: a bare name becomes {class_path: name}; other keys
/// beside class_path move under init_args. Applied to every component slot under `node`.
void canonicalize(ConfigNode& node, const std::vector<std::string>& path = {});
/// Merges `src` over `dst`: maps key by key, anything else replaced. A component whose
/// class_path changes drops the old init_args. `src` is taken by value: pass std::move(tree)
/// where the caller is done with it, and its nodes move instead of being copied.
void merge(ConfigNode& dst, ConfigNode src, const std::vector<std::string>& path = {});
/// Merges each of `fields` into the mapping `dst` at `path`, as merge does for a mapping's fields
/// (a key it lacks is added at the end). Linear in the keys of both.
void merge_fields(ConfigNode& dst, std::vector<std::pair<std::string, ConfigNode>> fields,
                  const std::vector<std::string>& path);

/// Applies one "--a.b.c=value" override ("+=" appends to a list). `value` is parsed as YAML
/// (flow lists and maps work) except that an empty value is the empty string ("--a.b.c=null" is
/// null); text that is not YAML is taken literally. Shorthand paths (model.lr) map to init_args.
void apply_override(ConfigNode& root, const std::string& dotted_key, const std::string& value,
                    bool append, const std::string& origin);

/// Splits "a.b.c" at dots.
std::vector<std::string> split_path(const std::string& dotted);
std::string join_path(const std::vector<std::string>& path);

}  // namespace detail
}  // namespace volt
