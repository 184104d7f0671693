// The CLI's raw config tree: YAML parsing with origins, shorthand, merging, overrides.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "alias_bomb.h"
#include "build_paths.h"
#include "cli/detail/config_tree.h"
#include "file_text.h"
#include "tiny.h"
#include "volt/core/errors.h"
#include "yaml_reference_tree.h"

namespace {

using volt_test::alias_bomb;

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
  const auto m =
      error_of([] { parse_yaml("trainer:\n  max_epochs: 2\n   bad: [1\n", "bad.yaml"); });
  EXPECT_NE(m.find("[cli] bad.yaml:3:"), std::string::npos) << m;
  EXPECT_NE(m.find("malformed YAML"), std::string::npos) << m;
  const auto u = error_of([] { parse_yaml("a: [1, 2\n", "u.yaml"); });
  EXPECT_NE(u.find("u.yaml:"), std::string::npos) << u;
}

// A second document was dropped unread (its settings, unknown keys and syntax errors alike).
TEST(ConfigTree, ASecondYamlDocumentIsAnError) {
  const auto m = error_of([&] {
    parse_yaml("trainer: {max_epochs: 1}\n---\ntrainer: {max_epochs: 50}\n", "run.yaml");
  });
  EXPECT_NE(m.find("[cli] run.yaml: more than one YAML document"), std::string::npos) << m;
  // A second document with a syntax error is read (and refused) too.
  const auto bad = error_of([&] { parse_yaml("a: 1\n---\n[[[\n", "run.yaml"); });
  EXPECT_NE(bad.find("[cli] run.yaml:"), std::string::npos) << bad;
  // One document, with or without its markers, is fine.
  EXPECT_EQ(at(parse_yaml("---\na: 1\n...\n", "one.yaml"), {"a"}).scalar, "1");
}

TEST(ConfigTree, DuplicateKeysAreAnError) {
  const auto m = error_of([] { parse_yaml("a: 1\na: 2\n", "d.yaml"); });
  EXPECT_NE(m.find("\"a\" appears twice"), std::string::npos) << m;
  EXPECT_NE(m.find("d.yaml:2:1"), std::string::npos) << m;
}

// YAML's merge key, as PyYAML (hence jsonargparse and LightningCLI) resolves it; yaml-cpp 0.7 left
// "<<" a key, and the resolver refused it as unknown.
TEST(ConfigTree, MergeKeysFillWhatTheMappingLacks) {
  const ConfigNode n = parse_yaml(
      "base: &b {lr: 0.1, momentum: 0.9}\n"
      "more: &m {momentum: 0.5, dampening: 0.1}\n"
      "opt:\n  lr: 0.5\n  <<: [*b, *m]\n  nesterov: true\n",
      "m.yaml");
  const ConfigNode& opt = *n.find("opt");
  std::vector<std::string> keys;
  for (const auto& kv : opt.fields) keys.push_back(kv.first + "=" + kv.second.scalar);
  EXPECT_EQ(keys,
            (std::vector<std::string>{"lr=0.5", "nesterov=true", "momentum=0.9", "dampening=0.1"}));
  EXPECT_EQ(opt.find("momentum")->origin, "m.yaml:1:30") << "where the value is written";
  const auto m = error_of([] { parse_yaml("a: {<<: 1}\n", "d.yaml"); });
  EXPECT_NE(m.find("[cli] d.yaml:1:9: the merge key << takes a mapping or a list of mappings "
                   "(<<: *base), got \"1\"."),
            std::string::npos)
      << m;
}

