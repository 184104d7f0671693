#pragma once
// Private: numbers as text in the "C" locale, whichever locale the program chose. volt runs
// inside programs that may call setlocale(LC_ALL, "") (Qt's QCoreApplication does on Unix), and
// then printf and strtod follow LC_NUMERIC: under de_DE "%g" of 0.5 writes "0,5" and
// strtod("0.5") stops at the '.'. The numbers volt writes or reads as text go through here:
// generated kernel source (where "(float)0,5" is the comma operator: 5), the run report's JSON
// and SVG, config values, metrics files, checkpoint keys and the tables it prints.
//
// iostreams follow a second switch: the C++ global locale, which a program sets with
// std::locale::global(std::locale("")). Every stream constructed afterwards takes it, and under
// de_DE writes 1000 as "1.000", 0.5 as "0,5" and a pointer as "0x7ff.d9f.dc5", and reads "0.5"
// as a failure. volt makes its streams with c_stream below (ctest banned_calls keeps other
// streams out of src/), so they write and read the "C" locale's text whatever the program chose.

#include <locale.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <locale>
#include <sstream>
#include <string>
#include <utility>

namespace volt::detail {

/// While it lives, the calling thread formats and parses numbers in the "C" locale (POSIX
/// uselocale: the thread's own locale; the process's and other threads' stay as they are).
class CNumbers {
 public:
  CNumbers() : previous_(::uselocale(c_locale())) {}
  ~CNumbers() { ::uselocale(previous_); }
  CNumbers(const CNumbers&) = delete;
  CNumbers& operator=(const CNumbers&) = delete;

 private:
  static locale_t c_locale() {
    static const locale_t c = ::newlocale(LC_ALL_MASK, "C", locale_t{});
    return c;  // null if that failed: uselocale(null) then changes nothing
  }
  locale_t previous_;
};

/// snprintf's text of numbers in the "C" locale: c_format("%.9g", 0.5) is "0.5" everywhere.
template <typename... Args>
std::string c_format(const char* format, Args... args) {
  const CNumbers c;
  char buf[256];
  const int n = std::snprintf(buf, sizeof buf, format, args...);
  if (n < 0) return "";
  if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(&out[0], out.size(), format, args...);
  out.resize(static_cast<size_t>(n));
  return out;
}

/// std::strtod in the "C" locale (same end pointer and errno).
inline double c_strtod(const char* text, char** end) {
  const CNumbers c;
  return std::strtod(text, end);
}

/// A standard string or file stream made with `args`, imbued with the "C" locale
/// (std::locale::classic()) instead of the C++ global locale of the moment: it writes and reads
/// numbers as the "C" locale does. `auto os = c_stream<std::ostringstream>();`,
/// `auto in = c_stream<std::ifstream>(path, std::ios::binary);`. (A function, not a class
/// derived from the stream: such a class has construction vtables, which GCC and Clang emit
/// differently, and the fuzzers, linking Clang objects with GCC's libvolt.a, failed to link.)
template <typename Stream, typename... Args>
Stream c_stream(Args&&... args) {
  Stream stream(std::forward<Args>(args)...);
  stream.imbue(std::locale::classic());
  return stream;
}

}  // namespace volt::detail
