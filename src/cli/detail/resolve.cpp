#include "resolve.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <type_traits>
#include <variant>

#include "core/detail/ascii.h"
#include "core/detail/duration.h"
#include "core/detail/numbers.h"
#include "volt/core/check.h"
#include "volt/core/env.h"
#include "volt/core/log.h"
#include "volt/trainer/plan.h"
#include "volt/trainer/trainer_options.h"

namespace volt {
namespace detail {
namespace {

// Keys that users coming from Lightning or from TrainerOptions may reach for, and where they live.
std::string hint_for(const std::string& key) {
  if (key == "trainer.seed")
    return "seed_everything (top level), which seeds before the model is built";
  return "";
}

[[noreturn]] void fail(const std::string& key, const ConfigNode& at, const std::string& msg) {
  throw ConfigError("[cli] " + key + " (" + at.origin + "): " + msg);
}

void unknown_key(const std::string& prefix, const std::string& key, const ConfigNode& at,
                 const std::vector<std::string>& valid) {
  const std::string full = prefix.empty() ? key : prefix + "." + key;
  std::string msg = "[cli] unknown key \"" + full + "\" (" + at.origin + ")";
  const std::string hint = hint_for(full);
  const std::string close = closest_match(key, valid);
  if (!hint.empty()) {
    msg += "; use " + hint;
  } else if (!close.empty()) {
    msg += "; did you mean \"" + (prefix.empty() ? close : prefix + "." + close) + "\"?";
  } else {
    msg += "; valid keys" + std::string(prefix.empty() ? "" : " under " + prefix) + ": " +
           quoted_list(valid, "(none)");
  }
  throw ConfigError(msg + " (--help lists every option)");
}

// `appended` (a list += started where nothing was set) after the parameter's default list.
ParamValue after_default(const ParamValue& def, const ParamValue& appended) {
  return std::visit(
      [&](const auto& d) -> ParamValue {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                      std::is_same_v<T, std::vector<double>> ||
                      std::is_same_v<T, std::vector<std::string>>) {
          if (const T* a = std::get_if<T>(&appended)) {
            T out = d;
            out.insert(out.end(), a->begin(), a->end());
            return out;
          }
        }
        return appended;
      },
      def);
}

bool parse_bool(const std::string& s, bool* out) {
  if (s == "true" || s == "True" || s == "TRUE") return *out = true, true;
  if (s == "false" || s == "False" || s == "FALSE") return *out = false, true;
  return false;
}

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  const char* b = s.data() + (s[0] == '+' ? 1 : 0);
  const char* e = s.data() + s.size();
  auto r = std::from_chars(b, e, *out);
  return r.ec == std::errc() && r.ptr == e;
}

bool parse_float(const std::string& s, double* out) {
  if (s == ".inf" || s == "+.inf" || s == ".Inf" || s == "inf") return *out = INFINITY, true;
  if (s == "-.inf" || s == "-.Inf" || s == "-inf") return *out = -INFINITY, true;
  if (s == ".nan" || s == ".NaN" || s == "nan") return *out = NAN, true;
  if (s.empty() || detail::ascii_space(s[0])) return false;
  char* end = nullptr;
  errno = 0;
  *out = detail::c_strtod(s.c_str(), &end);
  // ERANGE also flags a result that underflowed to a subnormal or zero (1e-310), which is a
  // value (Python takes it); only an overflow to infinity is out of range.
  return end == s.c_str() + s.size() && (errno != ERANGE || std::isfinite(*out));
}

// An integer that is one but does not fit in 64 bits.
bool int_out_of_range(const std::string& s) {
  if (s.empty()) return false;
  const char* b = s.data() + (s[0] == '+' ? 1 : 0);
  int64_t ignored = 0;
  auto r = std::from_chars(b, s.data() + s.size(), ignored);
  return r.ec == std::errc::result_out_of_range && r.ptr == s.data() + s.size();
}

const char* example_for(ParamType t) {
  switch (t) {
    case ParamType::kBool: return "true";
    case ParamType::kInt: return "3";
    case ParamType::kFloat: return "0.001";
    case ParamType::kNumber: return "10 or 0.25";
    case ParamType::kString: return "name";
    case ParamType::kIntList: return "[64, 32]";
    case ParamType::kFloatList: return "[0.9, 0.999]";
    case ParamType::kStringList: return "[a, b]";
  }
  return "";
}

bool is_list_type(ParamType t) {
  return t == ParamType::kIntList || t == ParamType::kFloatList || t == ParamType::kStringList;
}

[[noreturn]] void wrong_type(const std::string& key, const ConfigNode& n, const ParamSpec& spec) {
  std::string hint;
  if (n.is_scalar() && n.scalar.empty()) {
    // Most likely "--key=", which is the empty string: say how to write what was meant.
    hint = " (--" + key + "= is the empty string" +
           (spec.nullable ? "; --" + key + "=null gives null" : "") +
           (is_list_type(spec.type) ? "; --" + key + "=[] gives an empty list" : "") + ")";
  }
  fail(key, n,
       std::string("expected ") + param_type_name(spec.type) + (spec.nullable ? " or null" : "") +
           ", got " + n.describe() + "; e.g. " + key + ": " + example_for(spec.type) + hint + ".");
}

// Seconds as the scalar a float parameter reads back exactly (shortest round-trip form).
ConfigNode seconds_node(double seconds, const std::string& origin) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, seconds);
  return ConfigNode::make_scalar(std::string(buf, r.ptr), origin);
}

// A duration as Lightning takes it (Trainer max_time, Timer duration): seconds (volt's own
// form), "DD:HH:MM:SS", or a datetime.timedelta mapping ({days: 1, hours: 5}); as seconds.
ConfigNode duration_in_seconds(const std::string& key, const ConfigNode& n) {
  const std::string forms =
      "give seconds, \"DD:HH:MM:SS\" or a mapping of weeks, days, hours, minutes, seconds, "
      "milliseconds and microseconds; e.g. " +
      key + ": \"00:12:00:00\" (12 hours) or {hours: 12}";
  double seconds = 0;
  if (n.is_scalar()) {
    const std::optional<double> d = detail::parse_dd_hh_mm_ss(n.scalar);
    if (!d) fail(key, n, "\"" + n.scalar + "\" is no duration; " + forms + ".");
    seconds = *d;
  } else {
    for (const auto& [unit, value] : n.fields) {
      const double per = detail::timedelta_unit_seconds(unit);
      if (per == 0) fail(key, n, "\"" + unit + "\" is no unit of a duration; " + forms + ".");
      double v;
      if (!value.is_scalar() || !parse_float(value.scalar, &v) || !std::isfinite(v)) {
        fail(key + "." + unit, value, "expected a number, got " + value.describe() + ".");
      }
      seconds += v * per;
    }
  }
  if (!std::isfinite(seconds)) fail(key, n, "is more seconds than a double holds; " + forms + ".");
  return seconds_node(seconds, n.origin);
}

