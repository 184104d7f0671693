// libFuzzer target: the YAML config path of `volt print-config --config FILE [--overrides]`:
// parse (bounded YAML -> ConfigNode, detail::parse_config_text, which load_yaml_file calls),
// canonicalize and merge as run_cli's build_tree does, overrides through apply_override,
// detail::resolve against the real registry plus a model taking every parameter type, and
// detail::to_yaml. Bad input must end in a ConfigError. For accepted input, the printed config
// must load back to the same text (the print-config contract of docs/ARCHITECTURE.md), and the
// tree parse_yaml builds from the parser's events must equal the reference, yaml-cpp's own tree
// converted node by node (tests/support/yaml_reference_tree.h). Anything else is a finding.
//
// Input: the config file's text; after a line "#--", each line "key=value" or "key+=value" is a
// command-line override (--key=value).

#include <cstdint>
#include <string>

#include "cli/detail/config_tree.h"
#include "cli/detail/resolve.h"
#include "fuzz_common.h"
#include "volt/core/errors.h"
#include "volt/core/registry.h"
#include "yaml_reference_tree.h"

namespace {

using volt::detail::ConfigNode;

/// volt's built-ins plus one model with every parameter type and one data module, as a user's
/// binary registers them (factories are never called: nothing is built).
const volt::Registry& fuzz_registry() {
  static const volt::Registry reg = [] {
    volt::Registry r = volt::registry();
    r.models.add("Everything", "every parameter type",
                 volt::Params()
                     .required<int64_t>("width", "units")
                     .add("lr", 1e-3, "lr")
                     .add("fused", true, "flag")
                     .add("name", "{epoch}-x", "a string needing quotes")
                     .add("empty", "", "an empty string")
                     .add("hidden", std::vector<int64_t>{256, 128}, "ints")
                     .add("betas", std::vector<double>{0.9, 0.999}, "floats")
                     .add("tags", std::vector<std::string>{"a", "null", "32-true"}, "strings")
                     .choice("mode", "min", {"min", "max"}, "choice")
                     .number("limit", int64_t{10}, "int or float")
                     .optional<double>("max_time", "nullable"),
                 [](const volt::Args&) -> std::shared_ptr<volt::Module> { return nullptr; });
    r.models.add("Other", "no parameters", volt::Params(),
                 [](const volt::Args&) -> std::shared_ptr<volt::Module> { return nullptr; });
    r.data_modules.add(
        "Blobs", "rows", volt::Params().add("n", int64_t{64}, "rows"),
        [](const volt::Args&) -> std::shared_ptr<volt::DataModule> { return nullptr; });
    return r;
  }();
  return reg;
}

/// run_cli's build_tree for one file and its overrides, then resolve and print.
std::string print_config(const std::string& text, const std::string& overrides,
                         const std::string& source) {
  ConfigNode root = ConfigNode::make_map("defaults");
  ConfigNode file = volt::detail::parse_config_text(text, source);
  volt::detail::canonicalize(file);
  volt::detail::merge(root, file);
  size_t pos = 0;
  while (pos < overrides.size()) {
    size_t end = overrides.find('\n', pos);
    if (end == std::string::npos) end = overrides.size();
    const std::string line = overrides.substr(pos, end - pos);
    pos = end + 1;
    const size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    std::string key = line.substr(0, eq);
    const bool append = key.back() == '+';
    if (append) key.pop_back();
    if (key.empty()) continue;
    volt::detail::apply_override(root, key, line.substr(eq + 1), append, "--" + line);
  }
  return volt::detail::to_yaml(volt::detail::resolve(root, fuzz_registry()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find("\n#--\n");
  const std::string text = input.substr(0, split);
  const std::string overrides = split == std::string::npos ? "" : input.substr(split + 5);
  // parse_yaml's tree against the reference's (the config text alone, before any override).
  if (const std::string m = volt_test::tree_mismatch(text); !m.empty()) volt_fuzz::finding(m);
  std::string printed;
  try {
    printed = print_config(text, overrides, "fuzz.yaml");
  } catch (const volt::ConfigError& e) {
    volt_fuzz::trace(std::string("refused: ") + e.what());
    return 0;
  } catch (const std::exception& e) {
    volt_fuzz::finding(std::string("the config path let a non-ConfigError escape: ") + e.what());
  }
  volt_fuzz::trace("accepted:\n" + printed);
  std::string again;
  try {
    again = print_config(printed, "", "printed.yaml");
  } catch (const std::exception& e) {
    volt_fuzz::finding("print-config output does not load back (" + std::string(e.what()) + "):\n" +
                       printed);
  }
  if (again != printed) {
    volt_fuzz::finding("print-config output loads back to other text:\n" + printed +
                       "---- loads back as ----\n" + again);
  }
  return 0;
}
