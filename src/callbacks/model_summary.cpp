#include "volt/callbacks/model_summary.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <ostream>
#include <unordered_map>
#include <unordered_set>

#include "core/detail/numbers.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/nn/pipeline.h"

namespace volt {
namespace {

// "torch::nn::LinearImpl" -> "Linear" (libtorch's module holders are named without the Impl
// their module class carries), "(anonymous namespace)::Net" -> "Net"; namespaces inside a
// template's arguments stay ("Wrapper<a::B>" keeps its argument).
std::string short_type(const std::string& full) {
  const size_t end = std::min(full.find('<'), full.size());
  const size_t colon = full.rfind("::", end);
  std::string name = colon == std::string::npos ? full : full.substr(colon + 2);
  const std::string impl = "Impl";
  if (name.size() > impl.size() && name.find('<') == std::string::npos &&
      name.compare(name.size() - impl.size(), impl.size(), impl) == 0) {
    name.resize(name.size() - impl.size());
  }
  return name;
}

int64_t depth_of(const std::string& dotted_name) {
  int64_t d = 1;
  for (char c : dotted_name) d += c == '.' ? 1 : 0;
  return d;
}

// A parameter's elements as the model has them: a pipeline rank frees the other stages'
// weights (volt::Pipeline::release_other_stages), which count with the shapes they had.
using Numel = std::function<int64_t(const at::Tensor&)>;

Numel whole_numel(const torch::nn::Module& module) {
  std::unordered_map<const void*, int64_t> released;
  auto add = [&](const torch::nn::Module& m) {
    const auto* pipe = dynamic_cast<const PipelineImpl*>(&m);
    if (pipe == nullptr || !pipe->released()) return;
    for (const auto& p : pipe->parameters(/*recurse=*/true)) {
      int64_t n = 1;
      for (int64_t d : pipe->whole_shape(p)) n *= d;
      released[p.unsafeGetTensorImpl()] = n;
    }
  };
  add(module);  // (modules(include_self) needs a module held by a shared_ptr)
  for (const auto& m : module.modules(/*include_self=*/false)) add(*m);
  return [released = std::move(released)](const at::Tensor& p) {
    auto it = released.find(p.unsafeGetTensorImpl());
    return it == released.end() ? p.numel() : it->second;
  };
}

// Elements of the distinct parameters of `m` and its children (a tied weight counts once).
int64_t distinct_params(const torch::nn::Module& m, const Numel& numel) {
  std::unordered_set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : m.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += numel(p);
  }
  return n;
}

// "1,234,567"
std::string grouped(int64_t v) {
  std::string digits = std::to_string(v);
  std::string out;
  const size_t first = digits.size() % 3 == 0 ? 3 : digits.size() % 3;
  out += digits.substr(0, first);
  for (size_t i = first; i < digits.size(); i += 3) out += "," + digits.substr(i, 3);
  return out;
}

std::string pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

}  // namespace

void ModelSummaryOptions::validate() const {
  VOLT_CHECK(max_depth() >= -1, ConfigError, "[ModelSummary] max_depth=", max_depth(),
             " is invalid; use -1 (every submodule), 0 (no summary) or a depth >= 1.");
}

std::ostream& operator<<(std::ostream& os, const ModelSummaryOptions& o) {
  return os << "ModelSummaryOptions(max_depth=" << o.max_depth() << ")";
}

ModelSummaryTable summarize(const torch::nn::Module& module, int64_t max_depth) {
  VOLT_CHECK(max_depth >= -1, ConfigError, "[ModelSummary] max_depth=", max_depth,
             " is invalid; use -1 (every submodule), 0 (totals only) or a depth >= 1.");
  ModelSummaryTable t;
  t.model_type = short_type(module.name());
  // As Lightning: the model itself is not counted among the modules in train / eval mode, and
  // a submodule registered under two names is listed once.
  const Numel numel = whole_numel(module);
  std::unordered_set<const torch::nn::Module*> seen_modules{&module};
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    const torch::nn::Module* m = item.value().get();
    if (!seen_modules.insert(m).second) continue;
    (m->is_training() ? t.modules_in_train_mode : t.modules_in_eval_mode) += 1;
    if (max_depth == -1 || depth_of(item.key()) <= max_depth) {
      t.rows.push_back(
          {item.key(), short_type(m->name()), distinct_params(*m, numel), m->is_training()});
    }
  }
  std::unordered_set<const void*> seen;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    (p.requires_grad() ? t.trainable_params : t.non_trainable_params) += numel(p);
    t.total_param_bytes += numel(p) * static_cast<int64_t>(p.element_size());
  }
  t.total_params = t.trainable_params + t.non_trainable_params;
  int64_t in_rows = 0;
  for (const auto& r : t.rows) in_rows += r.params;
  t.other_params = std::max<int64_t>(0, t.total_params - in_rows);
  return t;
}