// str(datetime.timedelta), as a config Lightning wrote holds DDPStrategy's timeout: "0:30:00",
// "1 day, 2:00:00", "0:00:01.500000"; in seconds, or nullopt for other text.
std::optional<double> python_timedelta_seconds(const std::string& s) {
  double days = 0;
  std::string clock = s;
  if (const auto comma = s.find(", "); comma != std::string::npos) {
    const std::string d = s.substr(0, comma);
    const auto space = d.find(' ');
    int64_t n = 0;
    if (space == std::string::npos || !parse_int(d.substr(0, space), &n)) return std::nullopt;
    if (d.substr(space + 1) != "day" && d.substr(space + 1) != "days") return std::nullopt;
    days = static_cast<double>(n);
    clock = s.substr(comma + 2);
  }
  const auto c1 = clock.find(':');
  const auto c2 = c1 == std::string::npos ? c1 : clock.find(':', c1 + 1);
  if (c2 == std::string::npos || c2 - c1 != 3 || clock.size() < c2 + 3) return std::nullopt;
  int64_t h = 0, m = 0;
  double sec = 0;
  if (!parse_int(clock.substr(0, c1), &h) || !parse_int(clock.substr(c1 + 1, 2), &m) ||
      !parse_float(clock.substr(c2 + 1), &sec) || h < 0 || m < 0 || m > 59 || !(sec >= 0) ||
      sec >= 60) {
    return std::nullopt;
  }
  return days * 86400 + static_cast<double>(h) * 3600 + static_cast<double>(m) * 60 + sec;
}

// Whether `n` is a duration in one of Lightning's forms other than seconds.
bool lightning_duration(const ConfigNode* n) {
  return n != nullptr &&
         (n->is_map() || (n->is_scalar() && n->scalar.find(':') != std::string::npos));
}

ParamValue scalar_value(const std::string& key, const ConfigNode& n, const ParamSpec& spec,
                        ParamType type) {
  if (!n.is_scalar()) wrong_type(key, n, spec);
  const std::string& s = n.scalar;
  switch (type) {
    case ParamType::kBool: {
      bool b;
      if (!parse_bool(s, &b)) wrong_type(key, n, spec);
      return b;
    }
    case ParamType::kInt: {
      int64_t i;
      if (!parse_int(s, &i)) {
        if (int_out_of_range(s)) {
          fail(key, n,
               "is " + s +
                   ", outside the range of a 64-bit integer ([-2^63, 2^63)); give a "
                   "smaller number.");
        }
        wrong_type(key, n, spec);
      }
      return i;
    }
    case ParamType::kFloat: {
      double d;
      if (!parse_float(s, &d)) wrong_type(key, n, spec);
      return d;
    }
    case ParamType::kNumber: {
      int64_t i;
      if (parse_int(s, &i)) return i;
      double d;
      if (!parse_float(s, &d)) wrong_type(key, n, spec);
      return d;
    }
    default: return s;
  }
}

ParamValue parse_value(const std::string& key, const ConfigNode& n, const ParamSpec& spec) {
  if (n.is_null()) {
    if (spec.nullable) return std::monostate{};
    fail(key, n,
         std::string("is null but must be ") + param_type_name(spec.type) + "; give a value" +
             (spec.type == ParamType::kString
                  ? " (the empty string is \"\" in YAML, --" + key + "= on the command line)"
                  : "") +
             (spec.required ? "" : " or remove the key to use the default") + ".");
  }
  if (spec.type == ParamType::kString && !n.is_scalar() && !n.typed.empty()) {
    // A command-line value that YAML reads as a mapping or list ({epoch}, [x]) but that a
    // string parameter takes as it was typed, as jsonargparse does.
    return parse_value(key, ConfigNode::make_scalar(n.typed, n.origin), spec);
  }
  switch (spec.type) {
    case ParamType::kIntList:
    case ParamType::kFloatList:
    case ParamType::kStringList: {
      if (!n.is_list()) wrong_type(key, n, spec);
      const ParamType elem = spec.type == ParamType::kIntList     ? ParamType::kInt
                             : spec.type == ParamType::kFloatList ? ParamType::kFloat
                                                                  : ParamType::kString;
      std::vector<int64_t> ints;
      std::vector<double> floats;
      std::vector<std::string> strs;
      for (size_t i = 0; i < n.items.size(); ++i) {
        ParamValue v = scalar_value(key + "." + std::to_string(i), n.items[i], spec, elem);
        if (elem == ParamType::kInt)
          ints.push_back(std::get<int64_t>(v));
        else if (elem == ParamType::kFloat)
          floats.push_back(std::get<double>(v));
        else
          strs.push_back(std::get<std::string>(v));
      }
      if (elem == ParamType::kInt) return ints;
      if (elem == ParamType::kFloat) return floats;
      return strs;
    }
    default: {
      ParamValue v = scalar_value(key, n, spec, spec.type);
      if (!spec.choices.empty()) {
        const auto& s = std::get<std::string>(v);
        if (std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end()) {
          fail(key, n,
               "\"" + s + "\" is not one of " + quoted_list(spec.choices, "(none)") +
                   did_you_mean(s, spec.choices) + ".");
        }
      }
      return v;
    }
  }
}

