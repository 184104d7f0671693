#pragma once
// Reading back a file a test or the program under test wrote.

#include <fstream>
#include <iterator>
#include <string>

namespace volt_test {

/// The bytes of the file at `path`; "" when it is missing or cannot be read.
inline std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace volt_test