std::string human_readable_count(int64_t count) {
  VOLT_CHECK(count >= 0, ValueError, "[ModelSummary] parameter count ", count,
             " is negative; counts are >= 0.");
  static const char* const kLabels[] = {"", "K", "M", "B", "T"};
  int digits = 1;
  for (int64_t v = count; v >= 10; v /= 10) ++digits;
  const int groups = std::min((digits + 2) / 3, 5);
  // Lightning's number * 10**shift: one multiplication by the (correctly rounded) power, which
  // rounds half-way counts as it does (1150 is "1.2 K"; dividing by 1000 gave "1.1 K").
  const double scaled = static_cast<double>(count) * std::pow(10.0, -3.0 * (groups - 1));
  const int index = groups - 1;
  std::string text;
  if (index < 1 || scaled >= 100) {
    text = grouped(static_cast<int64_t>(scaled));
  } else {
    text = detail::c_format("%.1f", scaled);
  }
  return index == 0 ? text : text + " " + kLabels[index];
}

std::string format_summary(const ModelSummaryTable& t) {
  std::vector<std::pair<std::string, std::vector<std::string>>> cols = {
      {" ", {}}, {"Name", {}}, {"Type", {}}, {"Params", {}}, {"Mode", {}}};
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const auto& r = t.rows[i];
    cols[0].second.push_back(std::to_string(i));
    cols[1].second.push_back(r.name);
    cols[2].second.push_back(r.type);
    cols[3].second.push_back(human_readable_count(r.params));
    cols[4].second.push_back(r.training ? "train" : "eval");
  }
  if (t.other_params > 0) {  // parameters registered on the model itself
    for (auto& [c, v] : {std::pair<size_t, std::string>{0, " "},
                         {1, "other params"},
                         {2, "n/a"},
                         {3, human_readable_count(t.other_params)},
                         {4, "n/a"}}) {
      cols[c].second.push_back(v);
    }
  }
  std::vector<size_t> width;
  size_t total_width = 3;  // Lightning's rule: the widths plus 3 per column, plus 3
  for (const auto& c : cols) {
    size_t w = c.first.size();
    for (const auto& v : c.second) w = std::max(w, v.size());
    width.push_back(w);
    total_width += w + 3;
  }
  const size_t n_rows = cols[0].second.size();
  auto os = detail::c_stream<std::ostringstream>();
  auto line = [&](const std::function<std::string(size_t)>& cell) {
    for (size_t c = 0; c < cols.size(); ++c) os << (c ? " | " : "") << pad(cell(c), width[c]);
    os << "\n";
  };
  line([&](size_t c) { return cols[c].first; });
  const std::string rule(total_width, '-');
  os << rule << "\n";
  for (size_t r = 0; r < n_rows; ++r) line([&](size_t c) { return cols[c].second[r]; });
  os << rule << "\n";
  const double mb = static_cast<double>(t.total_param_bytes) / 1e6;
  // "1,234.567" as Python's {:,.3f}: printf rounds (0.9996 -> "1.000"), then the units are grouped.
  const std::string rounded = [&] {
    const std::string full = detail::c_format("%.3f", mb);
    const size_t dot = full.find('.');
    return grouped(std::stoll(full.substr(0, dot))) + full.substr(dot);
  }();
  os << pad(human_readable_count(t.trainable_params), 10) << "Trainable params\n"
     << pad(human_readable_count(t.non_trainable_params), 10) << "Non-trainable params\n"
     << pad(human_readable_count(t.total_params), 10) << "Total params\n"
     << pad(rounded, 10) << "Total estimated model params size (MB)\n"
     << pad(std::to_string(t.modules_in_train_mode), 10) << "Modules in train mode\n"
     << pad(std::to_string(t.modules_in_eval_mode), 10) << "Modules in eval mode";
  return os.str();
}

ModelSummary::ModelSummary(ModelSummaryOptions options) : options_(options) {
  options_.validate();
}

void ModelSummary::on_fit_start(RunContext& run, Module& module) {
  if (options_.max_depth() == 0 || !run.is_global_zero()) return;
  log_info("ModelSummary", short_type(module.name()) + "\n" +
                               format_summary(summarize(module, options_.max_depth())));
}

}  // namespace volt