// `null_is_default`: a null value of a parameter that takes none stands for its default, as in
// the trainer section of a config Lightning's CLI printed (max_epochs: null, limit_val_batches:
// null, ...); elsewhere it is refused.
Args parse_args(const std::string& prefix, const std::string& owner, const ConfigNode* node,
                const ConfigNode& parent, const Params& params,
                const std::vector<std::string>& extra_keys = {}, bool null_is_default = false) {
  std::vector<std::string> valid;
  for (const auto& s : params.specs()) valid.push_back(s.name);
  if (node != nullptr && !node->is_null()) {
    if (!node->is_map())
      fail(prefix, *node, "expected a mapping of parameters, got " + node->describe() + ".");
    for (const auto& f : node->fields) {
      if (params.find(f.first) == nullptr &&
          std::find(extra_keys.begin(), extra_keys.end(), f.first) == extra_keys.end()) {
        if (f.second.carried) {
          // Set for the class this component had before (jsonargparse drops it the same way).
          // Also a checkpoint's hyper-parameter that is no argument (cli.cpp's
          // model_from_checkpoint).
          log_info("cli", prefix + "." + f.first + " (" + f.second.origin + ") dropped: " + owner +
                              " takes no such parameter (it was set for another class_path, or is "
                              "a hyper-parameter of the checkpoint's that is no argument).");
          continue;
        }
        std::vector<std::string> all = valid;
        all.insert(all.end(), extra_keys.begin(), extra_keys.end());
        unknown_key(prefix, f.first, f.second, all);
      }
    }
  }
  std::map<std::string, ParamValue> values;
  for (const auto& spec : params.specs()) {
    const ConfigNode* v = (node != nullptr && node->is_map()) ? node->find(spec.name) : nullptr;
    const std::string key = prefix + "." + spec.name;
    if (v == nullptr) {
      if (spec.required) {
        std::string shorthand = key;
        const std::string ia = ".init_args.";
        if (auto p = shorthand.find(ia); p != std::string::npos)
          shorthand.replace(p, ia.size(), ".");
        throw ConfigError("[cli] " + key + " is required (" + param_type_name(spec.type) +
                          ") for " + owner + " but was not set (" + parent.origin +
                          "); set it in the config or pass --" + shorthand + "=<value>.");
      }
      values[spec.name] = spec.default_value;
    } else if (null_is_default && v->is_null() && !spec.nullable && !spec.required) {
      values[spec.name] = spec.default_value;
    } else {
      values[spec.name] = parse_value(key, *v, spec);
      if (v->extends_default)
        values[spec.name] = after_default(spec.default_value, values[spec.name]);
    }
  }
  return Args(owner, std::move(values));
}

// Removes `key` from the mapping `map` (nothing when absent).
void remove_field(ConfigNode& map, const std::string& key) {
  auto& f = map.fields;
  f.erase(std::remove_if(f.begin(), f.end(), [&](const auto& kv) { return kv.first == key; }),
          f.end());
}

template <typename R>
ComponentConfig parse_component(const std::string& key, const ConfigNode* node,
                                const ConfigNode& parent, const R& reg) {
  static const ConfigNode kAbsent = [] {
    ConfigNode n;
    n.origin = "not set";
    return n;
  }();
  const ConfigNode& n = node != nullptr ? *node : kAbsent;
  const auto names = reg.names();
  std::string class_path;
  const ConfigNode* init_args = nullptr;
  if (n.is_null()) {
    if (names.size() != 1) {
      throw ConfigError("[cli] " + key + " is required (" + n.origin + "); choose a " + reg.kind() +
                        " with --" + key + "=NAME or " + key +
                        ".class_path in the config; registered: " + quoted_list(names, "(none)") +
                        (key == "data" ? "; or --data=null for the model's own loaders" : "") +
                        ".");
    }
    class_path = names.front();
  } else {
    if (!n.is_map())
      fail(key, n, "expected {class_path: NAME, init_args: {...}}, got " + n.describe() + ".");
    for (const auto& f : n.fields) {
      if (f.first != "class_path" && f.first != "init_args") {
        unknown_key(key, f.first, f.second, {"class_path", "init_args"});
      }
    }
    const ConfigNode* cp = n.find("class_path");
    if (cp == nullptr || cp->is_null()) {
      if (names.size() != 1) {
        throw ConfigError("[cli] " + key + ".class_path is required (" + n.origin +
                          "); registered " + reg.kind() + "s: " + quoted_list(names, "(none)") +
                          ".");
      }
      class_path = names.front();
    } else {
      if (!cp->is_scalar())
        fail(key + ".class_path", *cp, "expected a name, got " + cp->describe() + ".");
      class_path = lightning_class_name(reg, cp->scalar);
      if (!reg.contains(class_path)) {
        fail(key + ".class_path", *cp,
             "unknown " + reg.kind() + " \"" + class_path + "\"; valid names: " +
                 quoted_list(names, "(none)") + did_you_mean(class_path, names) +
                 (class_path.empty() ? " (to remove it, write --" + key + "=null)" : "") + ".");
      }
    }
    init_args = n.find("init_args");
  }
  const auto& entry = reg.at(class_path);
  // Lightning's spellings of three callbacks' arguments, read as volt's: Timer's duration in
  // Lightning's forms (as seconds, which the Timer takes too), and LearningRateMonitor's
  // logging_interval null (Lightning's default: each scheduler's own interval) as "auto".
  ConfigNode lightning_args;
  const auto edit = [&](const char* name) -> ConfigNode& {
    if (init_args != &lightning_args) {
      lightning_args = *init_args;
      init_args = &lightning_args;
    }
    return *lightning_args.find(name);
  };
  const bool callback_args =
      reg.kind() == "callback" && init_args != nullptr && init_args->is_map();
  if (callback_args && class_path == "Timer" && lightning_duration(init_args->find("duration"))) {
    ConfigNode& d = edit("duration");
    d = duration_in_seconds(key + ".init_args.duration", d);
  }
  // A strategy's `timeout` as Lightning prints it (str(timedelta): "0:30:00") or seconds: volt's
  // timeout_s.
  if (reg.kind() == "strategy" && init_args != nullptr && init_args->is_map() &&
      init_args->find("timeout") != nullptr && entry.params.find("timeout") == nullptr &&
      entry.params.find("timeout_s") != nullptr) {
    const ConfigNode t = *init_args->find("timeout");
    if (const ConfigNode* both = init_args->find("timeout_s"); both != nullptr && !t.is_null()) {
      fail(key + ".init_args.timeout", t,
           "is set and timeout_s (" + both->origin + ") too; keep one of the two.");
    }
    edit("timeout");
    remove_field(lightning_args, "timeout");
    if (!t.is_null()) {
      double seconds = 0;
      std::optional<double> td;
      if (t.is_scalar() && !t.quoted && parse_float(t.scalar, &seconds)) {
        td = seconds;
      } else if (t.is_scalar()) {
        td = python_timedelta_seconds(t.scalar);
      }
      if (!td) {
        fail(key + ".init_args.timeout", t,
             "expected a duration as Lightning prints a timedelta (\"0:30:00\", \"1 day, "
             "2:00:00\") or seconds, got " +
                 t.describe() + ".");
      }
      lightning_args.fields.emplace_back("timeout_s", seconds_node(*td, t.origin));
    }
  }
  // GradientAccumulationScheduler's scheduling as Lightning's dict ({0: 8, 4: 4}): volt's text
  // form "0:8, 4:4", which the callback parses and checks.
  if (callback_args && class_path == "GradientAccumulationScheduler") {
    const ConfigNode* sched = init_args->find("scheduling");
    if (sched != nullptr && sched->is_map() &&
        std::all_of(sched->fields.begin(), sched->fields.end(),
                    [](const auto& f) { return f.second.is_scalar(); })) {
      std::string text;
      for (const auto& f : sched->fields) {
        text += (text.empty() ? "" : ", ") + f.first + ":" + f.second.scalar;
      }
      ConfigNode& s = edit("scheduling");
      s = ConfigNode::make_scalar(text, s.origin);
    }
  }
  if (callback_args && class_path == "LearningRateMonitor") {
    const ConfigNode* interval = init_args->find("logging_interval");
    if (interval != nullptr && interval->is_null()) {
      ConfigNode& i = edit("logging_interval");
      i = ConfigNode::make_scalar("auto", i.origin);
    }
  }
  // Arguments only Lightning's class takes, at values that change nothing (a config Lightning
  // wrote holds every argument): dropped. Another value stays, refused as an unknown key.
  static const std::map<std::string, std::map<std::string, std::vector<std::string>>> kHarmless = {
      {"TensorBoardLogger", {{"log_graph", {"false", "False"}}, {"sub_dir", {}}}},
      {"ProgressBar", {{"process_position", {"0"}}}},
      {"TQDMProgressBar", {{"process_position", {"0"}}}},
      {"CyclicLR", {{"scale_fn", {}}}},
      // DDPStrategy's arguments that Lightning's Trainer fills in (null in a config it wrote);
      // "popen" is how volt's launcher starts the other processes too.
      {"ddp",
       {{"accelerator", {}},
        {"parallel_devices", {}},
        {"cluster_environment", {}},
        {"checkpoint_io", {}},
        {"precision_plugin", {}},
        {"ddp_comm_state", {}},
        {"ddp_comm_hook", {}},
        {"ddp_comm_wrapper", {}},
        {"model_averaging_period", {}},
        {"start_method", {"popen"}}}}};
  // Arguments of every PyTorch optimizer / scheduler a config Lightning wrote holds, at values
  // that change nothing (implementation choices and PyTorch 2's flags off).
  static const std::map<std::string, std::map<std::string, std::vector<std::string>>>
      kHarmlessOfKind = {{"optimizer",
                          {{"foreach", {"true", "false", "True", "False"}},
                           {"maximize", {"false", "False"}},
                           {"capturable", {"false", "False"}},
                           {"differentiable", {"false", "False"}},
                           {"fused", {"false", "False"}},
                           {"decoupled_weight_decay", {"false", "False"}}}},
                         {"lr_scheduler",
                          {{"last_epoch", {"-1"}}, {"verbose", {"false", "False", "deprecated"}}}}};
  for (const auto* table : {&kHarmless, &kHarmlessOfKind}) {
    const auto h = table->find(table == &kHarmless ? class_path : reg.kind());
    if (h == table->end() || init_args == nullptr || !init_args->is_map()) continue;
    for (const auto& harmless : h->second) {
      const std::string& arg = harmless.first;
      const std::vector<std::string>& values = harmless.second;
      if (entry.params.find(arg) != nullptr) continue;  // the class takes it: its own value
      const ConfigNode* v = init_args->find(arg);
      if (v == nullptr ||
          !(v->is_null() || (v->is_scalar() && !v->quoted &&
                             std::find(values.begin(), values.end(), v->scalar) != values.end()))) {
        continue;
      }
      edit(arg.c_str());  // init_args is the editable copy from here
      remove_field(lightning_args, arg);
    }
  }
  ComponentConfig c;
  c.class_path = class_path;
  c.params = &entry.params;
  // A null argument of volt's own components takes its default, as a config Lightning wrote
  // holds every argument, None for the unset ones (ModelCheckpoint's dirpath: null); a model's
  // or data module's own arguments keep the strict rule.
  const bool builtin = reg.kind() != "model" && reg.kind() != "data module";
  c.args = parse_args(key + ".init_args", reg.kind() + " " + class_path, init_args, n, entry.params,
                      {}, /*null_is_default=*/builtin);
  return c;
}

