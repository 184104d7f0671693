#include "core/detail/machine.h"

#include <cstdint>
#include <iomanip>

#include "core/detail/numbers.h"
#include "volt/core/env.h"

namespace volt {
namespace detail {

std::string volt_cache_dir() {
  if (auto d = env_value("VOLT_CACHE_DIR")) return *d;
  if (auto x = env_value("XDG_CACHE_HOME")) return *x + "/volt";
  if (auto h = env_value("HOME")) return *h + "/.cache/volt";
  return "";
}

std::string cpu_model_name() {
  auto in = detail::c_stream<std::ifstream>("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 1);
    }
  }
  return "unknown cpu";
}

std::string stable_hash_hex(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  auto os = detail::c_stream<std::ostringstream>();
  os << std::hex << std::setw(16) << std::setfill('0') << h;
  return os.str();
}

}  // namespace detail
}  // namespace volt
