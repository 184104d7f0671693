// Bounded YAML and JSON reading: alias bombs, cycles, deep nesting and huge inputs are refused
// quickly with one line naming the limit; ordinary configs load as before.

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "alias_bomb.h"
#include "build_paths.h"
#include "core/detail/input_limits.h"
#include "volt/core/errors.h"

namespace {

using volt_test::alias_bomb;

using volt::detail::InputLimits;
using volt::detail::load_yaml_bounded;
using volt::detail::parse_json_bounded;

template <typename F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const volt::ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(InputLimits, BillionLaughsIsRefusedAtOnceNamingTheLimit) {
  const std::string bomb = alias_bomb(8, 9);  // 9^9 scalars once expanded
  ASSERT_LT(bomb.size(), 1024u);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string m = config_error_of([&] { load_yaml_bounded(bomb, "cli", "bomb.yaml"); });
  const double secs = seconds_since(t0);
  EXPECT_NE(m.find("[cli] bomb.yaml:5:"), std::string::npos) << m;  // at l4's second alias
  EXPECT_NE(m.find("the aliases (*name) expand to more than 20000 nodes"), std::string::npos) << m;
  EXPECT_NE(m.find("Input limits"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_LT(secs, 0.5);  // about 0.1 ms; generous for a loaded machine

  // With the alias limit as high as the node limit, the node limit refuses it.
  InputLimits wide;
  wide.max_alias_nodes = wide.max_nodes;
  const std::string n = config_error_of([&] { load_yaml_bounded(bomb, "cli", "bomb.yaml", wide); });
  EXPECT_NE(n.find("more than 1000000 nodes once its aliases (*name) are expanded"),
            std::string::npos)
      << n;
}

TEST(InputLimits, AliasesAddAtMostTheirOwnLimitOfNodes) {
  // Under the node limit, but each node costs the CLI's config tree about 0.6 KB: 324 bytes of
  // aliases (672,610 nodes) made `volt print-config` take 360 MB and 3 s more.
  const std::string bomb = alias_bomb(5, 9);
  InputLimits no_alias_limit;
  no_alias_limit.max_alias_nodes = no_alias_limit.max_nodes;
  EXPECT_NO_THROW(load_yaml_bounded(bomb, "cli", "bomb.yaml", no_alias_limit));
  const std::string m = config_error_of([&] { load_yaml_bounded(bomb, "cli", "bomb.yaml"); });
  EXPECT_NE(m.find("[cli] bomb.yaml:5:"), std::string::npos) << m;
  EXPECT_NE(m.find("the aliases (*name) expand to more than 20000 nodes, the limit on what "
                   "aliases add to a YAML file volt reads"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("write the values out or use fewer aliases"), std::string::npos) << m;
  // The count is exact: alias_bomb(3, 9)'s aliases add 9 * 10 + 9 * 91 + 9 * 820 = 8289 nodes
  // (level i's nine aliases each expand to level i-1's list).
  InputLimits exact;
  exact.max_alias_nodes = 8289;
  EXPECT_NO_THROW(load_yaml_bounded(alias_bomb(3, 9), "cli", "ok.yaml", exact));
  exact.max_alias_nodes = 8288;
  EXPECT_NE(config_error_of([&] {
              load_yaml_bounded(alias_bomb(3, 9), "cli", "ok.yaml", exact);
            }).find("expand to more than 8288 nodes"),
            std::string::npos);
  // A config's ordinary reuse of an anchored block loads.
  const YAML::Node n = load_yaml_bounded(
      "opt: &opt {lr: 0.1, betas: [0.9, 0.99]}\na: *opt\nb: *opt\n", "cli", "ok.yaml");
  EXPECT_EQ(n["b"]["betas"][1].as<double>(), 0.99);
}

TEST(InputLimits, AliasesWithinTheLimitsLoadAsBefore) {
  const YAML::Node n = load_yaml_bounded(alias_bomb(3, 9), "cli", "ok.yaml");  // 9^4 scalars
  ASSERT_TRUE(n["l3"].IsSequence());
  EXPECT_EQ(n["l3"].size(), 9u);
  EXPECT_EQ(n["l3"][8][8][8][8].as<std::string>(), "lol");
  // The count is exact: a limit equal to the expanded size passes, one less fails.
  // The top mapping, then per level a key and its list: l0's list is itself + 9 scalars, l_i's
  // itself + 9 copies of l_{i-1}'s.
  size_t nodes = 1, list = 10;
  nodes += 1 + list;
  for (int i = 1; i <= 3; ++i) {
    list = 1 + 9 * list;
    nodes += 1 + list;
  }
  InputLimits exact;
  exact.max_nodes = nodes;
  EXPECT_NO_THROW(load_yaml_bounded(alias_bomb(3, 9), "cli", "ok.yaml", exact));
  exact.max_nodes = nodes - 1;
  EXPECT_NE(config_error_of([&] {
              load_yaml_bounded(alias_bomb(3, 9), "cli", "ok.yaml", exact);
            }).find("more than " + std::to_string(nodes - 1) + " nodes"),
            std::string::npos);
}

TEST(InputLimits, AnAliasInsideItsOwnAnchorIsRefused) {
  // yaml-cpp builds these as cycles; expanding them would never end.
  for (const char* text : {"a: &x [1, *x]\n", "&x {a: *x}\n", "a: &x\n  b: [1, {c: *x}]\n"}) {
    const std::string m = config_error_of([&] { load_yaml_bounded(text, "cli", "loop.yaml"); });
    EXPECT_NE(m.find("[cli] loop.yaml:"), std::string::npos) << text << m;
    EXPECT_NE(m.find("refers to a node that contains it"), std::string::npos) << text << m;
  }
  // An alias of a finished anchor is fine, also inside another anchored node.
  const YAML::Node n = load_yaml_bounded("a: &x [1]\nb: &y [*x, *x]\n", "cli", "ok.yaml");
  EXPECT_EQ(n["b"][1][0].as<int>(), 1);
}

TEST(InputLimits, DeepYamlNestingIsRefusedWithoutACrash) {
  const auto depth_error = [](const std::string& text) {
    return config_error_of([&] { load_yaml_bounded(text, "cli", "deep.yaml"); });
  };
  const std::string kPhrase = "nest more than 128 levels deep";
  EXPECT_NE(depth_error(std::string(100000, '[')).find(kPhrase), std::string::npos);
  EXPECT_NE(depth_error(std::string(100000, '[') + std::string(100000, ']')).find(kPhrase),
            std::string::npos);
  std::string block;
  for (int i = 0; i < 100000; ++i) block += "- ";
  EXPECT_NE(depth_error(block + "x\n").find(kPhrase), std::string::npos);
  // 128 levels load; 129 do not.
  EXPECT_NO_THROW(load_yaml_bounded(std::string(128, '[') + std::string(128, ']'), "c", "s"));
  EXPECT_NE(depth_error(std::string(129, '[') + std::string(129, ']')).find(kPhrase),
            std::string::npos);
  // Aliases count with their expanded depth: 100 levels aliased at level 100.
  const std::string deep100 = std::string(100, '[') + std::string(100, ']');
  const std::string via_alias =
      "a: &a " + deep100 + "\nb: " + std::string(99, '[') + "*a" + std::string(99, ']') + "\n";
  EXPECT_NE(depth_error(via_alias).find("levels deep (aliases expanded)"), std::string::npos);
}

TEST(InputLimits, OversizedTextIsRefusedBeforeParsing) {
  InputLimits small;
  small.max_bytes = 100;
  const std::string m =
      config_error_of([&] { load_yaml_bounded(std::string(101, '#'), "cli", "big.yaml", small); });
  EXPECT_NE(m.find("[cli] big.yaml: more than 100 bytes"), std::string::npos) << m;
  EXPECT_NO_THROW(load_yaml_bounded(std::string(100, '#'), "cli", "big.yaml", small));
  // read_bounded stops reading at the limit: an endless stream costs limit + one buffer.
  std::ifstream zero("/dev/zero", std::ios::binary);
  small.max_bytes = 1 << 20;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string z =
      config_error_of([&] { volt::detail::read_bounded(zero, "cli", "/dev/zero", small); });
  EXPECT_NE(z.find("[cli] /dev/zero: more than 1048576 bytes"), std::string::npos) << z;
  EXPECT_LT(seconds_since(t0), 1.0);
  std::istringstream text("a: 1\n");
  EXPECT_EQ(volt::detail::read_bounded(text, "cli", "t"), "a: 1\n");
}

TEST(InputLimits, MalformedYamlStaysAYamlParserException) {
  // Callers add their own context (the CLI: file:line:col; an override is taken literally).
  EXPECT_THROW(load_yaml_bounded("a: [1, 2\n", "cli", "bad.yaml"), YAML::ParserException);
}

TEST(InputLimits, JsonDepthNodesSizeAndSyntaxAreChecked) {
  const std::string kDepth = "nest more than 128 levels deep";
  EXPECT_NE(config_error_of([] {
              parse_json_bounded(std::string(100000, '['), "ds", "d.json");
            }).find(kDepth),
            std::string::npos);
  EXPECT_NE(config_error_of([] {
              parse_json_bounded(std::string(100000, '[') + std::string(100000, ']'), "ds",
                                 "d.json");
            }).find("[ds] d.json: arrays and objects " + kDepth),
            std::string::npos);
  std::string objects;
  for (int i = 0; i < 200; ++i) objects += "{\"a\":";
  objects += "1" + std::string(200, '}');
  EXPECT_NE(config_error_of([&] { parse_json_bounded(objects, "ds", "d.json"); }).find(kDepth),
            std::string::npos);
  EXPECT_NO_THROW(parse_json_bounded(std::string(128, '[') + std::string(128, ']'), "ds", "d"));

  InputLimits few;
  few.max_nodes = 5;  // {"a": [1, 2]} is 5 nodes: the object, a key, the array, two numbers
  EXPECT_EQ(parse_json_bounded("{\"a\": [1, 2]}", "ds", "n.json", few)["a"][1], 2);
  EXPECT_NE(config_error_of([&] {
              parse_json_bounded("{\"a\": [1, 2, 3]}", "ds", "n.json", few);
            }).find("[ds] n.json: more than 5 nodes"),
            std::string::npos);
  few.max_bytes = 4;
  EXPECT_NE(config_error_of([&] {
              parse_json_bounded("[1, 2]", "ds", "s.json", few);
            }).find("more than 4 bytes"),
            std::string::npos);
  const std::string bad = config_error_of([] { parse_json_bounded("{\"a\": }", "ds", "b.json"); });
  EXPECT_NE(bad.find("[ds] b.json: malformed JSON"), std::string::npos) << bad;
  EXPECT_NE(bad.find("; fix the syntax there."), std::string::npos) << bad;
  // A number beyond double's range: nlohmann throws out_of_range, not parse_error, while
  // parsing (fuzz_json_configs' first finding); it is malformed input all the same.
  const std::string overflow = config_error_of(
      [] { parse_json_bounded("{\"lr\": 1e400}", "ds", "o.json", {}, "check the numbers"); });
  EXPECT_NE(overflow.find("[ds] o.json: malformed JSON ([json.exception.out_of_range.406] number "
                          "overflow parsing '1e400'); check the numbers."),
            std::string::npos)
      << overflow;

  const nlohmann::json ok = parse_json_bounded(
      R"({"zero_optimization": {"stage": 2}, "bf16": {"enabled": true}})", "ds", "ds.json");
  EXPECT_EQ(ok["zero_optimization"]["stage"], 2);
  EXPECT_EQ(ok["bf16"]["enabled"], true);
}

TEST(InputLimits, EveryCheckedInConfigIsWellWithinTheLimits) {
  InputLimits tight;  // a hundredth of each default still reads every real config
  tight.max_nodes /= 100;
  tight.max_depth /= 10;
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(volt_test::source_dir() + "/configs")) {
    if (e.path().extension() != ".yaml") continue;
    std::ifstream in(e.path());
    const std::string text = volt::detail::read_bounded(in, "cli", e.path().string(), tight);
    EXPECT_NO_THROW(load_yaml_bounded(text, "cli", e.path().string(), tight)) << e.path();
    ++files;
  }
  EXPECT_GT(files, 0);
}

}  // namespace