template <typename R>
std::vector<ComponentConfig> parse_component_list(const std::string& key, const ConfigNode* node,
                                                  const R& reg) {
  std::vector<ComponentConfig> out;
  if (node == nullptr || node->is_null()) return out;
  // One component, as Lightning's Trainer also takes it (a name is its class_path).
  if (node->is_map()) {
    out.push_back(parse_component(key, node, *node, reg));
    return out;
  }
  if (node->is_scalar()) {
    ConfigNode one = ConfigNode::make_map(node->origin);
    one.field("class_path", node->origin) = *node;
    out.push_back(parse_component(key, &one, *node, reg));
    return out;
  }
  if (!node->is_list()) {
    fail(key, *node,
         "expected a list of {class_path, init_args} items, got " + node->describe() + ".");
  }
  for (size_t i = 0; i < node->items.size(); ++i) {
    out.push_back(parse_component(key + "." + std::to_string(i), &node->items[i], *node, reg));
  }
  return out;
}

// ------------------------------------------------------------------------------------ emitting

bool plain_safe(const std::string& s) {
  if (s.empty()) return false;
  static const char* kReserved[] = {"null", "Null",  "NULL",  "~",     "true", "True",
                                    "TRUE", "false", "False", "FALSE", "yes",  "no",
                                    "on",   "off",   "Yes",   "No",    "On",   "Off"};
  for (const char* r : kReserved) {
    if (s == r) return false;
  }
  if (!(detail::ascii_alpha(s[0]) || s[0] == '_' || s[0] == '/')) return false;
  for (char c : s) {
    if (!(detail::ascii_alnum(c) || c == '_' || c == '-' || c == '.' || c == '/')) {
      return false;
    }
  }
  return true;
}

std::string yaml_string(const std::string& s) {
  if (plain_safe(s)) return s;
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default: out += c;
    }
  }
  return out + "\"";
}

std::string yaml_float(double d) {
  if (std::isnan(d)) return ".nan";
  if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);  // shortest text that reads back exactly
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

template <typename T, typename F>
std::string flow_list(const std::vector<T>& v, F f) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + f(v[i]);
  return s + "]";
}

void emit_component(std::ostringstream& os, const ComponentConfig& c, int indent, bool list_item);

/// `replace`: parameters written as a component instead of their value (trainer.strategy).
void emit_args(std::ostringstream& os, const Params& params, const Args& args, int indent,
               const std::map<std::string, const ComponentConfig*>& replace = {}) {
  const std::string pad(indent, ' ');
  if (params.specs().empty()) {
    os << " {}\n";
    return;
  }
  os << "\n";
  for (const auto& spec : params.specs()) {
    auto it = replace.find(spec.name);
    if (it != replace.end() && it->second != nullptr) {
      os << pad << spec.name << ":\n";
      emit_component(os, *it->second, indent + 2, false);
      continue;
    }
    os << pad << spec.name << ": " << yaml_value(args.values().at(spec.name)) << "\n";
  }
}

