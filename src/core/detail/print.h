#pragma once
// Private: small formatters the Options printers (operator<<) and error messages share, so every
// Options type prints unset optionals, strings and lists the same way.

#include <c10/util/Optional.h>
#include <c10/util/Type.h>

#include <string>
#include <typeinfo>
#include <vector>

#include "core/detail/numbers.h"

namespace volt {
namespace detail {

/// The value, or "none" when unset.
template <typename T>
std::string optional_text(const c10::optional<T>& v) {
  if (!v) return "none";
  auto s = detail::c_stream<std::ostringstream>();
  s << *v;
  return s.str();
}

/// "text" in double quotes.
inline std::string quoted(const std::string& text) {
  return "\"" + text + "\"";
}

/// [a, b, c] of quoted strings.
inline std::string quoted_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + quoted(items[i]);
  return out + "]";
}

/// The items of a range joined by ", ", each written as `text(item)` gives it (errors and
/// warnings that list names).
template <typename Range, typename Text>
std::string joined(const Range& items, Text&& text) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + std::string(text(item));
  return out;
}

/// Numbers joined by ", ", each as a "C"-locale stream writes it (6 significant digits: 1e-07,
/// 0.05), the form every other number of an Options printer takes.
inline std::string number_list(const std::vector<double>& values) {
  return joined(values, [](double v) {
    auto s = detail::c_stream<std::ostringstream>();
    s << v;
    return s.str();
  });
}

/// The keys of a map with string keys, joined by ", " (errors that list what is available).
template <typename Map>
std::string joined_keys(const Map& map) {
  return joined(map, [](const auto& kv) -> const std::string& { return kv.first; });
}

/// The first line of an exception's message: libtorch appends its C++ backtrace to c10::Error's.
inline std::string first_line(const char* what) {
  const std::string text = what;
  return text.substr(0, text.find('\n'));
}

/// "<exception type>: <first line of its message>", for one-line reports of errors raised by
/// user code or libtorch (the Trainer's failure line, the CLI's "the run failed").
inline std::string exception_summary(const std::exception& e) {
  return c10::demangle(typeid(e).name()) + ": " + first_line(e.what());
}

}  // namespace detail
}  // namespace volt