TEST(ConfigTree, MissingOrNonMappingFileIsAnError) {
  EXPECT_NE(error_of([] {
              volt::detail::load_yaml_file("/nonexistent/run.yaml");
            }).find("cannot read config file \"/nonexistent/run.yaml\""),
            std::string::npos);
  volt_test::TempDir dir;
  std::ofstream(dir / "list.yaml") << "- a\n- b\n";
  EXPECT_NE(
      error_of([&] { volt::detail::load_yaml_file(dir / "list.yaml"); }).find("must be a mapping"),
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

TEST(ConfigTree, MergeLaterWinsAndANewClassMarksOldInitArgsCarried) {
  auto a = parse_yaml(
      "trainer: {max_epochs: 1, max_steps: 5}\nmodel: {class_path: A, init_args: {lr: 1}}\n", "a");
  auto same =
      parse_yaml("trainer: {max_epochs: 2}\nmodel: {class_path: A, init_args: {w: 3}}\n", "b");
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
  // A's args stay, marked: resolve keeps those B takes (tests/cli/resolve_test.cpp).
  EXPECT_TRUE(at(a, {"model", "init_args", "lr"}).carried);
  EXPECT_TRUE(at(a, {"model", "init_args", "w"}).carried);
  auto again = parse_yaml("model: {init_args: {lr: 2}}\n", "d");
  canonicalize(again);
  merge(a, again);
  EXPECT_FALSE(at(a, {"model", "init_args", "lr"}).carried);  // set for B now
  EXPECT_TRUE(at(a, {"model", "init_args", "w"}).carried);
  // Appending to a carried list sets it for B too.
  auto tagged = parse_yaml("model: {class_path: A, init_args: {tags: [a]}}\n", "e");
  canonicalize(tagged);
  apply_override(tagged, "model", "B", false, "--model=B");
  EXPECT_TRUE(at(tagged, {"model", "init_args", "tags"}).carried);
  apply_override(tagged, "model.tags", "b", true, "--model.tags+=b");
  EXPECT_FALSE(at(tagged, {"model", "init_args", "tags"}).carried);
  EXPECT_EQ(at(tagged, {"model", "init_args", "tags"}).items.size(), 2u);
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
  // A plain name followed by its init_args becomes a class_path mapping.
  apply_override(fresh, "trainer.precision", "fp8", false, "o");
  apply_override(fresh, "trainer.precision.init_args.quant", "true", false, "o");
  EXPECT_EQ(at(fresh, {"trainer", "precision", "class_path"}).scalar, "fp8");
  EXPECT_EQ(at(fresh, {"trainer", "precision", "init_args", "quant"}).scalar, "true");
}

TEST(ConfigTree, OverrideErrorsSayWhatToDo) {
  ConfigNode root = ConfigNode::make_map("defaults");
  apply_override(root, "trainer.max_epochs", "3", false, "--trainer.max_epochs=3");
  EXPECT_NE(error_of([&] {
              apply_override(root, "trainer.max_epochs.x", "1", false, "--o");
            }).find("trainer.max_epochs is \"3\", not a mapping"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              apply_override(root, "trainer.max_epochs", "1", true, "--o");
            }).find("+= appends to a list"),
            std::string::npos);
  apply_override(root, "trainer.callbacks", "Timer", true, "o");
  EXPECT_NE(error_of([&] {
              apply_override(root, "trainer.callbacks.5.x", "1", false, "--o");
            }).find("has 1 item(s); index 5 is past the end"),
            std::string::npos);
  // A key on a list sets an init arg of the item appended last (LightningCLI's rule); it was an
  // error whose hint named item 0, another callback once two were appended, and then (until
  // session 98) a key beside class_path, which resolving refused.
  apply_override(root, "trainer.callbacks", "EarlyStopping", true, "o");
  apply_override(root, "trainer.callbacks.mode", "max", false, "--trainer.callbacks.mode=max");
  apply_override(root, "trainer.callbacks.init_args.patience", "4", false, "--o");
  const ConfigNode* callbacks = root.find("trainer")->find("callbacks");
  ASSERT_EQ(callbacks->items.size(), 2u);
  EXPECT_EQ(callbacks->items[0].find("init_args"), nullptr);
  EXPECT_EQ(callbacks->items[1].find("class_path")->scalar, "EarlyStopping");
  EXPECT_EQ(callbacks->items[1].find("mode"), nullptr);
  const ConfigNode* args = callbacks->items[1].find("init_args");
  ASSERT_NE(args, nullptr);
  ASSERT_NE(args->find("mode"), nullptr);
  EXPECT_EQ(args->find("mode")->scalar, "max");
  ASSERT_NE(args->find("patience"), nullptr);
  EXPECT_EQ(args->find("patience")->scalar, "4");
  // A plain list's item is no component: a key on it is still refused as on any value.
  apply_override(root, "model.names", "a", true, "--model.names+=a");
  EXPECT_NE(error_of([&] {
              apply_override(root, "model.names.x", "1", false, "--model.names.x=1");
            }).find("is \"a\", not a mapping"),
            std::string::npos);
  apply_override(root, "trainer.plugins", "[]", false, "--trainer.plugins=[]");
  EXPECT_NE(error_of([&] {
              apply_override(root, "trainer.plugins.x", "1", false, "--o");
            }).find("trainer.plugins is an empty list; append an item first"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              apply_override(root, "trainer..x", "1", false, "--o");
            }).find("empty key segment"),
            std::string::npos);
}