void emit_component(std::ostringstream& os, const ComponentConfig& c, int indent, bool list_item) {
  const std::string pad(indent, ' ');
  os << (list_item ? pad.substr(2) + "- " : pad) << "class_path: " << yaml_string(c.class_path)
     << "\n";
  os << pad << "init_args:";
  emit_args(os, *c.params, c.args, indent + 2);
}

}  // namespace

std::string yaml_value(const ParamValue& v) {
  struct Visitor {
    std::string operator()(std::monostate) const { return "null"; }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return yaml_float(d); }
    std::string operator()(const std::string& s) const { return yaml_string(s); }
    std::string operator()(const std::vector<int64_t>& v) const {
      return flow_list(v, [](int64_t i) { return std::to_string(i); });
    }
    std::string operator()(const std::vector<double>& v) const { return flow_list(v, yaml_float); }
    std::string operator()(const std::vector<std::string>& v) const {
      return flow_list(v, yaml_string);
    }
  };
  return std::visit(Visitor{}, v);
}

Params trainer_params(const Registry& reg) {
  const TrainerOptions d;
  const auto limit = [](const Limit& l) -> ParamValue {
    if (l.is_fraction()) return l.fraction();
    return l.count();
  };
  std::vector<std::string> strategies = {"auto"};
  for (const auto& n : reg.strategies.names()) strategies.push_back(n);
  std::vector<std::string> accelerators = {"auto"};
  for (const auto& n : reg.accelerators.names()) accelerators.push_back(n);
  return Params()
      .choice("accelerator", d.accelerator().name(), accelerators, "hardware to run on")
      .add("devices", d.devices(),
           "processes (devices) per node; -1 or auto = all devices (1 on cpu)")
      .add("num_nodes", d.num_nodes(), "nodes taking part (world size = devices x num_nodes)")
      .choice("strategy", d.strategy().name(), strategies, "how work spreads over devices")
      .choice("precision", d.precision().name(), reg.precisions.names(), "numeric precision")
      .optional<int64_t>("max_epochs",
                         "stop after this many epochs; -1 = no limit; null = no limit when "
                         "max_steps or max_time bounds the fit, else 1000")
      .optional<int64_t>("min_epochs",
                         "ignore stop requests until this many epochs; null = 1 when min_steps "
                         "is set, else 0")
      .add("max_steps", d.max_steps(), "stop after this many optimizer steps; -1 = no limit")
      .optional<int64_t>("min_steps", "ignore stop requests until this many optimizer steps")
      .optional<double>("max_time",
                        "stop fit after this much training time: seconds, \"DD:HH:MM:SS\" or "
                        "{days: .., hours: ..}; min_epochs/min_steps come first")
      .number("limit_train_batches", limit(d.limit_train_batches()),
              "batches per epoch: count (int) or fraction (float)")
      .number("limit_val_batches", limit(d.limit_val_batches()),
              "validation batches: count or fraction")
      .number("limit_test_batches", limit(d.limit_test_batches()),
              "test batches: count or fraction")
      .number("limit_predict_batches", limit(d.limit_predict_batches()),
              "predict batches: count or fraction")
      .number("val_check_interval", limit(d.val_check_interval()),
              "validate every N batches (int) or epoch fraction (float)")
      .add("check_val_every_n_epoch", *d.check_val_every_n_epoch(),
           "validate every N epochs; null: every val_check_interval batches of the whole fit")
      .or_none()
      .optional<double>("val_check_interval_s",
                        "validate every this many seconds of training (also "
                        "val_check_interval: \"DD:HH:MM:SS\" or {minutes: ..})")
      .add("reload_dataloaders_every_n_epochs", d.reload_dataloaders_every_n_epochs(),
           "ask the data module for new loaders every N epochs (0 = once)")
      .add("return_predictions", d.return_predictions(),
           "predict keeps every output and writes predictions.safetensors; false keeps none "
           "(write them with a SafetensorsPredictionWriter callback)")
      .add("num_sanity_val_steps", d.num_sanity_val_steps(),
           "validation batches before training; -1 = all")
      .add("fast_dev_run", d.fast_dev_run(),
           "N > 0 (or true: 1): run N batches of each stage once, no logs/checkpoints")
      .number("overfit_batches", limit(d.overfit_batches()),
              "debug: train on the same batches every epoch, count or fraction; 0 = off")
      .add("accumulate_grad_batches", d.accumulate_grad_batches(), "batches per optimizer step")
      .optional<double>("gradient_clip_val", "clip gradients to this norm/value")
      .choice("gradient_clip_algorithm", "norm", {"norm", "value"}, "total 2-norm or elementwise")
      .add("log_every_n_steps", d.log_every_n_steps(), "send step metrics to loggers every N steps")
      .add("enable_progress_bar", d.enable_progress_bar(), "show the terminal progress bar")
      .add("enable_checkpointing", d.enable_checkpointing(),
           "add a ModelCheckpoint when none is given")
      .add("enable_model_summary", d.enable_model_summary(),
           "log a ModelSummary at fit start when none is given")
      .add("logger", d.logger(), "add a CSVLogger when trainer.loggers is empty")
      .add("default_root_dir", d.default_root_dir(), "root folder for logs and checkpoints")
      .add("use_distributed_sampler", d.use_distributed_sampler(),
           "with several processes, shard every loader by rank")
      .add("sync_batchnorm", d.sync_batchnorm(),
           "with several processes, BatchNorm normalises over the global batch (ddp)")
      .add("deterministic", d.deterministic(), "use deterministic algorithms only")
      .optional<bool>("benchmark", "cuDNN autotuning; unset: off when deterministic, else kept")
      .add("detect_nonfinite_loss", d.detect_nonfinite_loss(), "fail on a NaN/inf training loss")
      .add("barebones", d.barebones(),
           "measure the Trainer's own overhead: no checkpoints, logger, progress bar, summary, "
           "sanity check, loss check or log() calls")
      .add("inference_mode", d.inference_mode(),
           "evaluate under c10::InferenceMode (false: NoGradGuard, for outputs used in training)")
      .add("detect_anomaly", d.detect_anomaly(),
           "debug: autograd anomaly detection (names the backward op giving NaN; slow)")
      .add("handle_signals", d.handle_signals(),
           "SIGINT/SIGTERM stop at a batch boundary (all ranks alike); a second one at once")
      .add("graph_training_step", d.graph_training_step(),
           "replay the training step from CUDA graphs (eager where it cannot, logged)")
      .add("trace_training_step", d.trace_training_step(),
           "trace training_step and replay it with fused CPU elementwise chains (eager where "
           "it cannot, logged)")
      .add("num_threads", d.num_threads(), "torch intra-op threads; 0 = volt's measured default")
      .add("reuse_host_memory", d.reuse_host_memory(),
           "let the C library's malloc keep freed memory for reuse (process-wide)")
      .add("progress_refresh_s", d.progress_refresh_s(), "progress bar refresh period (seconds)");
}

