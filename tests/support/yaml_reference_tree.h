#pragma once
// The reference for the CLI's config tree: yaml-cpp's own node tree (YAML::Load), converted node
// by node, as detail::parse_yaml built it until session 91. parse_yaml now builds the tree from
// the parser's events (no yaml-cpp tree, about half the memory, a hash set per mapping for
// duplicate keys); both must give the same tree (tree_mismatch). Used by
// tests/cli/config_tree_test.cpp and fuzz_config (fuzz/config_fuzzer.cpp).

#include <yaml-cpp/yaml.h>

#include <stdexcept>
#include <string>

#include "cli/detail/config_tree.h"
#include "volt/core/errors.h"

namespace volt_test {

inline std::string yaml_reference_where(const std::string& source, const YAML::Mark& m) {
  if (m.is_null()) return source;
  return source + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

/// The tree of `y`; std::runtime_error naming the key's place where parse_yaml refuses a key (one
/// that is not a scalar, or appears twice in its mapping).
inline volt::detail::ConfigNode yaml_reference_tree(const YAML::Node& y,
                                                    const std::string& source) {
  using volt::detail::ConfigNode;
  ConfigNode n;
  n.origin = yaml_reference_where(source, y.Mark());
  switch (y.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null: n.kind = ConfigNode::Kind::kNull; break;
    case YAML::NodeType::Scalar:
      n.kind = ConfigNode::Kind::kScalar;
      n.scalar = y.Scalar();
      n.quoted = y.Tag() == "!";
      break;
    case YAML::NodeType::Sequence:
      n.kind = ConfigNode::Kind::kList;
      for (const auto& item : y) n.items.push_back(yaml_reference_tree(item, source));
      break;
    case YAML::NodeType::Map: {
      n.kind = ConfigNode::Kind::kMap;
      // YAML's merge key, which yaml-cpp 0.7 leaves as a key "<<": the named mappings' fields
      // the mapping lacks, the earlier mapping's first.
      std::vector<ConfigNode> merges;
      bool merged = false;
      for (const auto& kv : y) {
        const std::string at = yaml_reference_where(source, kv.first.Mark());
        if (!kv.first.IsScalar()) throw std::runtime_error(at + ": key is not a scalar");
        if (kv.first.Scalar() == "<<" && kv.first.Tag() != "!") {
          if (merged) throw std::runtime_error(at + ": key twice");
          merged = true;
          ConfigNode v = yaml_reference_tree(kv.second, source);
          if (v.is_map()) {
            merges.push_back(v);
            continue;
          }
          if (!v.is_list()) throw std::runtime_error(at + ": merge value");
          for (const auto& item : v.items) {
            if (!item.is_map()) throw std::runtime_error(at + ": merge value");
            merges.push_back(item);
          }
          continue;
        }
        if (n.find(kv.first.Scalar()) != nullptr) throw std::runtime_error(at + ": key twice");
        n.fields.emplace_back(kv.first.Scalar(), yaml_reference_tree(kv.second, source));
      }
      for (const auto& m : merges) {
        for (const auto& kv : m.fields) {
          if (n.find(kv.first) == nullptr) n.fields.push_back(kv);
        }
      }
      break;
    }
  }
  return n;
}

/// True for parse_yaml's refusals of a key (not a scalar, twice in a mapping, a merge key naming
/// no mapping), which the
/// reference makes too. Its other refusals come before any tree is built (the input limits, an
/// alias cycle, bad syntax): there the reference would expand a bomb or a cycle without end.
inline bool refuses_a_key(const std::string& message) {
  return message.find("a mapping key must be") != std::string::npos ||
         message.find("appears twice in one mapping") != std::string::npos ||
         message.find("the merge key << takes") != std::string::npos;
}

/// Every member of the tree as text, one node per line, for comparing trees with a readable diff.
inline std::string yaml_tree_text(const volt::detail::ConfigNode& n,
                                  const std::string& indent = "") {
  using volt::detail::ConfigNode;
  static const char* const kKinds[] = {"null", "scalar", "list", "map"};
  std::string s = indent + kKinds[static_cast<int>(n.kind)] + " @" + n.origin;
  if (n.is_scalar()) s += (n.quoted ? " quoted \"" : " plain \"") + n.scalar + "\"";
  if (!n.typed.empty()) s += " typed \"" + n.typed + "\"";
  if (n.carried) s += " carried";
  s += "\n";
  for (const auto& i : n.items) s += yaml_tree_text(i, indent + "  ");
  for (const auto& f : n.fields) {
    s += indent + "  key \"" + f.first + "\"\n" + yaml_tree_text(f.second, indent + "    ");
  }
  return s;
}

/// "" when parse_yaml and the reference agree on `text` (the same tree, or both refuse a key),
/// or when parse_yaml refuses it before building any tree (which the reference cannot judge);
/// otherwise what differs, both sides shown.
inline std::string tree_mismatch(const std::string& text) {
  std::string events;
  try {
    events = yaml_tree_text(volt::detail::parse_yaml(text, "t.yaml"));
  } catch (const volt::ConfigError& e) {
    if (!refuses_a_key(e.what())) return "";
    events = std::string("refused: ") + e.what();
  }
  std::string reference;
  try {
    reference = yaml_tree_text(yaml_reference_tree(YAML::Load(text), "t.yaml"));
  } catch (const std::exception& e) {
    reference = std::string("refused: ") + e.what();
  }
  const bool both_refuse =
      events.rfind("refused: ", 0) == 0 && reference.rfind("refused: ", 0) == 0;
  if (both_refuse || events == reference) return "";
  return "parse_yaml's tree differs from the reference:\n" + events + "---- reference ----\n" +
         reference;
}

}  // namespace volt_test