// Text YAML would read as something else is taken as typed: before, "/data/run #2" became
// "/data/run" (a comment) and "&a v1" or "!x v1" became "v1"; quoted text and numbers stay YAML's.
TEST(ConfigTree, AnOverrideYamlWouldChangeIsTakenAsTyped) {
  const std::vector<std::pair<std::string, std::string>> cases{{"/data/run #2", "/data/run #2"},
                                                               {"&a v1", "&a v1"},
                                                               {"!x v1", "!x v1"},
                                                               {" plain ", "plain"},
                                                               {"'quoted'", "quoted"},
                                                               {"3e-4", "3e-4"},
                                                               {"!!str 123", "123"},
                                                               // YAML read these as "" or null
                                                               {"|", "|"},
                                                               {">-", ">-"},
                                                               {"!", "!"},
                                                               {"%x", "%x"},
                                                               // mappings no config can hold
                                                               {": x", ": x"},
                                                               {":", ":"},
                                                               {"{a: 1, a: 2}", "{a: 1, a: 2}"}};
  for (const auto& [typed, want] : cases) {
    ConfigNode root = parse_yaml("trainer: {default_root_dir: x}\n", "run.yaml");
    canonicalize(root);
    apply_override(root, "trainer.default_root_dir", typed, false,
                   "--trainer.default_root_dir=" + typed);
    const ConfigNode& got = at(root, {"trainer", "default_root_dir"});
    ASSERT_TRUE(got.is_scalar()) << typed;
    EXPECT_EQ(got.scalar, want) << typed;
  }
}

TEST(ConfigTree, AnEmptyOverrideIsTheEmptyStringAndNullIsNull) {
  // A config file sets monitor; the command line must be able to empty it.
  ConfigNode root = parse_yaml(
      "trainer:\n  callbacks:\n    - class_path: ModelCheckpoint\n"
      "      init_args: {monitor: val_loss}\n",
      "run.yaml");
  canonicalize(root);
  apply_override(root, "trainer.callbacks.0.init_args.monitor", "", false,
                 "--trainer.callbacks.0.init_args.monitor=");
  const ConfigNode& monitor =
      at(at(root, {"trainer", "callbacks"}).items[0], {"init_args", "monitor"});
  EXPECT_TRUE(monitor.is_scalar());
  EXPECT_EQ(monitor.scalar, "");
  EXPECT_TRUE(monitor.quoted);
  apply_override(root, "trainer.callbacks.0.monitor", "null", false, "o");
  EXPECT_TRUE(at(at(root, {"trainer", "callbacks"}).items[0], {"init_args", "monitor"}).is_null());
  // In files YAML's rules hold: `key:` alone is null, `key: ""` the empty string.
  auto f = parse_yaml("a:\nb: \"\"\n", "f.yaml");
  EXPECT_TRUE(at(f, {"a"}).is_null());
  EXPECT_TRUE(at(f, {"b"}).is_scalar());
  EXPECT_EQ(at(f, {"b"}).scalar, "");
}

