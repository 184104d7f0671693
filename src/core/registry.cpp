#include "volt/core/registry.h"

#include <algorithm>

#include "core/detail/ascii.h"
#include "core/detail/edit_distance.h"
#include "volt/core/check.h"

namespace volt {

const char* param_type_name(ParamType type) {
  switch (type) {
    case ParamType::kBool: return "bool";
    case ParamType::kInt: return "int";
    case ParamType::kFloat: return "float";
    case ParamType::kString: return "str";
    case ParamType::kIntList: return "list[int]";
    case ParamType::kFloatList: return "list[float]";
    case ParamType::kStringList: return "list[str]";
    case ParamType::kNumber: return "int|float";
  }
  return "?";
}

ParamType param_value_type(const ParamValue& value) {
  switch (value.index()) {
    case 1: return ParamType::kBool;
    case 2: return ParamType::kInt;
    case 3: return ParamType::kFloat;
    case 4: return ParamType::kString;
    case 5: return ParamType::kIntList;
    case 6: return ParamType::kFloatList;
    case 7: return ParamType::kStringList;
    default: break;
  }
  VOLT_ASSERT(false, "param_value_type of a none value");
  return ParamType::kString;
}

// ------------------------------------------------------------------------------------- Params

Params& Params::push(ParamSpec spec) {
  VOLT_CHECK(!spec.name.empty() && spec.name.find('.') == std::string::npos, ConfigError,
             "[Registry] parameter name \"", spec.name,
             "\" is invalid; use a non-empty name without dots.");
  VOLT_CHECK(find(spec.name) == nullptr, ConfigError, "[Registry] parameter \"", spec.name,
             "\" is declared twice; give each parameter one declaration.");
  specs_.push_back(std::move(spec));
  return *this;
}

const ParamSpec* Params::find(const std::string& name) const {
  for (const auto& s : specs_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

namespace {
ParamSpec with_default(std::string name, ParamValue v, std::string help) {
  ParamSpec s;
  s.name = std::move(name);
  s.type = param_value_type(v);
  s.default_value = std::move(v);
  s.help = std::move(help);
  return s;
}
}  // namespace

Params& Params::add(std::string name, bool v, std::string help) {
  return push(with_default(std::move(name), v, std::move(help)));
}
Params& Params::add(std::string name, int v, std::string help) {
  return push(with_default(std::move(name), static_cast<int64_t>(v), std::move(help)));
}
Params& Params::add(std::string name, int64_t v, std::string help) {
  return push(with_default(std::move(name), v, std::move(help)));
}
Params& Params::add(std::string name, double v, std::string help) {
  return push(with_default(std::move(name), v, std::move(help)));
}
Params& Params::add(std::string name, const char* v, std::string help) {
  return push(with_default(std::move(name), std::string(v), std::move(help)));
}
Params& Params::add(std::string name, std::string v, std::string help) {
  return push(with_default(std::move(name), std::move(v), std::move(help)));
}
Params& Params::add(std::string name, std::vector<int64_t> v, std::string help) {
  return push(with_default(std::move(name), std::move(v), std::move(help)));
}
Params& Params::add(std::string name, std::vector<double> v, std::string help) {
  return push(with_default(std::move(name), std::move(v), std::move(help)));
}
Params& Params::add(std::string name, std::vector<std::string> v, std::string help) {
  return push(with_default(std::move(name), std::move(v), std::move(help)));
}
Params& Params::or_none() {
  VOLT_CHECK(!specs_.empty() && !specs_.back().required, ConfigError,
             "[Registry] or_none() follows the declaration of a parameter with a default.");
  specs_.back().nullable = true;
  return *this;
}

Params& Params::number(std::string name, ParamValue v, std::string help) {
  VOLT_CHECK(std::holds_alternative<int64_t>(v) || std::holds_alternative<double>(v), ConfigError,
             "[Registry] default of number parameter \"", name, "\" must be an int or a float.");
  ParamSpec s = with_default(std::move(name), std::move(v), std::move(help));
  s.type = ParamType::kNumber;
  return push(std::move(s));
}
Params& Params::choice(std::string name, std::string v, std::vector<std::string> choices,
                       std::string help) {
  VOLT_CHECK(std::find(choices.begin(), choices.end(), v) != choices.end(), ConfigError,
             "[Registry] default \"", v, "\" of parameter \"", name,
             "\" is not one of its choices; add it to the choices.");
  ParamSpec s = with_default(std::move(name), std::move(v), std::move(help));
  s.choices = std::move(choices);
  return push(std::move(s));
}

// --------------------------------------------------------------------------------------- Args

const ParamValue& Args::at(const std::string& name) const {
  auto it = values_.find(name);
  VOLT_CHECK(it != values_.end(), InternalError, "[Registry] ", owner_, " reads parameter \"", name,
             "\" that it did not declare; add it to its Params.");
  return it->second;
}

void Args::type_mismatch(const std::string& name, ParamType asked) const {
  const ParamValue& v = at(name);
  throw InternalError(detail::str_cat("[Registry] ", owner_, " reads parameter \"", name, "\" as ",
                                      param_type_name(asked), " but it holds ",
                                      std::holds_alternative<std::monostate>(v)
                                          ? "none (use get_optional)"
                                          : param_type_name(param_value_type(v)),
                                      "; read it with the type it was declared with."));
}

Args default_args(const std::string& owner, const Params& params) {
  std::map<std::string, ParamValue> values;
  for (const auto& s : params.specs()) {
    VOLT_CHECK(!s.required, ConfigError, "[Registry] ", owner, " needs parameter \"", s.name,
               "\" (", param_type_name(s.type), "); set it in the config.");
    values[s.name] = s.default_value;
  }
  return Args(owner, std::move(values));
}

Args complete_args(const std::string& owner, const Params& params, const Args& given) {
  std::vector<std::string> names;
  for (const auto& s : params.specs()) names.push_back(s.name);
  for (const auto& [name, value] : given.values()) {
    const ParamSpec* s = params.find(name);
    VOLT_CHECK(s != nullptr, ConfigError, "[Registry] ", owner, " has no parameter \"", name, "\"",
               did_you_mean(name, names), "; its parameters: ", quoted_list(names, "(none)"), ".");
    if (std::holds_alternative<std::monostate>(value)) {
      VOLT_CHECK(s->nullable, ConfigError, "[Registry] ", owner, " parameter \"", name,
                 "\" cannot be none; give it a ", param_type_name(s->type), ".");
      continue;
    }
    const ParamType t = param_value_type(value);
    const bool fits =
        t == s->type ||
        (s->type == ParamType::kNumber && (t == ParamType::kInt || t == ParamType::kFloat)) ||
        (s->type == ParamType::kFloat && t == ParamType::kInt);
    VOLT_CHECK(fits, ConfigError, "[Registry] ", owner, " parameter \"", name, "\" is ",
               param_type_name(s->type), " but was given ", param_type_name(t), ".");
    if (!s->choices.empty()) {
      const auto& v = std::get<std::string>(value);
      VOLT_CHECK(std::find(s->choices.begin(), s->choices.end(), v) != s->choices.end(),
                 ConfigError, "[Registry] ", owner, " parameter \"", name, "\" is \"", v,
                 "\"; valid values: ", quoted_list(s->choices), did_you_mean(v, s->choices), ".");
    }
  }
  std::map<std::string, ParamValue> values;
  for (const auto& s : params.specs()) {
    auto it = given.values().find(s.name);
    if (it == given.values().end()) {
      VOLT_CHECK(!s.required, ConfigError, "[Registry] ", owner, " needs parameter \"", s.name,
                 "\" (", param_type_name(s.type), "); set it.");
      values[s.name] = s.default_value;
    } else if (s.type == ParamType::kFloat && std::holds_alternative<int64_t>(it->second)) {
      values[s.name] = static_cast<double>(std::get<int64_t>(it->second));
    } else {
      values[s.name] = it->second;
    }
  }
  return Args(owner, std::move(values));
}

// ------------------------------------------------------------------------------ suggestions

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  // No name is that long: a word this long (a pasted value, a hostile config) is no typo.
  if (word.size() > detail::kMaxSuggestedWord) return "";
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    const size_t d = detail::edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Close enough to be a typo: at most a third of the longer word (and at least 2 edits allowed).
  const size_t limit = std::max<size_t>(2, std::max(word.size(), best.size()) / 3);
  if (best_d <= limit) return best;
  // Or an abbreviation: "Mlp" for "MlpClassifier" (a unique candidate starting with the word).
  const std::string lower_word = detail::ascii_lower(word);
  std::string found;
  if (lower_word.size() < 2) return "";
  for (const auto& c : candidates) {
    if (detail::ascii_lower(c).rfind(lower_word, 0) == 0) {
      if (!found.empty()) return "";
      found = c;
    }
  }
  return found;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string close = closest_match(word, candidates);
  return close.empty() ? "" : " (did you mean \"" + close + "\"?)";
}

std::string quoted_list(const std::vector<std::string>& names, const std::string& empty_text) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "\"" : ", \"") + n + "\"";
  return s.empty() ? empty_text : s;
}

void unknown_name(const std::string& kind, const std::string& name,
                  const std::vector<std::string>& valid) {
  throw ConfigError("[Registry] unknown " + kind + " \"" + name + "\"; valid names: " +
                    quoted_list(valid, "(none registered)") + did_you_mean(name, valid) + ".");
}

}  // namespace volt