TrainerOptions trainer_options(const Args& a) {
  // As Lightning's _determine_batch_limits: a whole-number float above 1 is a batch count
  // (limit_train_batches: 10.0 runs 10 batches; it was "not a valid fraction").
  const auto limit = [&](const char* name) -> Limit {
    if (a.holds<int64_t>(name)) return Limit(a.get<int64_t>(name));
    const double v = a.get<double>(name);
    if (v > 1.0 && v < 9.0e15 && v == std::floor(v)) return Limit(static_cast<int64_t>(v));
    return Limit(v);
  };
  TrainerOptions o;
  o.accelerator(a.get<std::string>("accelerator"))
      .devices(a.get<int64_t>("devices"))
      .num_nodes(a.get<int64_t>("num_nodes"))
      .strategy(a.get<std::string>("strategy"))
      .precision(a.get<std::string>("precision"))
      .max_steps(a.get<int64_t>("max_steps"))
      .limit_train_batches(limit("limit_train_batches"))
      .limit_val_batches(limit("limit_val_batches"))
      .limit_test_batches(limit("limit_test_batches"))
      .limit_predict_batches(limit("limit_predict_batches"))
      .val_check_interval(limit("val_check_interval"))
      .check_val_every_n_epoch(c10::optional<int64_t>())
      .reload_dataloaders_every_n_epochs(a.get<int64_t>("reload_dataloaders_every_n_epochs"))
      .return_predictions(a.get<bool>("return_predictions"))
      .num_sanity_val_steps(a.get<int64_t>("num_sanity_val_steps"))
      .fast_dev_run(a.get<int64_t>("fast_dev_run"))
      .overfit_batches(limit("overfit_batches"))
      .accumulate_grad_batches(a.get<int64_t>("accumulate_grad_batches"))
      .gradient_clip_algorithm(a.get<std::string>("gradient_clip_algorithm") == "value"
                                   ? ClipAlgorithm::kValue
                                   : ClipAlgorithm::kNorm)
      .log_every_n_steps(a.get<int64_t>("log_every_n_steps"))
      .enable_progress_bar(a.get<bool>("enable_progress_bar"))
      .enable_checkpointing(a.get<bool>("enable_checkpointing"))
      .enable_model_summary(a.get<bool>("enable_model_summary"))
      .logger(a.get<bool>("logger"))
      .default_root_dir(a.get<std::string>("default_root_dir"))
      .use_distributed_sampler(a.get<bool>("use_distributed_sampler"))
      .sync_batchnorm(a.get<bool>("sync_batchnorm"))
      .deterministic(a.get<bool>("deterministic"))
      .detect_nonfinite_loss(a.get<bool>("detect_nonfinite_loss"))
      .inference_mode(a.get<bool>("inference_mode"))
      .detect_anomaly(a.get<bool>("detect_anomaly"))
      .handle_signals(a.get<bool>("handle_signals"))
      .graph_training_step(a.get<bool>("graph_training_step"))
      .trace_training_step(a.get<bool>("trace_training_step"))
      .num_threads(a.get<int64_t>("num_threads"))
      .reuse_host_memory(a.get<bool>("reuse_host_memory"))
      .progress_refresh_s(a.get<double>("progress_refresh_s"));
  if (auto v = a.get_optional<int64_t>("check_val_every_n_epoch")) o.check_val_every_n_epoch(*v);
  if (auto v = a.get_optional<int64_t>("max_epochs")) o.max_epochs(*v);
  if (auto v = a.get_optional<int64_t>("min_epochs")) o.min_epochs(*v);
  if (auto v = a.get_optional<int64_t>("min_steps")) o.min_steps(*v);
  if (auto v = a.get_optional<double>("max_time")) o.max_time(*v);
  if (auto v = a.get_optional<double>("val_check_interval_s")) o.val_check_interval_s(*v);
  if (auto v = a.get_optional<double>("gradient_clip_val")) o.gradient_clip_val(*v);
  if (auto v = a.get_optional<bool>("benchmark")) o.benchmark(*v);
  // Last: barebones turns the features it excludes off over their defaults (which are on, so
  // the config cannot tell a default from a choice there); the others are checked.
  if (a.get<bool>("barebones")) o.barebones(true);
  return o;
}

namespace {

// seed_everything=true: the seed the process that started this one chose (VOLT_GLOBAL_SEED, as
// Lightning reads PL_GLOBAL_SEED), else a random one in [0, 2^32), as Lightning's
// _select_seed_randomly. The processes of a job started by torchrun or Slurm would each draw
// their own (they meet only later, in the process group): refused there.
int64_t chosen_seed(const ConfigNode& node) {
  if (const auto inherited = env_value("VOLT_GLOBAL_SEED")) {
    int64_t seed = 0;
    if (!parse_int(*inherited, &seed) || seed < 0) {
      fail("seed_everything", node,
           "is true and VOLT_GLOBAL_SEED=\"" + *inherited +
               "\" (the seed a parent process chose) is not a seed; unset it or set a whole "
               "number >= 0.");
    }
    return seed;
  }
  for (const char* var : {"WORLD_SIZE", "SLURM_NTASKS"}) {
    int64_t n = 0;
    const auto v = env_value(var);
    if (v && parse_int(*v, &n) && n > 1) {
      fail("seed_everything", node,
           std::string("is true, which picks a random seed, but this is one of ") +
               std::to_string(n) + " processes (" + var +
               ") and each would pick its own; give the seed as a number, e.g. "
               "--seed_everything=42.");
    }
  }
  std::random_device device;
  return static_cast<int64_t>(device());
}

}  // namespace

