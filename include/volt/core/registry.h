#pragma once
/// Registry: the one place where names ("cpu", "single_device", "ModelCheckpoint", a user's
/// "MyModel") become typed objects, with each component's parameters declared for the CLI.
///
/// Register a model once, before run_cli (see include/volt/cli/cli.h):
///
///   volt::registry().models.add(
///       "MyModel", "a two-layer MLP",
///       volt::Params().add("lr", 1e-3, "learning rate").required<int64_t>("width", "hidden
///       units"),
///       [](const volt::Args& a) {
///         return std::make_shared<MyModel>(a.get<int64_t>("width"), a.get<double>("lr"));
///       });

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "volt/core/spec.h"

namespace at {
class Tensor;
}  // namespace at
namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace volt {

class LRScheduler;
class Accelerator;
class Strategy;
class Precision;
class Callback;
class Logger;
class Module;
class DataModule;
class Profiler;
class CheckpointIO;

/// The value types a component parameter can take in YAML / on the command line.
/// kNumber is "int or float" (an int stays an int: Lightning's limit_train_batches=10 vs 0.5).
enum class ParamType { kBool, kInt, kFloat, kString, kIntList, kFloatList, kStringList, kNumber };

/// "bool", "int", "float", "str", "list[int]", "list[float]", "list[str]", "int|float".
const char* param_type_name(ParamType type);

/// A parameter value; std::monostate is "none" (a nullable parameter left unset).
using ParamValue =
    std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<int64_t>,
                 std::vector<double>, std::vector<std::string>>;

/// The ParamType a (non-none) value holds.
ParamType param_value_type(const ParamValue& value);

/// One declared parameter: name, type, default (absent when required), help line.
struct ParamSpec {
  std::string name;
  ParamType type = ParamType::kString;
  bool required = false;
  bool nullable = false;             ///< "none" is a valid value (the default of optional<T>())
  ParamValue default_value;          ///< monostate when required or nullable-without-default
  std::vector<std::string> choices;  ///< for strings: the only valid values (empty = any)
  std::string help;
};

/// The parameters a registered component takes, in declaration order (the order --help shows).
class Params {
 public:
  Params& add(std::string name, bool default_value, std::string help);
  Params& add(std::string name, int default_value, std::string help);
  Params& add(std::string name, int64_t default_value, std::string help);
  Params& add(std::string name, double default_value, std::string help);
  Params& add(std::string name, const char* default_value, std::string help);
  Params& add(std::string name, std::string default_value, std::string help);
  Params& add(std::string name, std::vector<int64_t> default_value, std::string help);
  Params& add(std::string name, std::vector<double> default_value, std::string help);
  Params& add(std::string name, std::vector<std::string> default_value, std::string help);
  /// A string parameter restricted to `choices` (e.g. mode: "min" | "max").
  Params& choice(std::string name, std::string default_value, std::vector<std::string> choices,
                 std::string help);
  /// An int-or-float parameter (read with Args::holds<int64_t> / get); default an int64_t or
  /// double.
  Params& number(std::string name, ParamValue default_value, std::string help);
  /// A parameter with no default: the config must set it.
  template <typename T>
  Params& required(std::string name, std::string help) {
    return push(ParamSpec{std::move(name), type_of<T>(), true, false, {}, {}, std::move(help)});
  }
  /// A parameter whose default is "none" (read it with Args::get_optional<T>).
  template <typename T>
  Params& optional(std::string name, std::string help) {
    return push(ParamSpec{std::move(name), type_of<T>(), false, true, {}, {}, std::move(help)});
  }
  /// The parameter declared last also takes "none" (null) besides its default (read it with
  /// Args::get_optional<T>), e.g. Lightning's check_val_every_n_epoch: 1 or None.
  Params& or_none();

  const std::vector<ParamSpec>& specs() const { return specs_; }
  /// nullptr when no parameter has this name.
  const ParamSpec* find(const std::string& name) const;

  template <typename T>
  static constexpr ParamType type_of() {
    if constexpr (std::is_same_v<T, bool>)
      return ParamType::kBool;
    else if constexpr (std::is_same_v<T, int64_t>)
      return ParamType::kInt;
    else if constexpr (std::is_same_v<T, double>)
      return ParamType::kFloat;
    else if constexpr (std::is_same_v<T, std::string>)
      return ParamType::kString;
    else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
      return ParamType::kIntList;
    else if constexpr (std::is_same_v<T, std::vector<double>>)
      return ParamType::kFloatList;
    else {
      static_assert(std::is_same_v<T, std::vector<std::string>>,
                    "volt::Params: use bool, int64_t, double, std::string or a std::vector of "
                    "int64_t, double or std::string");
      return ParamType::kStringList;
    }
  }

 private:
  Params& push(ParamSpec spec);
  std::vector<ParamSpec> specs_;
};

/// The checked values handed to a factory: every declared parameter is present.
class Args {
 public:
  Args() = default;
  /// `owner` names the component in messages (e.g. "model MyModel").
  Args(std::string owner, std::map<std::string, ParamValue> values)
      : owner_(std::move(owner)), values_(std::move(values)) {}

  /// The value of a declared parameter; asking for an undeclared name or the wrong C++ type is
  /// a registration bug (InternalError naming the parameter and its type).
  template <typename T>
  const T& get(const std::string& name) const {
    const ParamValue& v = at(name);
    const T* p = std::get_if<T>(&v);
    if (p == nullptr) type_mismatch(name, Params::type_of<T>());
    return *p;
  }
  /// Whether the value currently holds a T (for kNumber parameters).
  template <typename T>
  bool holds(const std::string& name) const {
    return std::holds_alternative<T>(at(name));
  }
  /// For nullable parameters: std::nullopt when the value is "none".
  template <typename T>
  std::optional<T> get_optional(const std::string& name) const {
    const ParamValue& v = at(name);
    if (std::holds_alternative<std::monostate>(v)) return std::nullopt;
    return get<T>(name);
  }
  const std::map<std::string, ParamValue>& values() const { return values_; }
  const std::string& owner() const { return owner_; }

 private:
  const ParamValue& at(const std::string& name) const;
  [[noreturn]] void type_mismatch(const std::string& name, ParamType asked) const;
  std::string owner_;
  std::map<std::string, ParamValue> values_;
};

/// Throws ConfigError for an unknown name, listing `valid` and suggesting the closest.
[[noreturn]] void unknown_name(const std::string& kind, const std::string& name,
                               const std::vector<std::string>& valid);
/// The entry of `candidates` closest to `word` by edit distance, or "" when none is close.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);
/// " (did you mean \"x\"?)" for closest_match(word, candidates), or "" when none is close.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);
/// The names quoted and comma-separated ("\"a\", \"b\""); `empty_text` when there are none.
std::string quoted_list(const std::vector<std::string>& names, const std::string& empty_text = "");
/// Args from each parameter's default; throws ConfigError naming a required one.
Args default_args(const std::string& owner, const Params& params);
/// `given` checked against `params` and completed with their defaults: a name not declared, a
/// value of the wrong type (an int passes for a float) or outside its choices, "none" for a
/// parameter that cannot be none, or a required parameter left out is a ConfigError naming it.
Args complete_args(const std::string& owner, const Params& params, const Args& given);

/// What a strategy factory gets besides its own parameters: the resolved hardware and precision.
struct StrategyContext {
  std::shared_ptr<Accelerator> accelerator;
  std::shared_ptr<Precision> precision;
  int64_t devices = 1;    ///< processes per node
  int64_t num_nodes = 1;  ///< nodes; world size = devices * num_nodes
};

/// What a logger factory gets besides its own parameters.
struct LoggerContext {
  std::string default_root_dir;  ///< the Trainer's default_root_dir (a logger's save_dir default)
};

/// Named factories of one component kind. `kind` ("model", "accelerator") appears in messages.
template <typename T, typename... Ctx>
class ComponentRegistry {
 public:
  using Factory = std::function<std::shared_ptr<T>(const Args&, Ctx...)>;
  struct Entry {
    std::string name;
    std::string help;
    Params params;
    Factory make;
  };

  explicit ComponentRegistry(std::string kind) : kind_(std::move(kind)) {}

  /// Registers (or replaces) `name`.
  void add(std::string name, std::string help, Params params, Factory make) {
    std::string key = name;
    entries_[key] = Entry{std::move(name), std::move(help), std::move(params), std::move(make)};
  }
  /// Registers `name` with no parameters.
  void add(std::string name, std::string help, std::function<std::shared_ptr<T>(Ctx...)> make) {
    add(std::move(name), std::move(help), Params(),
        [make = std::move(make)](const Args&, Ctx... ctx) { return make(ctx...); });
  }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  /// Throws ConfigError: "unknown <kind> "x"; valid names: ... (did you mean ...?)".
  const Entry& at(const std::string& name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) unknown_name(kind_, name, names());
    return it->second;
  }
  /// Builds `name` from its defaults (every parameter must have one).
  std::shared_ptr<T> create(const std::string& name, Ctx... ctx) const {
    const Entry& e = at(name);
    return e.make(default_args(kind_ + " " + name, e.params), ctx...);
  }
  /// Builds `name` from `given`, completed with the defaults (complete_args checks it).
  std::shared_ptr<T> create(const std::string& name, const Args& given, Ctx... ctx) const {
    const Entry& e = at(name);
    return e.make(complete_args(kind_ + " " + name, e.params, given), ctx...);
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& kv : entries_) out.push_back(kv.first);
    return out;
  }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
  std::map<std::string, Entry> entries_;
};

