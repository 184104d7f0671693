#pragma once
// Private: ASCII character classes and case folding for the names, levels, keywords and numbers
// volt reads (environment levels, dtype and metric names, trace categories, registry
// suggestions, identifiers, config text). Unlike <cctype> they are defined for every char (a
// negative char is undefined behaviour there) and ignore the process's locale: under a Turkish
// locale std::toupper('i') is not 'I' (so "info" would not read as INFO), and under an 8-bit one
// std::isalnum accepts bytes such as 0xE7, which would pass into identifiers, kernel names and
// file names as stray non-ASCII bytes.

#include <string>
#include <string_view>

namespace volt::detail {

constexpr bool ascii_digit(char c) {
  return c >= '0' && c <= '9';
}
constexpr bool ascii_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
constexpr bool ascii_alnum(char c) {
  return ascii_alpha(c) || ascii_digit(c);
}
/// ' ', \t, \n, \v, \f, \r: what std::isspace accepts in the "C" locale.
constexpr bool ascii_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}

constexpr char ascii_lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}
constexpr char ascii_upper(char c) {
  return c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c;
}
inline std::string ascii_lower(std::string s) {
  for (char& c : s) c = ascii_lower(c);
  return s;
}
inline std::string ascii_upper(std::string s) {
  for (char& c : s) c = ascii_upper(c);
  return s;
}

/// `s` without the ascii_space characters at either end (a view into `s`).
constexpr std::string_view ascii_trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && ascii_space(s[b])) ++b;
  while (e > b && ascii_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

}  // namespace volt::detail
