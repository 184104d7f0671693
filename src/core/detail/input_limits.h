#pragma once
// Bounds on every YAML and JSON text volt reads (configs today; DeepSpeed and quantization JSON
// later). A small hostile file must not make volt use unbounded memory, time or stack: YAML
// aliases can expand a 1 KB file into billions of nodes ("billion laughs"), and deep nesting
// can overflow a recursive reader. Read such text only through these functions.
// No torch includes: compiles in a second.

#include <cstddef>
#include <iosfwd>
#include <string>

#include <yaml-cpp/eventhandler.h>
#include <nlohmann/json_fwd.hpp>
#include <vector>

namespace YAML {
class Node;
}  // namespace YAML

namespace volt {
namespace detail {

/// The limits, generous for real configs (which have hundreds of nodes, a dozen levels and a few
/// KB). Documented in docs/ARCHITECTURE.md ("Input limits").
struct InputLimits {
  /// Bytes of text (64 MiB).
  size_t max_bytes = size_t{64} << 20;
  /// Nodes (scalars, keys, nulls, lists, mappings) after expanding every YAML alias (1,000,000).
  size_t max_nodes = 1000000;
  /// Levels of nested lists and mappings, aliases expanded (128).
  size_t max_depth = 128;
  /// Nodes that YAML aliases add when expanded (20,000). A real config's anchors add tens to
  /// hundreds. The CLI's config tree costs about 0.6 KB per expanded node: under max_nodes alone,
  /// 324 bytes of aliases (672,610 nodes) made `volt print-config` take 360 MB and 3 s more.
  size_t max_alias_nodes = 20000;
};

/// Reads all of `in`, refusing more than `limits.max_bytes` before reading further (so a huge
/// file or /dev/zero costs nothing). Throws ConfigError "[<component>] <source>: ...".
std::string read_bounded(std::istream& in, const std::string& component, const std::string& source,
                         const InputLimits& limits = {});

/// Parses the first YAML document of `text` after checking it against `limits` in one streaming
/// pass that expands no alias (memory O(anchors), time O(text)): size, nodes with aliases
/// expanded, nodes the aliases add, depth, and aliases that refer to their own enclosing node (a
/// cycle). A violation throws one-line ConfigError "[<component>] <source>:<line>:<col>: ..."
/// naming the limit.
/// Malformed YAML propagates as YAML::ParserException so that callers can add their context
/// (or, like a command-line override, take the text literally).
YAML::Node load_yaml_bounded(const std::string& text, const std::string& component,
                             const std::string& source, const InputLimits& limits = {});
/// What parse_yaml_bounded streams a checked document to: which anchors aliases use, then the
/// parser's events (an alias comes as OnAlias; the sink expands it).
class YamlSink : public YAML::EventHandler {
 public:
  /// Called once, before the events: aliased[a] is true where an alias refers to anchor a.
  /// Keep a copy of only those: the limits bound what aliases add, not what anchors hold (127
  /// nested anchors over a million-item list, no alias, would be 127 copies of it).
  virtual void aliased_anchors(std::vector<bool> aliased) = 0;
};

/// The same checks, then the first document goes to `sink`, which builds its own tree: no
/// yaml-cpp node tree is made. That tree costs about 470 bytes a node (a 2 MB flow list of a
/// million numbers took 470 MB), so readers that keep their own tree, like the CLI's, read
/// through this.
void parse_yaml_bounded(const std::string& text, const std::string& component,
                        const std::string& source, YamlSink& sink, const InputLimits& limits = {});

/// Parses JSON `text` with the same size, node and depth limits (checked while parsing, through
/// nlohmann's parser callback). A violation or malformed JSON throws ConfigError
/// "[<component>] <source>: ..."; for malformed JSON the message ends with `fix` (what the user
/// should do about it).
nlohmann::json parse_json_bounded(const std::string& text, const std::string& component,
                                  const std::string& source, const InputLimits& limits = {},
                                  const std::string& fix = "fix the syntax there");

}  // namespace detail
}  // namespace volt