TEST(ConfigTree, AliasBombsCyclesAndDeepNestingAreRefusedBeforeExpansion) {
  // Ten aliases per level, five levels: 1.2 million nodes once expanded, past the node limit;
  // refused at line 5, where the aliases pass their own limit of 20,000 nodes.
  // (Unbounded, parse_yaml built them all, about 250 MB; the eight levels of nine reach
  // 20 GB: tests/cli/cli_test.cpp runs that one in a separate, memory-capped process.)
  const std::string bomb = alias_bomb(5, 10, false);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m = error_of([&] { parse_yaml(bomb, "bomb.yaml"); });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(m.find("[cli] bomb.yaml:5:"), std::string::npos) << m;
  EXPECT_NE(m.find("the aliases (*name) expand to more than 20000 nodes"), std::string::npos) << m;
  EXPECT_LT(secs, 0.5);
  // 12,349 nodes, 12,330 of them from aliases: fine.
  EXPECT_NO_THROW(parse_yaml(alias_bomb(3, 10, false), "ok.yaml"));

  // yaml-cpp builds a self-referencing alias as a cycle; converting it recursed until the stack
  // overflowed.
  EXPECT_NE(error_of([] {
              parse_yaml("a: &x [1, *x]\n", "loop.yaml");
            }).find("[cli] loop.yaml:1:11: this alias refers to a node that contains it"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_yaml(std::string(100000, '[') + "1", "deep.yaml");
            }).find("nest more than 128 levels deep"),
            std::string::npos);

  // Overrides go through the same bound (a flow-style bomb fits on a command line).
  ConfigNode root = ConfigNode::make_map("defaults");
  EXPECT_NE(error_of([&] {
              apply_override(root, "model.x", alias_bomb(5, 10, true), false, "--model.x=...");
            }).find("[cli] --model.x=...:1:"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              apply_override(root, "model.x", std::string(100000, '['), false, "--model.x=[[");
            }).find("nest more than 128 levels deep"),
            std::string::npos);
}

// parse_yaml builds its tree from the parser's events; yaml-cpp's own tree, converted node by
// node, is the reference (tests/support/yaml_reference_tree.h): same kinds, text, quoting and
// origins, aliases expanded to their anchored node, and the same keys refused.
void expect_same_tree(const std::string& text, const std::string& what) {
  EXPECT_EQ(volt_test::tree_mismatch(text), "") << what << "\n" << text;
}

TEST(ConfigTree, EventTreeMatchesYamlCppTree) {
  const char* const cases[] = {
      "a: 1\nb: [x, 'y', \"z\"]\nc: {d: ~, e: null, f: , g: Null}\n",
      "a: &s text\nb: *s\nc: &m {x: 1, y: [2, 3]}\nd: [*m, *m, *s]\n",
      "a: &k key\n*k : value\n",  // an alias as a key
      "l:\n  - \n  - - 1\n    - 2\n  - {}\n  - []\n",
      "s: |\n  two\n  lines\nf: >\n  folded\n  text\n",
      "t: !!str 123\nu: !custom x\nv: !!int '7'\nw: 'it''s'\n",
      "multi: plain text\n  continued here\n# comment\nx: \"\\u00e9\\t\"\n",
      "? complex\n: 1\n",
      "? [a, b]\n: 1\n",     // a list as a key: refused
      "{a: 1}: 2\n",         // a mapping as a key: refused
      "~: 1\n",              // a null key: refused
      "a: 1\nb: 2\na: 3\n",  // a key twice: refused
      // YAML's merge key: explicit keys win wherever they stand, the earlier mapping first
      "base: &b {lr: 0.1, momentum: 0.9}\nopt:\n  lr: 0.5\n  <<: *b\n  nesterov: true\n",
      "a: &a {x: 1}\nb: &b {x: 2, y: 2}\nc: {<<: [*a, *b], z: 3}\n",
      "a: &a {x: 1, <<: {y: 2}}\nb: {<<: *a}\n",  // merged mappings merge first
      "a: {'<<': 1, x: 2}\n",                     // a quoted << is a plain key
      "a: {<<: 1}\n",                             // not a mapping: refused
      "a: {<<: [{x: 1}, 2]}\n",                   // not a list of mappings: refused
      "a: {<<: [], x: 1}\n",                      // merges nothing
      "a: {<<: {x: 1}, <<: {y: 2}}\n",            // twice: refused
      "a: &x {b: &y [1, 2], c: *y}\nd: *x\n",
      "a: &x [1, *x]\n",  // a cycle: refused before any tree
      "- a\n- b\n",
      "plain scalar\n",
      "",
      "# only a comment\n",
      "'quoted': \"x\"\n\"2\": [\"\", '']\n",
  };
  for (const char* c : cases) expect_same_tree(c, "case");
  // Every config and fuzz seed in the repository (the seeds' override lines are not YAML).
  const std::string root = volt_test::source_dir();
  for (const std::string dir : {root + "/configs", root + "/fuzz/corpus/config"}) {
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().extension() != ".yaml") continue;
      const std::string text = volt_test::file_text(e.path());
      expect_same_tree(text.substr(0, text.find("\n#--\n")), e.path().string());
    }
  }
}

