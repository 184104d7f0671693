#include "config_tree.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "core/detail/ascii.h"
#include "core/detail/input_limits.h"
#include "core/detail/numbers.h"
#include "volt/core/check.h"

namespace volt {
namespace detail {

// -------------------------------------------------------------------------------- ConfigNode

const ConfigNode* ConfigNode::find(const std::string& key) const {
  for (const auto& f : fields) {
    if (f.first == key) return &f.second;
  }
  return nullptr;
}

ConfigNode* ConfigNode::find(const std::string& key) {
  for (auto& f : fields) {
    if (f.first == key) return &f.second;
  }
  return nullptr;
}

ConfigNode& ConfigNode::field(const std::string& key, const std::string& origin) {
  VOLT_ASSERT(kind == Kind::kMap, "field() on a non-map node");
  if (ConfigNode* n = find(key)) return *n;
  ConfigNode n;
  n.origin = origin;
  fields.emplace_back(key, std::move(n));
  return fields.back().second;
}

std::string ConfigNode::describe() const {
  switch (kind) {
    case Kind::kNull: return "null";
    case Kind::kScalar: return "\"" + scalar + "\"";
    case Kind::kList: return "a list";
    case Kind::kMap: return "a mapping";
  }
  return "?";
}

ConfigNode ConfigNode::make_map(std::string origin) {
  ConfigNode n;
  n.kind = Kind::kMap;
  n.origin = std::move(origin);
  return n;
}

ConfigNode ConfigNode::make_scalar(std::string text, std::string origin) {
  ConfigNode n;
  n.kind = Kind::kScalar;
  n.scalar = std::move(text);
  n.origin = std::move(origin);
  return n;
}

// ------------------------------------------------------------------------------------ parsing

namespace {

std::string where(const std::string& source, const YAML::Mark& m) {
  if (m.is_null()) return source;
  return source + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

// Builds the tree straight from the parser's events (parse_yaml_bounded has checked the text
// first), never making yaml-cpp's own node tree: that costs about 470 bytes a node, where a
// ConfigNode costs about 200. An alias is expanded here, as a copy of its anchored node, kept
// only for anchors an alias uses (the checks bound what aliases add, hence those copies). Duplicate
// keys are found through a hash set per open mapping: a search per key made a mapping of n keys
// cost O(n^2) (80,000 keys took 9 s).
// TreeBuilder's refusal of a key a config cannot hold (not a name, twice, a merge key naming no
// mapping): a ConfigError for files; an override taking it is text (apply_override).
class KeyRefused : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

class TreeBuilder : public YamlSink {
 public:
  explicit TreeBuilder(const std::string& source) : source_(source) { root_.origin = source; }
  ConfigNode take() { return std::move(root_); }

  void aliased_anchors(std::vector<bool> aliased) override { aliased_ = std::move(aliased); }
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t anchor) override {
    ConfigNode n;
    n.origin = where(source_, m);
    done(std::move(n), anchor);
  }
  void OnScalar(const YAML::Mark& m, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    ConfigNode n = ConfigNode::make_scalar(value, where(source_, m));
    n.quoted = tag == "!";  // yaml-cpp tags quoted scalars "!", plain ones "?"
    done(std::move(n), anchor);
  }
  void OnAlias(const YAML::Mark&, YAML::anchor_t anchor) override {
    // The anchored node itself, its origin included (as yaml-cpp's alias is the same node).
    VOLT_ASSERT(anchor < anchors_.size(), "unknown YAML anchor");
    done(anchors_[anchor], YAML::NullAnchor);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(ConfigNode::Kind::kList, m, anchor);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(ConfigNode::Kind::kMap, m, anchor);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Open {
    ConfigNode node;
    YAML::anchor_t anchor = YAML::NullAnchor;
    std::unordered_set<std::string> keys;  // kMap: the keys so far
    std::optional<std::string> key;        // kMap: read, its value not yet
    bool merge_key = false;                // kMap: `key` is the merge key <<
    bool merged = false;                   // kMap: a merge key came
    std::vector<ConfigNode> merges;        // kMap: the mappings << names, in order
  };

  void open(ConfigNode::Kind kind, const YAML::Mark& m, YAML::anchor_t anchor) {
    Open o;
    o.node.kind = kind;
    o.node.origin = where(source_, m);
    o.anchor = anchor;
    stack_.push_back(std::move(o));
  }

  void close() {
    Open o = std::move(stack_.back());
    stack_.pop_back();
    // YAML's merge key (<<: *base): the named mappings' fields this one lacks, the earlier
    // mapping's first; the mapping's own keys win wherever they stand.
    for (ConfigNode& m : o.merges) {
      for (auto& kv : m.fields) {
        if (o.keys.insert(kv.first).second) o.node.fields.push_back(std::move(kv));
      }
    }
    done(std::move(o.node), o.anchor);
  }

  // The value of a merge key: a mapping or a list of mappings.
  static void take_merge(Open& parent, ConfigNode n) {
    bool ok = n.is_map() || n.is_list();  // an empty list merges nothing, as PyYAML
    for (const auto& item : n.items) ok = ok && item.is_map();
    VOLT_CHECK(ok, KeyRefused, "[cli] ", n.origin,
               ": the merge key << takes a mapping or a list of mappings (<<: *base), got ",
               n.describe(), ".");
    if (n.is_map()) {
      parent.merges.push_back(std::move(n));
    } else {
      for (auto& item : n.items) parent.merges.push_back(std::move(item));
    }
  }

  // A finished node: the root, a list item, a mapping's key or its value.
  void done(ConfigNode n, YAML::anchor_t anchor) {
    if (anchor < aliased_.size() && aliased_[anchor]) {
      if (anchor >= anchors_.size()) anchors_.resize(anchor + 1);
      anchors_[anchor] = n;
    }
    if (stack_.empty()) {
      root_ = std::move(n);
      return;
    }
    Open& parent = stack_.back();
    if (parent.node.is_list()) {
      parent.node.items.push_back(std::move(n));
    } else if (!parent.key) {
      VOLT_CHECK(n.is_scalar(), KeyRefused, "[cli] ", n.origin,
                 ": a mapping key must be a plain name; write key: value.");
      parent.merge_key = !n.quoted && n.scalar == "<<";
      VOLT_CHECK(parent.merge_key ? !std::exchange(parent.merged, true)
                                  : parent.keys.insert(n.scalar).second,
                 KeyRefused, "[cli] ", n.origin, ": key \"", n.scalar,
                 "\" appears twice in one mapping; keep one.");
      parent.key = std::move(n.scalar);
    } else if (parent.merge_key) {
      take_merge(parent, std::move(n));
      parent.key.reset();
      parent.merge_key = false;
    } else {
      parent.node.fields.emplace_back(std::move(*parent.key), std::move(n));
      parent.key.reset();
    }
  }

  const std::string& source_;
  std::vector<Open> stack_;
  std::vector<bool> aliased_;        // by anchor: an alias uses it
  std::vector<ConfigNode> anchors_;  // by anchor: the aliased ones' nodes
  ConfigNode root_;
};

ConfigNode parse_bounded(const std::string& text, const std::string& source) {
  TreeBuilder tree(source);
  parse_yaml_bounded(text, "cli", source, tree);
  return tree.take();
}

void set_origin(ConfigNode& n, const std::string& origin) {
  n.origin = origin;
  for (auto& i : n.items) set_origin(i, origin);
  for (auto& f : n.fields) set_origin(f.second, origin);
}

bool is_index(const std::string& s) {
  return !s.empty() && s.size() < 9 &&
         std::all_of(s.begin(), s.end(), [](char c) { return detail::ascii_digit(c); });
}

/// False for text that starts with a flow collection but goes on after it closes, such as
/// "{epoch}-{step}": yaml-cpp would read its first part as a mapping and drop the rest.
bool is_one_flow_collection(const std::string& s) {
  if (s.empty() || (s[0] != '{' && s[0] != '[')) return true;
  int depth = 0;
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return s.find_first_not_of(" \t", i + 1) == std::string::npos;
    }
  }
  return true;  // unbalanced: let the YAML parser decide (it will fail)
}

}  // namespace

ConfigNode parse_yaml(const std::string& text, const std::string& source) {
  try {
    return parse_bounded(text, source);
  } catch (const YAML::ParserException& e) {
    VOLT_CHECK(false, ConfigError, "[cli] ", where(source, e.mark), ": malformed YAML (", e.msg,
               "); fix the syntax there.");
  }
  return {};
}

ConfigNode load_yaml_file(const std::string& path) {
  auto in = detail::c_stream<std::ifstream>(path, std::ios::binary);
  VOLT_CHECK(in.good(), ConfigError, "[cli] cannot read config file \"", path,
             "\"; check the path given to --config.");
  return parse_config_text(read_bounded(in, "cli", path), path);
}

ConfigNode parse_config_text(const std::string& text, const std::string& source) {
  ConfigNode n = parse_yaml(text, source);
  VOLT_CHECK(n.is_map() || n.is_null(), ConfigError, "[cli] ", source,
             ": a config file must be a mapping (trainer:, model:, data: ...), got ", n.describe(),
             ".");
  if (n.is_null()) n = ConfigNode::make_map(source);
  return n;
}

// ------------------------------------------------------------------------------------- paths

std::vector<std::string> split_path(const std::string& dotted) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : dotted) {
    if (c == '.') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::string join_path(const std::vector<std::string>& path) {
  std::string s;
  for (const auto& p : path) s += (s.empty() ? "" : ".") + p;
  return s;
}

bool is_component_path(const std::vector<std::string>& path) {
  if (path.size() == 1) {
    return path[0] == "model" || path[0] == "data" || path[0] == "optimizer" ||
           path[0] == "lr_scheduler";
  }
  if (path.size() == 2) {
    return path[0] == "trainer" && (path[1] == "profiler" || path[1] == "checkpoint_io");
  }
  return path.size() == 3 && path[0] == "trainer" &&
         (path[1] == "callbacks" || path[1] == "loggers") && is_index(path[2]);
}

namespace {

// Where a class_path may change (a later file, --KEY.class_path=X) and the init_args set for the
// old class are carried: the components, and trainer.strategy / trainer.precision written as a
// component (they may also be a plain name, which canonicalize leaves as it is).
bool holds_class_path(const std::vector<std::string>& path) {
  return is_component_path(path) || (path.size() == 2 && path[0] == "trainer" &&
                                     (path[1] == "strategy" || path[1] == "precision"));
}

}  // namespace

void canonicalize(ConfigNode& node, const std::vector<std::string>& path) {
  if (is_component_path(path)) {
    if (node.is_scalar()) {
      ConfigNode m = ConfigNode::make_map(node.origin);
      m.fields.emplace_back("class_path", node);
      node = std::move(m);
    } else if (node.is_map()) {
      std::vector<std::pair<std::string, ConfigNode>> keep, shorthand;
      for (auto& f : node.fields) {
        const bool own = f.first == "class_path" || f.first == "init_args";
        (own ? keep : shorthand).push_back(std::move(f));
      }
      node.fields = std::move(keep);
      if (!shorthand.empty()) {
        ConfigNode& args = node.field("init_args", shorthand.front().second.origin);
        if (args.is_null()) args = ConfigNode::make_map(shorthand.front().second.origin);
        if (args.is_map()) {
          auto args_path = path;
          args_path.emplace_back("init_args");
          merge_fields(args, std::move(shorthand), args_path);
        }
      }
    }
  }
  auto child = path;
  child.emplace_back();
  for (size_t i = 0; i < node.items.size(); ++i) {
    child.back() = std::to_string(i);
    canonicalize(node.items[i], child);
  }
  for (auto& f : node.fields) {
    child.back() = f.first;
    canonicalize(f.second, child);
  }
}

void merge(ConfigNode& dst, ConfigNode src, const std::vector<std::string>& path) {
  if (!(dst.is_map() && src.is_map())) {
    dst = std::move(src);
    return;
  }
  dst.typed.clear();  // a union of two mappings is no longer the text typed for one
  dst.carried = false;
  if (holds_class_path(path)) {
    const ConfigNode* a = dst.find("class_path");
    const ConfigNode* b = src.find("class_path");
    if (a && b && a->scalar != b->scalar) {
      // Another class: its init_args keep what it takes (resolve drops the rest).
      if (ConfigNode* args = dst.find("init_args"); args != nullptr && args->is_map()) {
        for (auto& f : args->fields) f.second.carried = true;
      }
    }
  }
  merge_fields(dst, std::move(src.fields), path);
}

void merge_fields(ConfigNode& dst, std::vector<std::pair<std::string, ConfigNode>> fields,
                  const std::vector<std::string>& path) {
  VOLT_ASSERT(dst.is_map(), "merge_fields() into a non-map node");
  // Found through an index, not a search per key: merging n keys into n costs O(n), not O(n^2).
  // The views stay valid: the reserve keeps dst's keys in place.
  dst.fields.reserve(dst.fields.size() + fields.size());
  std::unordered_map<std::string_view, size_t> index;
  for (size_t i = 0; i < dst.fields.size(); ++i) index.emplace(dst.fields[i].first, i);
  auto child = path;
  child.emplace_back();
  for (auto& f : fields) {
    child.back() = f.first;
    size_t at = dst.fields.size();
    if (const auto it = index.find(f.first); it != index.end()) {
      at = it->second;
    } else {
      ConfigNode n;
      n.origin = f.second.origin;
      dst.fields.emplace_back(std::move(f.first), std::move(n));
      index.emplace(dst.fields.back().first, at);
    }
    merge(dst.fields[at].second, std::move(f.second), child);
  }
}

void apply_override(ConfigNode& root, const std::string& dotted_key, const std::string& value,
                    bool append, const std::string& origin) {
  std::vector<std::string> path = split_path(dotted_key);
  // As deep as a config file may nest (InputLimits::max_depth): walking a key of 64,000
  // segments copied its prefixes 2 billion times.
  VOLT_CHECK(path.size() <= InputLimits().max_depth, ConfigError, "[cli] ", origin,
             ": the key has ", path.size(), " segments, more than the ", InputLimits().max_depth,
             " levels a config may nest; shorten it.");
  for (const auto& seg : path) {
    VOLT_CHECK(!seg.empty(), ConfigError, "[cli] ", origin,
               ": empty key segment; write --section.key=value.");
  }
  // --model.class_path=X is --model=X: the class changes the same way (see merge).
  bool class_path_only = false;
  if (path.size() >= 2 && path.back() == "class_path" &&
      holds_class_path(std::vector<std::string>(path.begin(), path.end() - 1))) {
    path.pop_back();
    class_path_only = true;
  }
  // Shorthand: model.lr means model.init_args.lr.
  for (size_t i = 1; i < path.size(); ++i) {
    std::vector<std::string> prefix(path.begin(), path.begin() + i);
    if (is_component_path(prefix) && path[i] != "class_path" && path[i] != "init_args") {
      path.insert(path.begin() + i, "init_args");
      break;
    }
  }

  ConfigNode val;
  try {
    // "--key=" is the empty string (YAML would read it as null): otherwise a string set in a
    // config file could not be emptied from the command line. "--key=null" is null.
    if (value.empty() || !is_one_flow_collection(value)) {
      throw YAML::Exception(YAML::Mark::null_mark(), "");
    }
    try {
      val = parse_bounded(value, origin);
    } catch (const KeyRefused&) {
      // ": x" (a null key), "{a: 1, a: 2}": YAML reads a mapping no config can hold, so the
      // text is meant literally, as a string parameter takes "a: b".
      throw YAML::Exception(YAML::Mark::null_mark(), "");
    }
    // A plain scalar YAML read differently from what was typed (a " #" comment cut off, an
    // "&anchor" or "!tag" dropped): the text is meant literally, as for text that is no YAML.
    const auto first = value.find_first_not_of(" \t");
    const auto last = value.find_last_not_of(" \t");
    const std::string typed =
        first == std::string::npos ? std::string() : value.substr(first, last - first + 1);
    // ("!!str 123": YAML's own tags say how to read the text: kept.) The same for YAML's other
    // readings of text that does not look like them: a block scalar indicator ("|", ">-") read
    // as "", a lone tag or directive ("!", "%x") read as null.
    const bool tagged = typed.rfind("!!", 0) == 0;
    const bool quoted_text = !typed.empty() && (typed[0] == '"' || typed[0] == '\'');
    const bool null_text = typed == "null" || typed == "Null" || typed == "NULL" || typed == "~";
    if (val.is_scalar() && !tagged && (val.quoted ? !quoted_text : val.scalar != typed)) {
      throw YAML::Exception(YAML::Mark::null_mark(), "");
    }
    if (val.is_null() && !tagged && !null_text) throw YAML::Exception(YAML::Mark::null_mark(), "");
    if (val.is_map() || val.is_list()) val.typed = typed;
  } catch (const YAML::Exception&) {
    // Empty, or not YAML (e.g. the file name template {epoch}-{step}): take the text literally.
    val = ConfigNode::make_scalar(value, origin);
    val.quoted = true;
  }
  set_origin(val, origin);
  if (class_path_only) {
    VOLT_CHECK(val.is_scalar() || val.is_null(), ConfigError, "[cli] ", origin,
               ": a class_path is a name; got ", val.describe(), ".");
    ConfigNode m = ConfigNode::make_map(origin);
    m.fields.emplace_back("class_path", std::move(val));
    val = std::move(m);
  }

  ConfigNode* cur = &root;
  std::vector<std::string> walked;
  for (size_t i = 0; i < path.size(); ++i) {
    std::string seg = path[i];
    if (cur->is_null()) {
      *cur = ConfigNode::make_map(origin);
      if (is_index(seg)) cur->kind = ConfigNode::Kind::kList;  // trainer.callbacks.0.x
    }
    if (cur->is_list() && !is_index(seg)) {
      // LightningCLI's (jsonargparse's) rule: after `--trainer.callbacks+=EarlyStopping`,
      // `--trainer.callbacks.patience=5` sets the item appended last. It was an error whose
      // hint named item 0, which set another callback's value when followed.
      VOLT_CHECK(!cur->items.empty(), ConfigError, "[cli] ", origin, ": ", join_path(walked),
                 " is an empty list; append an item first (--", join_path(walked),
                 "+=NAME), whose ", seg, " this then sets.");
      walked.push_back(std::to_string(cur->items.size() - 1));
      cur = &cur->items.back();
      // A component item (a class name, or a mapping with a class_path) takes the key as an
      // init arg, as the shorthand above does for a path: it was set beside class_path, which
      // resolving then refused as an unknown key.
      // (Only a components list's items: a plain list of names stays a list of names.)
      const bool component = is_component_path(walked) &&
                             (cur->is_scalar() || (cur->is_map() && cur->find("class_path")));
      if (component && seg != "class_path" && seg != "init_args") {
        path.insert(path.begin() + static_cast<std::ptrdiff_t>(i), "init_args");
        seg = path[i];
      }
    }
    if (cur->is_list()) {
      VOLT_CHECK(is_index(seg), ConfigError, "[cli] ", origin, ": ", join_path(walked),
                 " is a list; index it with a number (", join_path(walked), ".0.", seg, ").");
      const size_t idx = std::stoul(seg);
      VOLT_CHECK(idx <= cur->items.size(), ConfigError, "[cli] ", origin, ": ", join_path(walked),
                 " has ", cur->items.size(), " item(s); index ", idx,
                 " is past the end (use += to append).");
      if (idx == cur->items.size()) {
        ConfigNode n;
        n.origin = origin;
        cur->items.push_back(std::move(n));
      }
      cur = &cur->items[idx];
    } else {
      if (cur->is_scalar() && (seg == "init_args" || seg == "class_path")) {
        // `--trainer.precision=fp8 --trainer.precision.init_args.quant=true`: the plain name
        // becomes the class_path of a component mapping (as jsonargparse does).
        ConfigNode m = ConfigNode::make_map(cur->origin);
        m.fields.emplace_back("class_path", *cur);
        *cur = std::move(m);
      }
      VOLT_CHECK(cur->is_map(), ConfigError, "[cli] ", origin, ": cannot set ", dotted_key,
                 " because ", join_path(walked), " is ", cur->describe(), ", not a mapping.");
      cur = &cur->field(seg, origin);
    }
    walked.push_back(seg);
  }

  if (append) {
    if (cur->is_null()) {
      // Absent (not a null someone wrote, which has an origin): the items go after the default.
      cur->extends_default = cur->origin.empty() || cur->origin == origin;
      cur->kind = ConfigNode::Kind::kList;
      cur->origin = origin;
    }
    VOLT_CHECK(cur->is_list(), ConfigError, "[cli] ", origin, ": += appends to a list but ",
               dotted_key, " is ", cur->describe(), "; use = to replace it.");
    cur->carried = false;  // set for the class in force now
    cur->typed.clear();
    std::vector<ConfigNode> add = val.is_list() ? val.items : std::vector<ConfigNode>{val};
    for (auto& n : add) {
      auto item_path = walked;
      item_path.push_back(std::to_string(cur->items.size()));
      canonicalize(n, item_path);
      cur->items.push_back(std::move(n));
    }
    return;
  }
  canonicalize(val, walked);
  merge(*cur, std::move(val), walked);
}

}  // namespace detail
}  // namespace volt
