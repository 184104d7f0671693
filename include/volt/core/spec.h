#pragma once
/// Spec<T>: an option that is either a registered name ("auto", "cpu", "32-true") or an object.

#include <memory>
#include <ostream>
#include <string>

namespace volt {

class Args;  // core/registry.h

/// Holds a registry name or a ready object; Trainer resolves names in one place (resolve_plan).
template <typename T>
class Spec {
 public:
  Spec(const char* name) : name_(name) {}             // NOLINT: implicit by design
  Spec(std::string name) : name_(std::move(name)) {}  // NOLINT
  /// A registered name with its parameters (checked against the entry's Params, as the CLI's
  /// `class_path` + `init_args` are; parameters left out keep their defaults: volt::named in
  /// core/registry.h builds one from a map); without them the entry's defaults apply.
  Spec(std::string name, std::shared_ptr<const Args> args)
      : name_(std::move(name)), args_(std::move(args)) {}
  Spec(std::shared_ptr<T> object) : object_(std::move(object)) {}  // NOLINT
  template <typename U, typename = std::enable_if_t<std::is_base_of<T, U>::value>>
  Spec(std::shared_ptr<U> object) : object_(std::move(object)) {}  // NOLINT

  bool is_object() const { return object_ != nullptr; }
  const std::string& name() const { return name_; }
  const std::shared_ptr<T>& object() const { return object_; }
  /// The parameters given with the name, or nullptr for the registered defaults.
  const std::shared_ptr<const Args>& args() const { return args_; }

 private:
  std::string name_;
  std::shared_ptr<T> object_;
  std::shared_ptr<const Args> args_;
};

template <typename T>
std::ostream& operator<<(std::ostream& os, const Spec<T>& s) {
  return s.is_object() ? (os << "<object>") : (os << '"' << s.name() << '"');
}

}  // namespace volt
