#include "input_limits.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <istream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/detail/numbers.h"
#include "volt/core/check.h"

namespace volt {
namespace detail {
namespace {

constexpr const char* kSeeDocs = " (docs/ARCHITECTURE.md, \"Input limits\")";

std::string at(const std::string& source, const YAML::Mark& m) {
  if (m.is_null()) return source;
  return source + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

void check_size(size_t bytes, const std::string& component, const std::string& source,
                const InputLimits& limits) {
  VOLT_CHECK(bytes <= limits.max_bytes, ConfigError, "[", component, "] ", source, ": more than ",
             limits.max_bytes, " bytes, the limit on a YAML or JSON file volt reads", kSeeDocs,
             "; pass a smaller file.");
}

// Streams the parser's events and sizes the document as if every alias were expanded, without
// expanding any: an anchored node's expanded size and depth are recorded when it ends, and an
// alias adds them. So "billion laughs" is refused after reading its few hundred bytes.
class YamlBudget : public YAML::EventHandler {
 public:
  /// By anchor: whether an alias refers to it (so far).
  const std::vector<bool>& aliased() const { return aliased_; }

  YamlBudget(const std::string& component, const std::string& source, const InputLimits& limits)
      : component_(component), source_(source), limits_(limits) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t anchor) override { leaf(m, anchor); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t anchor,
                const std::string&) override {
    leaf(m, anchor);
  }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t anchor) override {
    // yaml-cpp itself rejects an alias to an anchor it has not seen.
    VOLT_ASSERT(anchor < anchors_.size() && anchors_[anchor].seen, "unknown YAML anchor");
    const Anchor& a = anchors_[anchor];
    VOLT_CHECK(a.complete, ConfigError, "[", component_, "] ", at(source_, m),
               ": this alias refers to a node that contains it, which would expand forever; "
               "write the value out instead of the alias.");
    count(m, a.nodes, a.depth);
    aliased_[anchor] = true;
    alias_nodes_ += a.nodes;  // <= total_, which count() keeps <= max_nodes
    VOLT_CHECK(alias_nodes_ <= limits_.max_alias_nodes, ConfigError, "[", component_, "] ",
               at(source_, m), ": the aliases (*name) expand to more than ",
               limits_.max_alias_nodes,
               " nodes, the limit on what aliases add to a YAML file volt reads", kSeeDocs,
               "; write the values out or use fewer aliases.");
    add_to_parent(a.nodes, a.depth);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(m, anchor);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(m, anchor);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Anchor {
    bool seen = false, complete = false;
    size_t nodes = 0, depth = 0;
  };
  struct Open {
    YAML::anchor_t anchor;
    size_t nodes;  // this collection and its children so far, aliases expanded
    size_t depth;  // levels it spans so far (1 + its deepest child's)
  };

  Anchor& anchor_slot(YAML::anchor_t anchor) {
    if (anchor >= anchors_.size()) {
      anchors_.resize(anchor + 1);
      aliased_.resize(anchor + 1);
    }
    anchors_[anchor].seen = true;
    return anchors_[anchor];
  }

  // Counts `nodes` more nodes in the document (aliases expanded) reaching `depth` levels below
  // the open collections, and refuses the document as soon as either limit is passed.
  void count(const YAML::Mark& m, size_t nodes, size_t depth) {
    total_ += nodes;  // each term is <= max_nodes (checked when it was formed): no overflow
    VOLT_CHECK(total_ <= limits_.max_nodes, ConfigError, "[", component_, "] ", at(source_, m),
               ": the document holds more than ", limits_.max_nodes,
               " nodes once its aliases (*name) are expanded, the limit on a YAML or JSON file "
               "volt reads",
               kSeeDocs, "; write the values out or use fewer aliases.");
    VOLT_CHECK(stack_.size() + depth <= limits_.max_depth, ConfigError, "[", component_, "] ",
               at(source_, m), ": lists and mappings nest more than ", limits_.max_depth,
               " levels deep (aliases expanded), the limit on a YAML or JSON file volt reads",
               kSeeDocs, "; flatten the structure.");
  }

  // A finished child of `nodes` nodes spanning `depth` levels (0 for a scalar).
  void add_to_parent(size_t nodes, size_t depth) {
    if (stack_.empty()) return;
    stack_.back().nodes += nodes;
    stack_.back().depth = std::max(stack_.back().depth, depth + 1);
  }

  void leaf(const YAML::Mark& m, YAML::anchor_t anchor) {
    if (anchor != YAML::NullAnchor) anchor_slot(anchor) = {true, true, 1, 0};
    count(m, 1, 0);
    add_to_parent(1, 0);
  }

  void open(const YAML::Mark& m, YAML::anchor_t anchor) {
    count(m, 1, 1);
    // Seen but not complete: an alias to it from inside it is a cycle.
    if (anchor != YAML::NullAnchor) anchor_slot(anchor);
    stack_.push_back({anchor, 1, 1});
  }

  void close() {
    const Open done = stack_.back();
    stack_.pop_back();
    if (done.anchor != YAML::NullAnchor) {
      anchors_[done.anchor] = {true, true, done.nodes, done.depth};
    }
    add_to_parent(done.nodes, done.depth);
  }

  const std::string& component_;
  const std::string& source_;
  const InputLimits& limits_;
  std::vector<Anchor> anchors_;
  std::vector<bool> aliased_;  // by anchor: some alias refers to it
  std::vector<Open> stack_;
  size_t total_ = 0;
  size_t alias_nodes_ = 0;  // nodes the aliases so far expand to
};

}  // namespace

std::string read_bounded(std::istream& in, const std::string& component, const std::string& source,
                         const InputLimits& limits) {
  std::string out;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    out.append(buf, static_cast<size_t>(in.gcount()));
    check_size(out.size(), component, source, limits);
  }
  // A read error, not the end of the input: a folder given as a file opens, and its first read
  // fails (EISDIR). It read as empty, so `--config some_folder/` was an empty configuration.
  VOLT_CHECK(!in.bad(), ConfigError, "[", component, "] cannot read ", source,
             ": a read error, not the end of the input (is it a folder?); give a readable file.");
  return out;
}

namespace {

// The streaming pass of load_yaml_bounded and parse_yaml_bounded: refuses `text` (a violation
// throws ConfigError, malformed YAML propagates as YAML::ParserException) before anything is
// built from it. Returns, by anchor, whether an alias refers to it.
std::vector<bool> check_yaml(const std::string& text, const std::string& component,
                             const std::string& source, const InputLimits& limits) {
  check_size(text.size(), component, source, limits);
  auto in = detail::c_stream<std::istringstream>(text);
  YAML::Parser parser(in);
  YamlBudget budget(component, source, limits);
  parser.HandleNextDocument(budget);
  // YAML::Load reads the first document only: what follows a "---" would be dropped unread
  // (PyYAML's safe_load, LightningCLI's reader, refuses a second document too).
  YamlBudget rest(component, source, limits);
  VOLT_CHECK(!parser.HandleNextDocument(rest), ConfigError, "[", component, "] ", source,
             ": more than one YAML document (a line \"---\" starts another); keep one, or "
             "split them into files of their own (--config takes several).");
  return budget.aliased();
}

}  // namespace

YAML::Node load_yaml_bounded(const std::string& text, const std::string& component,
                             const std::string& source, const InputLimits& limits) {
  check_yaml(text, component, source, limits);
  // Within the limits: yaml-cpp's own tree keeps aliases shared, so loading costs O(text).
  return YAML::Load(text);
}

void parse_yaml_bounded(const std::string& text, const std::string& component,
                        const std::string& source, YamlSink& sink, const InputLimits& limits) {
  sink.aliased_anchors(check_yaml(text, component, source, limits));
  auto in = detail::c_stream<std::istringstream>(text);
  YAML::Parser parser(in);
  parser.HandleNextDocument(sink);
}

nlohmann::json parse_json_bounded(const std::string& text, const std::string& component,
                                  const std::string& source, const InputLimits& limits,
                                  const std::string& fix) {
  check_size(text.size(), component, source, limits);
  size_t nodes = 0;
  // nlohmann's parser is iterative, but its callers (dump, and volt's readers of the result)
  // recurse: bound the depth here, while parsing, as for YAML.
  auto budget = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    const bool starts = event == E::object_start || event == E::array_start;
    if (starts || event == E::key || (event == E::value && !parsed.is_structured())) {
      VOLT_CHECK(++nodes <= limits.max_nodes, ConfigError, "[", component, "] ", source,
                 ": more than ", limits.max_nodes,
                 " nodes, the limit on a YAML or JSON file volt reads", kSeeDocs,
                 "; pass a smaller file.");
    }
    VOLT_CHECK(!starts || static_cast<size_t>(depth) + 1 <= limits.max_depth, ConfigError, "[",
               component, "] ", source, ": arrays and objects nest more than ", limits.max_depth,
               " levels deep, the limit on a YAML or JSON file volt reads", kSeeDocs,
               "; flatten the structure.");
    return true;
  };
  try {
    return nlohmann::json::parse(text, budget);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number beyond double's range (1e400: found by
    // fuzz_json_configs; nlohmann throws it while parsing, not a parse_error).
    VOLT_CHECK(false, ConfigError, "[", component, "] ", source, ": malformed JSON (", e.what(),
               "); ", fix, ".");
  }
  return {};
}

}  // namespace detail
}  // namespace volt
