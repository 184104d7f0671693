#pragma once
/// AutocastOpLists: user lists of operators that autocast runs in the lower precision (the
/// reference's LOWER_LIST) or in fp32 (FP32_LIST), overriding libtorch's built-in policy.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch {
class Library;
}

namespace volt {

/// Registers, for the lifetime of the object, autocast kernels for the listed operators on
/// one device's autocast dispatch key: ops in `lower_ops` get their floating tensor arguments
/// cast to `lower_dtype`, ops in `fp32_ops` to fp32, then run with autocast excluded. Destroying
/// the object restores libtorch's built-in policy. Names are `mm`, `aten::mm`, `add.Tensor` (one
/// overload) or `add` (all its functional overloads); each is checked against the operator
/// registry: an unknown name is a ConfigError listing close matches, an op that mutates its
/// inputs (`relu_`, `add.out`) is refused, and a name in both lists is a conflict.
class AutocastOpLists {
 public:
  AutocastOpLists(c10::DeviceType device, c10::ScalarType lower_dtype,
                  std::vector<std::string> lower_ops, std::vector<std::string> fp32_ops);
  ~AutocastOpLists();
  AutocastOpLists(const AutocastOpLists&) = delete;
  AutocastOpLists& operator=(const AutocastOpLists&) = delete;

  /// The overloads registered as lower precision / fp32, as "aten::name.overload".
  const std::vector<std::string>& lower_overloads() const { return lower_; }
  const std::vector<std::string>& fp32_overloads() const { return fp32_; }

  /// Checks both lists as the constructor does (unknown, mutable, conflicting names throw
  /// ConfigError) without registering anything; returns {lower overloads, fp32 overloads}.
  static std::pair<std::vector<std::string>, std::vector<std::string>> resolve_lists(
      const std::vector<std::string>& lower_ops, const std::vector<std::string>& fp32_ops);

  /// Reads an op-list file: one name per line; blank lines and text after '#' are ignored;
  /// commas also separate names. A missing or unreadable file is a ConfigError naming it.
  static std::vector<std::string> read_list_file(const std::string& path);
  /// The list named by environment variable `var` (a file path, as the reference's LOWER_LIST
  /// and FP32_LIST); empty when the variable is unset or empty.
  static std::vector<std::string> read_env_list(const char* var);

 private:
  std::vector<std::string> lower_, fp32_;
  std::unique_ptr<torch::Library> library_;
};

}  // namespace volt