TEST(ConfigTree, AMappingOfManyKeysIsReadInLinearTime) {
  // 150,000 shorthand keys on a component. Reading (the duplicate-key check), canonicalize (the
  // shorthand moved under init_args) and merge each searched the keys so far for every key,
  // O(n^2): 266 s here (measured with the old code, which this test failed). Linear now: about
  // 2 s, most of it yaml-cpp's parser (twice: the limits' pass, then the tree's).
  const int kKeys = 150000;
  std::string text = "model:\n  class_path: M\n";
  for (int i = 0; i < kKeys; ++i)
    text += "  k" + std::to_string(i) + ": " + std::to_string(i) + "\n";
  const auto t0 = std::chrono::steady_clock::now();
  ConfigNode file = volt::detail::parse_config_text(text, "big.yaml");
  canonicalize(file);
  ConfigNode root = ConfigNode::make_map("defaults");
  merge(root, file);             // every key new
  merge(root, std::move(file));  // every key there
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ConfigNode& args = at(root, {"model", "init_args"});
  ASSERT_EQ(args.fields.size(), static_cast<size_t>(kKeys));
  EXPECT_EQ(args.fields.back().first, "k149999");
  EXPECT_EQ(args.fields.back().second.scalar, "149999");
  EXPECT_EQ(args.fields.back().second.origin, "big.yaml:150002:12");
  EXPECT_EQ(at(root, {"model", "class_path"}).scalar, "M");
  EXPECT_LT(secs, 8.0);

  // A key twice among them is still found, at its second place.
  const std::string m =
      error_of([&] { volt::detail::parse_config_text(text + "  k7: again\n", "big.yaml"); });
  EXPECT_NE(m.find("[cli] big.yaml:150003:3: key \"k7\" appears twice"), std::string::npos) << m;
}

TEST(ConfigTree, AnOverrideKeyNestsNoDeeperThanAConfig) {
  // Walking a key of 64,000 segments copied its prefixes about 2 billion times.
  ConfigNode root = ConfigNode::make_map("defaults");
  std::string deep = "trainer";
  for (int i = 0; i < 128; ++i) deep += ".k";  // 129 segments
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m = error_of([&] { apply_override(root, deep, "1", false, "--deep=1"); });
  EXPECT_NE(m.find("[cli] --deep=1: the key has 129 segments, more than the 128 levels"),
            std::string::npos)
      << m;
  std::string huge = "trainer";
  for (int i = 0; i < 64000; ++i) huge += ".k";
  EXPECT_NE(
      error_of([&] { apply_override(root, huge, "1", false, "--huge=1"); }).find("64001 segments"),
      std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  deep.resize(deep.size() - 2);  // 128 segments: fine
  EXPECT_NO_THROW(apply_override(root, deep, "1", false, "--deep=1"));
}

}  // namespace