ResolvedConfig resolve(const ConfigNode& root, const Registry& reg) {
  // verbose, weights_only and return_predictions are the arguments of Lightning's
  // Trainer.validate / test / predict, which its CLI writes at the top of a config.
  static const std::vector<std::string> kTop = {
      "seed_everything", "ckpt_path",          "trainer",   "model",       "data", "verbose",
      "weights_only",    "return_predictions", "optimizer", "lr_scheduler"};
  VOLT_ASSERT(root.is_map(), "config root must be a map");
  for (const auto& f : root.fields) {
    if (std::find(kTop.begin(), kTop.end(), f.first) == kTop.end()) {
      unknown_key("", f.first, f.second, kTop);
    }
  }
  ResolvedConfig out;
  if (const ConfigNode* s = root.find("seed_everything"); s != nullptr && !s->is_null()) {
    bool flag = false;
    if (s->is_scalar() && !s->quoted && parse_bool(s->scalar, &flag)) {
      // LightningCLI's bool: false seeds nothing, true a seed chosen here and recorded in the
      // saved config (its _set_seed).
      if (flag) out.seed_everything = chosen_seed(*s);
    } else {
      ParamSpec spec{"seed_everything", ParamType::kInt, false, true, {}, {}, ""};
      out.seed_everything = std::get<int64_t>(parse_value("seed_everything", *s, spec));
      if (*out.seed_everything < 0) fail("seed_everything", *s, "must be >= 0.");
    }
  }
  if (const ConfigNode* c = root.find("ckpt_path"); c != nullptr && !c->is_null()) {
    ParamSpec spec{"ckpt_path", ParamType::kString, false, true, {}, {}, ""};
    out.ckpt_path = std::get<std::string>(parse_value("ckpt_path", *c, spec));
  }

  if (const ConfigNode* v = root.find("verbose"); v != nullptr && !v->is_null()) {
    ParamSpec spec{"verbose", ParamType::kBool, false, true, {}, {}, ""};
    out.verbose = std::get<bool>(parse_value("verbose", *v, spec));
  }
  // LightningCLI's automatic optimizer and lr_scheduler (null when unused): built over the
  // module's parameters in place of its configure_optimizers() (see cli.cpp).
  if (const ConfigNode* o = root.find("optimizer"); o != nullptr && !o->is_null()) {
    out.optimizer = parse_component("optimizer", o, root, reg.optimizers);
  }
  if (const ConfigNode* l = root.find("lr_scheduler"); l != nullptr && !l->is_null()) {
    // Lightning ignores a scheduler without an optimizer; said here, as it would not run.
    if (!out.optimizer) {
      fail("lr_scheduler", *l,
           "is set without an optimizer: LightningCLI's automatic configure_optimizers needs "
           "both; add --optimizer=NAME (e.g. SGD, Adam), or remove the lr_scheduler and let the "
           "module's configure_optimizers() make its scheduler.");
    }
    out.lr_scheduler = parse_component("lr_scheduler", l, root, reg.lr_schedulers);
  }
  // torch.load's weights_only restricts what unpickling may run; volt's checkpoints hold no
  // pickled code, so either value loads the same. Checked, then nothing to do.
  if (const ConfigNode* w = root.find("weights_only"); w != nullptr && !w->is_null()) {
    ParamSpec spec{"weights_only", ParamType::kBool, false, true, {}, {}, ""};
    parse_value("weights_only", *w, spec);
  }

  out.trainer_params = trainer_params(reg);
  const ConfigNode* t = root.find("trainer");
  const ConfigNode empty_trainer = ConfigNode::make_map("not set");
  if (t == nullptr) t = &empty_trainer;
  // trainer.strategy and trainer.precision are a name ("ddp", "bf16-mixed") or a component with
  // parameters ({class_path: ddp, init_args: {bucket_cap_mb: 5}}); the trainer's own schema
  // checks the plain names, parse_component the components.
  ConfigNode trimmed;
  const ConfigNode* trainer_node = t;
  // The trainer mapping as parse_args will read it: a copy of `t` from the first change on.
  auto edited = [&]() -> ConfigNode& {
    if (trainer_node != &trimmed) {
      trimmed = *t;
      trainer_node = &trimmed;
    }
    return trimmed;
  };
  const auto drop = [&](const std::string& name) { remove_field(edited(), name); };
  auto take_component = [&](const std::string& name, const auto& registry,
                            std::optional<ComponentConfig>& slot) {
    const ConfigNode* node = t != nullptr && t->is_map() ? t->find(name) : nullptr;
    if (node == nullptr || !node->is_map()) return;
    slot = parse_component("trainer." + name, node, *t, registry);
    drop(name);
  };
  // Lightning's Trainer.predict(return_predictions=...) at the config's top: the trainer's.
  if (const ConfigNode* rp = root.find("return_predictions");
      rp != nullptr && !rp->is_null() && t->is_map()) {
    if (const ConfigNode* own = t->find("return_predictions"); own != nullptr && !own->is_null()) {
      fail("return_predictions", *rp,
           "is set and trainer.return_predictions (" + own->origin + ") too; keep one.");
    }
    drop("return_predictions");
    edited().fields.emplace_back("return_predictions", *rp);
  }
  // Lightning's strategy names that are ddp with find_unused_parameters set.
  if (const ConfigNode* st = t->is_map() ? t->find("strategy") : nullptr;
      st != nullptr && st->is_scalar() &&
      (st->scalar == "ddp_find_unused_parameters_true" ||
       st->scalar == "ddp_find_unused_parameters_false")) {
    ConfigNode ddp = ConfigNode::make_map(st->origin);
    ddp.field("class_path", st->origin) = ConfigNode::make_scalar("ddp", st->origin);
    ConfigNode& ia = ddp.field("init_args", st->origin);
    ia = ConfigNode::make_map(st->origin);
    ia.field("find_unused_parameters", st->origin) = ConfigNode::make_scalar(
        st->scalar == "ddp_find_unused_parameters_true" ? "true" : "false", st->origin);
    out.strategy = parse_component("trainer.strategy", &ddp, *t, reg.strategies);
    drop("strategy");
  }
  take_component("strategy", reg.strategies, out.strategy);
  take_component("precision", reg.precisions, out.precision);
  // Trainer arguments of Lightning that volt has no use for, accepted at the values that change
  // nothing (a config Lightning wrote holds them all).
  if (t->is_map()) {
    const auto lightning_only = [&](const char* name, const auto& harmless, const char* why) {
      const ConfigNode* n = t->find(name);
      if (n == nullptr) return;
      if (!harmless(*n)) fail(std::string("trainer.") + name, *n, why);
      drop(name);
    };
    const auto null_or_empty = [](const ConfigNode& n) {
      return n.is_null() || (n.is_list() && n.items.empty());
    };
    const auto is_bool = [](const ConfigNode& n) {
      bool b;
      return n.is_null() || (n.is_scalar() && !n.quoted && parse_bool(n.scalar, &b));
    };
    const auto null_or_true = [](const ConfigNode& n) {
      bool b = false;
      return n.is_null() || (n.is_scalar() && !n.quoted && parse_bool(n.scalar, &b) && b);
    };
    lightning_only("plugins", null_or_empty,
                   "holds Lightning plugins, which volt does not take; precision and checkpoint "
                   "I/O are trainer.precision and trainer.checkpoint_io, and the cluster "
                   "environment is detected (torchrun, Slurm); remove it or set it to null.");
    lightning_only("model_registry", null_or_empty,
                   "names a Lightning model registry, which volt has none of; remove it or set it "
                   "to null.");
    lightning_only("enable_autolog_hparams", null_or_true,
                   "is false, but volt always logs the module's hparams() to the loggers; remove "
                   "it (or set it to true), or return no hparams from the module.");
    lightning_only("suggest_integrations", is_bool, "expected a bool.");
  }
  // devices: auto is Lightning's spelling of -1 (every device of the accelerator).
  if (const ConfigNode* dev = t != nullptr && t->is_map() ? t->find("devices") : nullptr;
      dev != nullptr && dev->is_scalar() && dev->scalar == "auto") {
    ConfigNode& devices = *edited().find("devices");
    devices.scalar = "-1";
    devices.quoted = false;
  }
  // trainer.logger holding loggers (Lightning's Trainer(logger=[...])): logging on, the loggers
  // read below.
  if (const ConfigNode* lg = t->is_map() ? t->find("logger") : nullptr;
      lg != nullptr && (lg->is_map() || lg->is_list())) {
    ConfigNode& n = *edited().find("logger");
    n = ConfigNode::make_scalar(lg->is_list() && lg->items.empty() ? "false" : "true", lg->origin);
  }
  // fast_dev_run: true / false is Lightning's spelling of 1 / 0.
  if (const ConfigNode* fd = t != nullptr && t->is_map() ? t->find("fast_dev_run") : nullptr;
      fd != nullptr && fd->is_scalar() && !fd->quoted) {
    bool on = false;
    if (parse_bool(fd->scalar, &on)) {
      ConfigNode& n = *edited().find("fast_dev_run");
      n.scalar = on ? "1" : "0";
    }
  }
  if (const ConfigNode* mt = t != nullptr && t->is_map() ? t->find("max_time") : nullptr;
      lightning_duration(mt)) {
    *edited().find("max_time") = duration_in_seconds("trainer.max_time", *mt);
  }
  // val_check_interval as a duration (Lightning 2.6's time-based validation) is
  // val_check_interval_s.
  if (const ConfigNode* vc = t != nullptr && t->is_map() ? t->find("val_check_interval") : nullptr;
      lightning_duration(vc)) {
    if (const ConfigNode* both = t->find("val_check_interval_s");
        both != nullptr && !both->is_null()) {
      fail("trainer.val_check_interval", *vc,
           "is a duration and trainer.val_check_interval_s (" + both->origin +
               ") is set too; keep one of the two.");
    }
    ConfigNode seconds = duration_in_seconds("trainer.val_check_interval", *vc);
    drop("val_check_interval");
    drop("val_check_interval_s");
    edited().fields.emplace_back("val_check_interval_s", std::move(seconds));
  }
  out.trainer = parse_args("trainer", "trainer", trainer_node, root, out.trainer_params,
                           {"callbacks", "loggers", "profiler", "checkpoint_io"},
                           /*null_is_default=*/true);
  const ConfigNode* prof = t != nullptr && t->is_map() ? t->find("profiler") : nullptr;
  if (prof != nullptr && !prof->is_null()) {
    out.profiler = parse_component("trainer.profiler", prof, *t, reg.profilers);
  }
  const ConfigNode* cio = t != nullptr && t->is_map() ? t->find("checkpoint_io") : nullptr;
  if (cio != nullptr && !cio->is_null()) {
    out.checkpoint_io = parse_component("trainer.checkpoint_io", cio, *t, reg.checkpoint_ios);
  }
  const ConfigNode* cbs = t != nullptr && t->is_map() ? t->find("callbacks") : nullptr;
  const ConfigNode* lgs = t != nullptr && t->is_map() ? t->find("loggers") : nullptr;
  out.callbacks = parse_component_list("trainer.callbacks", cbs, reg.callbacks);
  out.loggers = parse_component_list("trainer.loggers", lgs, reg.loggers);
  // Lightning's Trainer(logger=...) also takes the loggers themselves, one or a list.
  if (const ConfigNode* lg = t->is_map() ? t->find("logger") : nullptr;
      lg != nullptr && (lg->is_map() || lg->is_list())) {
    if (!out.loggers.empty()) {
      fail("trainer.logger", *lg,
           "holds loggers and trainer.loggers (" + lgs->origin +
               ") does too; keep one of the two lists.");
    }
    out.loggers = parse_component_list("trainer.logger", lg, reg.loggers);
  }
  out.model = parse_component("model", root.find("model"), root, reg.models);
  // `data: null` (written, not absent): the model brings its loaders.
  const ConfigNode* data = root.find("data");
  if (data == nullptr || !data->is_null()) {
    out.data = parse_component("data", data, root, reg.data_modules);
  }
  return out;
}