/// Every component kind volt builds by name. Built-ins are registered on first use of registry();
/// later features (ddp, bf16-mixed, profilers) add names here and the CLI offers them unchanged.
struct Registry {
  ComponentRegistry<Accelerator> accelerators{"accelerator"};
  ComponentRegistry<Strategy, const StrategyContext&> strategies{"strategy"};
  ComponentRegistry<Precision> precisions{"precision"};
  ComponentRegistry<Callback> callbacks{"callback"};
  ComponentRegistry<Logger, const LoggerContext&> loggers{"logger"};
  ComponentRegistry<Profiler> profilers{"profiler"};
  ComponentRegistry<CheckpointIO> checkpoint_ios{"checkpoint_io"};
  /// LightningCLI's --optimizer: built over the module's parameters (each tensor once).
  ComponentRegistry<torch::optim::Optimizer, const std::vector<at::Tensor>&> optimizers{
      "optimizer"};
  /// LightningCLI's --lr_scheduler: built over that optimizer. A "monitor" parameter (the
  /// ReduceLROnPlateau's) becomes the OptimizerConfig's monitor.
  ComponentRegistry<LRScheduler, torch::optim::Optimizer&> lr_schedulers{"lr_scheduler"};
  ComponentRegistry<Module> models{"model"};
  ComponentRegistry<DataModule> data_modules{"data module"};
};

/// The process-wide registry, with volt's built-ins registered.
Registry& registry();

/// A registered name with some of its parameters set, the others at their defaults; the
/// Trainer checks them as the CLI checks init_args (complete_args):
///   volt::TrainerOptions().strategy(volt::named<volt::Strategy>(
///       "deepspeed_stage_3", {{"param_persistence_threshold", int64_t{0}}}))
template <typename T>
Spec<T> named(const std::string& name, std::map<std::string, ParamValue> values) {
  return Spec<T>(name, std::make_shared<const Args>(name, std::move(values)));
}

}  // namespace volt
