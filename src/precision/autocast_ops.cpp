#include "volt/precision/autocast_ops.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "core/detail/ascii.h"
#include "core/detail/edit_distance.h"
#include "core/detail/numbers.h"
#include "detail/quiet_dispatcher.h"
#include "volt/core/check.h"
#include "volt/core/env.h"
#include "volt/core/log.h"
#include "volt/core/version.h"

namespace volt {
namespace {

using detail::QuietWarningsGuard;

// One boxed kernel serves every listed operator: it casts the floating tensor arguments on the
// stack to the list's dtype (through autocast's per-region cast cache, so a weight is cast once
// per forward) and calls the operator again with this device's autocast key excluded.
class CastKernel final : public c10::OperatorKernel {
 public:
  CastKernel(c10::ScalarType dtype, c10::DeviceType device)
      : dtype_(dtype),
        device_(device),
        key_(at::autocast::get_autocast_dispatch_key_from_device_type(device)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    for (size_t i = stack->size() - n; i < stack->size(); ++i) {
      c10::IValue& v = (*stack)[i];
      if (v.isTensor()) {
        v = at::autocast::cached_cast(dtype_, v.toTensor(), device_);
      } else if (v.isTensorList()) {
        auto list = v.toTensorVector();
        for (auto& t : list) t = at::autocast::cached_cast(dtype_, t, device_);
        v = c10::IValue(list);
      }
    }
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key_);
    op.callBoxed(stack);
  }

 private:
  c10::ScalarType dtype_;
  c10::DeviceType device_;
  c10::DispatchKey key_;
};

// Every registered aten operator: base name -> its overload names.
std::map<std::string, std::vector<std::string>> aten_ops() {
  std::map<std::string, std::vector<std::string>> ops;
  for (const auto& op : c10::Dispatcher::singleton().getAllOpNames()) {
    if (op.name.rfind("aten::", 0) != 0) continue;
    ops[op.name.substr(6)].push_back(op.overload_name);
  }
  return ops;
}

bool is_mutable(const std::string& base, const std::string& overload) {
  auto h = c10::Dispatcher::singleton().findSchema({"aten::" + base, overload});
  return h && h->schema().is_mutable();
}

// Resolves a user's name to the functional overloads it stands for ("name.overload").
std::vector<std::string> resolve(const std::string& raw,
                                 const std::map<std::string, std::vector<std::string>>& ops,
                                 const char* list) {
  std::string name = raw;
  if (name.rfind("aten::", 0) == 0) name = name.substr(6);
  VOLT_CHECK(name.find("::") == std::string::npos, ConfigError, "[MixedPrecision] ", list,
             " names \"", raw,
             "\"; only aten operators can be listed (e.g. \"mm\", \"add.Tensor\").");
  const auto dot = name.find('.');
  const std::string base = name.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : name.substr(dot + 1);
  const auto it = ops.find(base);
  if (it == ops.end()) {
    std::vector<std::pair<size_t, std::string>> near;
    // A name this long is no typo of an operator's.
    if (base.size() <= detail::kMaxSuggestedWord) {
      for (const auto& kv : ops) {
        near.emplace_back(detail::edit_distance(base, kv.first), kv.first);
      }
    }
    std::sort(near.begin(), near.end());
    auto close = detail::c_stream<std::ostringstream>();
    for (size_t i = 0; i < near.size() && i < 3 && near[i].first <= 3; ++i) {
      close << (i ? ", " : "") << near[i].second;
    }
    VOLT_CHECK(false, ConfigError, "[MixedPrecision] ", list, " names an unknown operator \"", raw,
               "\"; ",
               close.str().empty() ? std::string("check the spelling (aten operator names)")
                                   : "did you mean: " + close.str() + "?");
  }
  std::vector<std::string> out;
  if (dot != std::string::npos) {
    const auto& ovs = it->second;
    VOLT_CHECK(std::find(ovs.begin(), ovs.end(), overload) != ovs.end(), ConfigError,
               "[MixedPrecision] ", list, " names \"", raw, "\", but aten::", base,
               " has no overload \"", overload, "\"; write \"", base, "\" for all its overloads.");
    VOLT_CHECK(!is_mutable(base, overload), ConfigError, "[MixedPrecision] ", list, " names \"",
               raw,
               "\", which writes into its arguments; autocast lists take functional ops only.");
    out.push_back(name);
    return out;
  }
  for (const auto& ov : it->second) {
    if (!is_mutable(base, ov)) out.push_back(ov.empty() ? base : base + "." + ov);
  }
  VOLT_CHECK(!out.empty(), ConfigError, "[MixedPrecision] ", list, " names \"", raw,
             "\", which writes into its arguments (every overload is in-place or out=); "
             "autocast lists take functional ops only",
             base.size() > 1 && base.back() == '_'
                 ? "; use \"" + base.substr(0, base.size() - 1) + "\""
                 : std::string(),
             ".");
  return out;
}

}  // namespace