std::string to_yaml(const ResolvedConfig& c) {
  auto os = detail::c_stream<std::ostringstream>();
  os << "# volt resolved config: every option with its value; load it with --config.\n";
  os << "seed_everything: "
     << (c.seed_everything ? std::to_string(*c.seed_everything) : std::string("null")) << "\n";
  os << "ckpt_path: " << (c.ckpt_path ? yaml_string(*c.ckpt_path) : std::string("null")) << "\n";
  if (!c.verbose) os << "verbose: false\n";
  os << "trainer:";
  emit_args(os, c.trainer_params, c.trainer, 2,
            {{"strategy", c.strategy ? &*c.strategy : nullptr},
             {"precision", c.precision ? &*c.precision : nullptr}});
  os << "  callbacks:" << (c.callbacks.empty() ? " []\n" : "\n");
  for (const auto& cb : c.callbacks) emit_component(os, cb, 6, true);
  os << "  loggers:" << (c.loggers.empty() ? " []\n" : "\n");
  for (const auto& lg : c.loggers) emit_component(os, lg, 6, true);
  os << "  profiler:" << (c.profiler ? "\n" : " null\n");
  if (c.profiler) emit_component(os, *c.profiler, 4, false);
  os << "  checkpoint_io:" << (c.checkpoint_io ? "\n" : " null\n");
  if (c.checkpoint_io) emit_component(os, *c.checkpoint_io, 4, false);
  os << "model:\n";
  emit_component(os, c.model, 2, false);
  os << "data:" << (c.data ? "\n" : " null\n");
  if (c.data) emit_component(os, *c.data, 2, false);
  os << "optimizer:" << (c.optimizer ? "\n" : " null\n");
  if (c.optimizer) emit_component(os, *c.optimizer, 2, false);
  os << "lr_scheduler:" << (c.lr_scheduler ? "\n" : " null\n");
  if (c.lr_scheduler) emit_component(os, *c.lr_scheduler, 2, false);
  return os.str();
}

}  // namespace detail
}  // namespace volt
