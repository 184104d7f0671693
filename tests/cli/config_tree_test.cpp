// The CLI's raw config tree: YAML parsing with origins, shorthand, merging, overrides.

#include <gtest/gtest.h>

#include <fstream>

#include "cli/detail/config_tree.h"
#include "tiny.h"
#include "volt/core/errors.h"

namespace {

using volt::detail::apply_override;
using volt::detail::canonicalize;
using volt::detail::ConfigNode;
using volt::detail::merge;
using volt::detail::parse_yaml;

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const volt::ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

const ConfigNode& at(const ConfigNode& n, std::initializer_list<const char*> path) {
  const ConfigNode* cur = &n;
  for (const char* k : path) {
    const ConfigNode* next = cur->find(k);
    if (next == nullptr) throw std::runtime_error(std::string("missing key ") + k);
    cur = next;
  }
  return *cur;
}

TEST(ConfigTree, ParsesYamlAndRecordsLineAndColumn) {
  auto n = parse_yaml("trainer:\n  max_epochs: 3\n  name: 'x'\nmodel: ~\n", "run.yaml");
  ASSERT_TRUE(n.is_map());
  const auto& e = at(n, {"trainer", "max_epochs"});
  EXPECT_EQ(e.scalar, "3");
  EXPECT_FALSE(e.quoted);
  EXPECT_EQ(e.origin, "run.yaml:2:15");
  EXPECT_TRUE(at(n, {"trainer", "name"}).quoted);
  EXPECT_TRUE(at(n, {"model"}).is_null());
}

TEST(ConfigTree, MalformedYamlNamesLineAndColumn) {
  const auto m = error_of([] { parse_yaml("trainer:\n  max_epochs: 2\n   bad: [1\n", "bad.yaml"); });
  EXPECT_NE(m.find("[cli] bad.yaml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("malformed YAML"), std::string::npos) << m;
  const auto u = error_of([] { parse_yaml("a: [1, 2\n", "u.yaml"); });
  EXPECT_NE(u.find("u.yaml:"), std::string::npos) << u;
}

TEST(ConfigTree, DuplicateKeysAreAnError) {
  const auto m = error_of([] { parse_yaml("a: 1\na: 2\n", "d.yaml"); });
  EXPECT_NE(m.find("\"a\" appears twice"), std::string::npos) << m;
  EXPECT_NE(m.find("d.yaml:2:1"), std::string::npos) << m;
}

TEST(ConfigTree, MissingOrNonMappingFileIsAnError) {
  EXPECT_NE(error_of([] { volt::detail::load_yaml_file("/nonexistent/run.yaml"); })
                .find("cannot read config file \"/nonexistent/run.yaml\""),
            std::string::npos);
  volt_test::TempDir dir;
  std::ofstream(dir / "list.yaml") << "- a\n- b\n";
  EXPECT_NE(error_of([&] { volt::detail::load_yaml_file(dir / "list.yaml"); })
                .find("must be a mapping"),
            std::string::npos);
  std::ofstream(dir / "empty.yaml") << "# nothing\n";
  EXPECT_TRUE(volt::detail::load_yaml_file(dir / "empty.yaml").is_map());
}

TEST(ConfigTree, CanonicalizeMovesShorthandUnderInitArgs) {
  auto n = parse_yaml(
      "model: {class_path: M, lr: 0.1}\ndata: D\n"
      "trainer: {callbacks: [EarlyStopping, {class_path: T, init_args: {a: 1}, b: 2}]}\n",
      "c.yaml");
  canonicalize(n);
  EXPECT_EQ(at(n, {"model", "class_path"}).scalar, "M");
  EXPECT_EQ(at(n, {"model", "init_args", "lr"}).scalar, "0.1");
  EXPECT_EQ(n.find("model")->find("lr"), nullptr);
  EXPECT_EQ(at(n, {"data", "class_path"}).scalar, "D");
  const auto& cbs = at(n, {"trainer", "callbacks"});
  ASSERT_EQ(cbs.items.size(), 2u);
  EXPECT_EQ(at(cbs.items[0], {"class_path"}).scalar, "EarlyStopping");
  EXPECT_EQ(at(cbs.items[1], {"init_args", "a"}).scalar, "1");
  EXPECT_EQ(at(cbs.items[1], {"init_args", "b"}).scalar, "2");
}

TEST(ConfigTree, MergeLaterWinsAndANewClassDropsOldInitArgs) {
  auto a = parse_yaml("trainer: {max_epochs: 1, max_steps: 5}\nmodel: {class_path: A, init_args: {lr: 1}}\n", "a");
  auto same = parse_yaml("trainer: {max_epochs: 2}\nmodel: {class_path: A, init_args: {w: 3}}\n", "b");
  canonicalize(a);
  canonicalize(same);
  merge(a, same);
  EXPECT_EQ(at(a, {"trainer", "max_epochs"}).scalar, "2");
  EXPECT_EQ(at(a, {"trainer", "max_steps"}).scalar, "5");
  EXPECT_EQ(at(a, {"model", "init_args", "lr"}).scalar, "1");  // same class: args merge
  EXPECT_EQ(at(a, {"model", "init_args", "w"}).scalar, "3");
  auto other = parse_yaml("model: B\n", "c");
  canonicalize(other);
  merge(a, other);
  EXPECT_EQ(at(a, {"model", "class_path"}).scalar, "B");
  EXPECT_EQ(a.find("model")->find("init_args"), nullptr);  // A's args do not leak into B
}

TEST(ConfigTree, OverridesUseShorthandIndexesAndAppend) {
  ConfigNode root = ConfigNode::make_map("defaults");
  apply_override(root, "model.lr", "3e-4", false, "--model.lr=3e-4");
  EXPECT_EQ(at(root, {"model", "init_args", "lr"}).scalar, "3e-4");
  EXPECT_EQ(at(root, {"model", "init_args", "lr"}).origin, "--model.lr=3e-4");
  apply_override(root, "model", "Mlp", false, "--model=Mlp");
  EXPECT_EQ(at(root, {"model", "class_path"}).scalar, "Mlp");
  EXPECT_EQ(at(root, {"model", "init_args", "lr"}).scalar, "3e-4");  // first class_path: kept
  apply_override(root, "model.hidden", "[256, 128]", false, "o");
  EXPECT_EQ(at(root, {"model", "init_args", "hidden"}).items.size(), 2u);

  apply_override(root, "trainer.callbacks", "EarlyStopping", true, "o");
  apply_override(root, "trainer.callbacks", "[Timer, LearningRateMonitor]", true, "o");
  apply_override(root, "trainer.callbacks.0.patience", "5", false, "o");
  const auto& cbs = at(root, {"trainer", "callbacks"});
  ASSERT_EQ(cbs.items.size(), 3u);
  EXPECT_EQ(at(cbs.items[0], {"init_args", "patience"}).scalar, "5");
  EXPECT_EQ(at(cbs.items[2], {"class_path"}).scalar, "LearningRateMonitor");

  // Not YAML: taken literally.
  apply_override(root, "trainer.callbacks.1.filename", "{epoch}-{step}", false, "o");
  EXPECT_EQ(at(cbs.items[1], {"init_args", "filename"}).scalar, "{epoch}-{step}");
  // An index on a missing list starts one.
  ConfigNode fresh = ConfigNode::make_map("d");
  apply_override(fresh, "trainer.loggers.0", "CSVLogger", false, "o");
  EXPECT_EQ(at(at(fresh, {"trainer", "loggers"}).items[0], {"class_path"}).scalar, "CSVLogger");
}

TEST(ConfigTree, OverrideErrorsSayWhatToDo) {
  ConfigNode root = ConfigNode::make_map("defaults");
  apply_override(root, "trainer.max_epochs", "3", false, "--trainer.max_epochs=3");
  EXPECT_NE(error_of([&] { apply_override(root, "trainer.max_epochs.x", "1", false, "--o"); })
                .find("trainer.max_epochs is \"3\", not a mapping"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(root, "trainer.max_epochs", "1", true, "--o"); })
                .find("+= appends to a list"),
            std::string::npos);
  apply_override(root, "trainer.callbacks", "Timer", true, "o");
  EXPECT_NE(error_of([&] { apply_override(root, "trainer.callbacks.5.x", "1", false, "--o"); })
                .find("has 1 item(s); index 5 is past the end"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(root, "trainer.callbacks.first", "1", false, "--o"); })
                .find("is a list; index it with a number"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(root, "trainer..x", "1", false, "--o"); })
                .find("empty key segment"),
            std::string::npos);
}

}  // namespace