AutocastOpLists::AutocastOpLists(c10::DeviceType device, c10::ScalarType lower_dtype,
                                 std::vector<std::string> lower_ops,
                                 std::vector<std::string> fp32_ops) {
  VOLT_CHECK(device == c10::kCPU || device == c10::kCUDA, ConfigError,
             "[MixedPrecision] op lists apply to CPU or CUDA autocast, not ", device, ".");
  std::tie(lower_, fp32_) = resolve_lists(lower_ops, fp32_ops);
  if (lower_.empty() && fp32_.empty()) return;

  const auto key = at::autocast::get_autocast_dispatch_key_from_device_type(device);
  library_ =
      std::make_unique<torch::Library>(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
  QuietWarningsGuard quiet;
  for (const auto& n : lower_) {
    library_->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                  std::make_unique<CastKernel>(lower_dtype, device)));
  }
  for (const auto& n : fp32_) {
    library_->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                  std::make_unique<CastKernel>(c10::kFloat, device)));
  }
  log_info("MixedPrecision", "autocast op lists: " + std::to_string(lower_.size()) +
                                 " overloads forced to " +
                                 (lower_dtype == c10::kBFloat16 ? "bf16" : "fp16") + ", " +
                                 std::to_string(fp32_.size()) + " to fp32");
}

std::pair<std::vector<std::string>, std::vector<std::string>> AutocastOpLists::resolve_lists(
    const std::vector<std::string>& lower_ops, const std::vector<std::string>& fp32_ops) {
  if (lower_ops.empty() && fp32_ops.empty()) return {};
  const auto ops = aten_ops();
  std::set<std::string> lower_set, fp32_set;
  for (const auto& n : lower_ops) {
    for (auto& r : resolve(n, ops, "the lower-precision op list")) lower_set.insert(r);
  }
  for (const auto& n : fp32_ops) {
    for (auto& r : resolve(n, ops, "the fp32 op list")) {
      VOLT_CHECK(!lower_set.count(r), ConfigError, "[MixedPrecision] \"aten::", r,
                 "\" is in both the lower-precision and the fp32 op list; keep it in one.");
      fp32_set.insert(r);
    }
  }
  return {std::vector<std::string>(lower_set.begin(), lower_set.end()),
          std::vector<std::string>(fp32_set.begin(), fp32_set.end())};
}

AutocastOpLists::~AutocastOpLists() {
  // Destroying the Library deregisters its kernels; the built-in ones become visible again.
  QuietWarningsGuard quiet;
  library_.reset();
}

std::vector<std::string> AutocastOpLists::read_list_file(const std::string& path) {
  auto in = detail::c_stream<std::ifstream>(path);
  VOLT_CHECK(in.good(), ConfigError, "[MixedPrecision] cannot read the op-list file \"", path,
             "\"; give a readable text file with one operator name per line.");
  std::vector<std::string> names;
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    auto ss = detail::c_stream<std::stringstream>(line);
    std::string item;
    while (std::getline(ss, item, ',')) {
      item = std::string(detail::ascii_trim(item));
      if (!item.empty()) names.push_back(item);
    }
  }
  return names;
}

std::vector<std::string> AutocastOpLists::read_env_list(const char* var) {
  const auto v = env_value(var);
  if (!v) return {};
  return read_list_file(*v);
}

}  // namespace volt
