#include "volt/precision/fp8_inference.h"

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <limits>
#include <set>

#include "core/detail/input_limits.h"
#include "core/detail/numbers.h"
#include "detail/fp8_hooks.h"
#include "volt/core/atomic_file.h"
#include "volt/core/check.h"
#include "volt/core/log.h"

namespace volt {
namespace {

using json = nlohmann::json;

// The reference's rule: measuring and quantizing never share a process.
std::atomic<bool> g_measured_here{false};

constexpr const char* kFormat = "volt-fp8-measurements";

std::vector<std::string> string_list(const json& j, const std::string& where,
                                     const std::string& origin) {
  VOLT_CHECK(j.is_array(), ConfigError, "[Fp8Inference] ", origin, ": ", where,
             " must be a list of strings.");
  std::vector<std::string> out;
  for (const auto& v : j) {
    VOLT_CHECK(v.is_string(), ConfigError, "[Fp8Inference] ", origin, ": ", where,
               " must be a list of strings; found ", v.dump(), ".");
    out.push_back(v.get<std::string>());
  }
  return out;
}

void check_types(const std::vector<std::string>& types, const std::string& origin) {
  for (const auto& t : types) {
    VOLT_CHECK(t == "Linear", ConfigError, "[Fp8Inference] ", origin, " lists module type \"", t,
               "\"; this build quantizes \"Linear\" layers only.");
  }
}

void validate(const QuantConfig& c, const std::string& origin) {
  VOLT_CHECK(c.observer() == "maxabs", ConfigError, "[Fp8Inference] ", origin, ": observer \"",
             c.observer(), "\" is not supported; use \"maxabs\".");
  VOLT_CHECK(c.scale_method() == "maxabs_hw" || c.scale_method() == "maxabs_pow2" ||
                 c.scale_method() == "unit_scale",
             ConfigError, "[Fp8Inference] ", origin, ": scale_method \"", c.scale_method(),
             "\" is not supported; use \"maxabs_hw\", \"maxabs_pow2\" or \"unit_scale\".");
  VOLT_CHECK(!c.dump_stats_path().empty(), ConfigError, "[Fp8Inference] ", origin,
             ": dump_stats_path is empty; name the measurements file.");
  check_types(c.allowlist_types(), origin);
  check_types(c.blocklist_types(), origin);
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

bool selected(const QuantConfig& c, const std::string& name) {
  if (!c.allowlist_names().empty() && !contains(c.allowlist_names(), name)) return false;
  if (!c.allowlist_types().empty() && !contains(c.allowlist_types(), "Linear")) return false;
  return !contains(c.blocklist_names(), name) && !contains(c.blocklist_types(), "Linear");
}

using Linears = std::vector<std::pair<std::string, std::shared_ptr<torch::nn::LinearImpl>>>;

Linears selected_linears(torch::nn::Module& model, const QuantConfig& c) {
  const auto all = detail::convertible_linears(model, "Fp8Inference");
  detail::check_linear_names(c.allowlist_names(), all, "Fp8Inference", "the allowlist");
  detail::check_linear_names(c.blocklist_names(), all, "Fp8Inference", "the blocklist");
  Linears out;
  for (const auto& l : all) {
    if (selected(c, l.first)) out.push_back(l);
  }
  return out;
}

double scale_for(double amax, const std::string& method) {
  if (method == "unit_scale" || !(amax > 0) || !std::isfinite(amax)) return 1.0;
  const double s = fp8_max(Fp8Format::kE4M3) / amax;
  return method == "maxabs_pow2" ? std::exp2(std::floor(std::log2(s))) : s;
}

}  // namespace

QuantConfig QuantConfig::parse(const std::string& text, const std::string& origin) {
  // Bounded like every file volt reads (size, nodes, depth: docs/ARCHITECTURE.md "Input limits").
  const json j = detail::parse_json_bounded(text, "Fp8Inference", origin, {},
                                            "fix the file or point QUANT_CONFIG at another one");
  VOLT_CHECK(j.is_object(), ConfigError, "[Fp8Inference] ", origin,
             " must hold a JSON object with keys such as \"mode\" and \"dump_stats_path\".");
  QuantConfig c;
  for (const auto& [key, v] : j.items()) {
    auto str = [&, &key = key, &v = v] {
      VOLT_CHECK(v.is_string(), ConfigError, "[Fp8Inference] ", origin, ": \"", key,
                 "\" must be a string.");
      return v.template get<std::string>();
    };
    if (key == "mode") {
      const auto m = str();
      VOLT_CHECK(m == "MEASURE" || m == "QUANTIZE", ConfigError, "[Fp8Inference] ", origin,
                 ": mode \"", m, "\" is not one of MEASURE, QUANTIZE.");
      c.mode(m == "MEASURE" ? kMeasure : kQuantize);
    } else if (key == "method") {
      VOLT_CHECK(str() == "HOOKS", ConfigError, "[Fp8Inference] ", origin,
                 ": method must be \"HOOKS\" (the only one) or absent.");
    } else if (key == "observer") {
      c.observer(str());
    } else if (key == "scale_method") {
      c.scale_method(str());
    } else if (key == "dump_stats_path") {
      c.dump_stats_path(str());
    } else if (key == "allowlist" || key == "blocklist") {
      VOLT_CHECK(v.is_object(), ConfigError, "[Fp8Inference] ", origin, ": \"", key,
                 "\" must be an object {\"names\": [...], \"types\": [...]}.");
      for (const auto& [k2, v2] : v.items()) {
        VOLT_CHECK(k2 == "names" || k2 == "types", ConfigError, "[Fp8Inference] ", origin, ": \"",
                   key, "\" takes \"names\" and \"types\", not \"", k2, "\".");
        auto list = string_list(v2, key + "." + k2, origin);
        if (key == "allowlist") {
          k2 == "names" ? c.allowlist_names(list) : c.allowlist_types(list);
        } else {
          k2 == "names" ? c.blocklist_names(list) : c.blocklist_types(list);
        }
      }
    } else {
      VOLT_CHECK(false, ConfigError, "[Fp8Inference] ", origin, ": unknown key \"", key,
                 "\"; the keys are mode, method, observer, scale_method, dump_stats_path, "
                 "allowlist, blocklist.");
    }
  }
  validate(c, origin);
  return c;
}

QuantConfig QuantConfig::from_file(const std::string& path) {
  auto in = detail::c_stream<std::ifstream>(path);
  VOLT_CHECK(in.good(), ConfigError, "[Fp8Inference] cannot read the quantization config \"", path,
             "\"; give a readable JSON file (option quant_config or QUANT_CONFIG).");
  return parse(detail::read_bounded(in, "Fp8Inference", "quantization config \"" + path + "\""),
               "quantization config \"" + path + "\"");
}

std::string QuantConfig::measurements_file() const {
  const auto& p = dump_stats_path();
  return p.size() >= 5 && p.compare(p.size() - 5, 5, ".json") == 0 ? p : p + ".json";
}

Fp8ConversionReport prepare_fp8_measurement(torch::nn::Module& model, const QuantConfig& config) {
  validate(config, "the quantization config");
  VOLT_CHECK(config.mode() == QuantConfig::kMeasure, ConfigError,
             "[Fp8Inference] prepare_fp8_measurement needs a config with mode MEASURE.");
  g_measured_here = true;
  Fp8ConversionReport report;
  const auto chosen = selected_linears(model, config);
  for (const auto& [name, lin] : detail::linear_layers(model)) {
    const bool on = std::any_of(chosen.begin(), chosen.end(),
                                [&, &name = name](const auto& c) { return c.first == name; });
    if (!on) {
      report.kept.emplace_back(name, "not selected by allowlist/blocklist");
      continue;
    }
    auto layer = std::make_shared<detail::Fp8Layer>();
    layer->module = lin;
    layer->name = name;
    layer->mode = detail::Fp8Mode::kMeasure;
    layer->stats = at::zeros({3}, lin->weight.options().dtype(at::kFloat).requires_grad(false));
    detail::attach_fp8(lin->weight, std::move(layer));
    report.converted.push_back(name);
  }
  log_info("Fp8Inference", "measuring: " + report.str());
  return report;
}

int64_t save_fp8_measurements(torch::nn::Module& model, const QuantConfig& config) {
  json modules = json::object();
  int64_t calls = 0;
  for (const auto& [name, lin] : detail::linear_layers(model)) {
    const auto layer = detail::find_fp8(lin->weight);
    if (!layer || layer->mode != detail::Fp8Mode::kMeasure) continue;
    const auto s = layer->stats.to(at::kDouble).cpu();
    calls = std::max<int64_t>(calls, layer->calls.load());
    // JSON has no inf or NaN: such a max-abs (non-finite data went through the layer) is
    // written as null, which quantizing reads as "no usable range" (scale 1), with a warning.
    const auto value = [&, &name = name](int64_t i, const char* what) -> json {
      const double v = s[i].item<double>();
      if (std::isfinite(v)) return v;
      log_warning("Fp8Inference", "layer \"" + name + "\" measured a non-finite max-abs " + what +
                                      " (the data held inf or NaN); it is written as null and "
                                      "quantized with scale 1.");
      return nullptr;
    };
    modules[name] = {{"type", "Linear"},
                     {"in_features", lin->options.in_features()},
                     {"out_features", lin->options.out_features()},
                     {"forwards", layer->calls.load()},
                     {"input", value(0, "input")},
                     {"weight", value(1, "weight")},
                     {"output", value(2, "output")}};
  }
  VOLT_CHECK(!modules.empty(), ConfigError, "[Fp8Inference] this model has no layers under ",
             "measurement; call prepare_fp8_measurement (or convert_modules with inference=true, "
             "quant=false) first.");
  VOLT_CHECK(calls > 0, ConfigError, "[Fp8Inference] no forward ran through the observed layers; ",
             "run predict (inside the fp8 precision or an Fp8Autocast region) before saving.");
  json out = {
      {"format", kFormat}, {"version", 1}, {"observer", config.observer()}, {"modules", modules}};
  atomic_write_file(config.measurements_file(), out.dump(2) + "\n");
  log_info("Fp8Inference", "wrote measurements of " + std::to_string(modules.size()) +
                               " layers to " + config.measurements_file());
  return static_cast<int64_t>(modules.size());
}

Fp8ConversionReport quantize_fp8(torch::nn::Module& model, const QuantConfig& config) {
  validate(config, "the quantization config");
  VOLT_CHECK(config.mode() == QuantConfig::kQuantize, ConfigError,
             "[Fp8Inference] quantize_fp8 needs a config with mode QUANTIZE.");
  VOLT_CHECK(!g_measured_here, ConfigError, "[Fp8Inference] this process ran the fp8 ",
             "measurement; quantization must run in a new process (measurement and quantization ",
             "cannot share one, as in the reference). Start another process with quant=true and ",
             "the same dump_stats_path.");
  const auto file = config.measurements_file();
  auto in = detail::c_stream<std::ifstream>(file);
  VOLT_CHECK(in.good(), ConfigError, "[Fp8Inference] the measurements file \"", file,
             "\" cannot be read; run the measurement step first (mode MEASURE) with the same ",
             "dump_stats_path.");
  const std::string source = "the measurements file \"" + file + "\"";
  const json j =
      detail::parse_json_bounded(detail::read_bounded(in, "Fp8Inference", source), "Fp8Inference",
                                 source, {}, "re-run the measurement step");
  // Not j.value("format", ""): it throws nlohmann's type_error when "format" is not a string.
  VOLT_CHECK(j.is_object() && j.contains("format") && j["format"].is_string() &&
                 j["format"] == kFormat && j.contains("modules") && j["modules"].is_object(),
             ConfigError, "[Fp8Inference] \"", file, "\" is not a volt fp8 measurements file ",
             "(format \"", kFormat, "\" with a \"modules\" object); re-run the measurement step.");
  const json& measured = j["modules"];

  const auto all = detail::linear_layers(model);
  // A file naming layers this model does not have was measured on another model.
  for (const auto& [name, m] : measured.items()) {
    const bool here = std::any_of(all.begin(), all.end(),
                                  [&, &name = name](const auto& l) { return l.first == name; });
    VOLT_CHECK(here, ConfigError, "[Fp8Inference] \"", file, "\" holds measurements of layer \"",
               name,
               "\", which this model does not have: it was measured on another model; "
               "re-run the measurement step on this one.");
  }
  Fp8ConversionReport report;
  const auto chosen = selected_linears(model, config);
  for (const auto& [name, lin] : all) {
    const bool on = std::any_of(chosen.begin(), chosen.end(),
                                [&, &name = name](const auto& c) { return c.first == name; });
    if (!on) {
      report.kept.emplace_back(name, "not selected by allowlist/blocklist");
      continue;
    }
    const int64_t in_f = lin->options.in_features(), out_f = lin->options.out_features();
    VOLT_CHECK(measured.contains(name), ConfigError, "[Fp8Inference] layer \"", name, "\" (Linear ",
               in_f, "->", out_f, ") has no measurement in \"", file, "\"; measure this model ",
               "(all layers you quantize) again, or blocklist the layer.");
    const json& m = measured[name];
    auto num = [&, &name = name](const char* key) {
      VOLT_CHECK(m.contains(key) && m[key].is_number(), ConfigError, "[Fp8Inference] \"", file,
                 "\": layer \"", name, "\" lacks the number \"", key,
                 "\"; re-run the measurement.");
      return m[key].get<double>();
    };
    VOLT_CHECK(num("in_features") == in_f && num("out_features") == out_f, ConfigError,
               "[Fp8Inference] layer \"", name, "\" is Linear ", in_f, "->", out_f, " but \"", file,
               "\" measured it as ", num("in_features"), "->", num("out_features"),
               ": the file belongs to another model; re-run the measurement on this one.");
    if (m.contains("forwards") && m["forwards"].is_number() && m["forwards"].get<double>() == 0) {
      // No data ever reached it while measuring: there is no scale to give it.
      report.kept.emplace_back(name, "never ran during measurement");
      continue;
    }
    auto layer = std::make_shared<detail::Fp8Layer>();
    layer->module = lin;
    layer->name = name;
    layer->mode = detail::Fp8Mode::kQuantize;
    // null: a non-finite measurement (see save_fp8_measurements), which has no scale but 1.
    const auto amax = [&](const char* key) {
      return m.contains(key) && m[key].is_null() ? std::numeric_limits<double>::quiet_NaN()
                                                 : num(key);
    };
    layer->scales = at::tensor({scale_for(amax("input"), config.scale_method()),
                                scale_for(amax("weight"), config.scale_method())},
                               lin->weight.options().dtype(at::kFloat).requires_grad(false));
    detail::attach_fp8(lin->weight, std::move(layer));
    report.converted.push_back(name);
  }
  log_info("Fp8Inference", "quantized (" + config.scale_method() + "): " + report.str());
  return report;
}

}  // namespace volt
