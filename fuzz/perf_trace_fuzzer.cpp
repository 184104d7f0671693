// libFuzzer target: `volt perf --trace FILE` on any bytes: scan_trace (bounded JSON, then the
// events of a Chrome trace, whatever their fields hold) and format_scan (the printed report).
// Bad input must end in a ConfigError; anything else (another exception such as nlohmann's
// type_error, a crash, a sanitizer report) is a finding.
//
// Input: the trace file's text.

#include <cstdint>
#include <string>

#include "cli/detail/perf_scan.h"
#include "fuzz_common.h"
#include "volt/core/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto scan = volt::detail::scan_trace(text, "fuzz.json");
    volt_fuzz::trace(volt::detail::format_scan(scan, "fuzz.json"));
  } catch (const volt::ConfigError& e) {
    volt_fuzz::trace(std::string("refused: ") + e.what());
  } catch (const std::exception& e) {
    volt_fuzz::finding(std::string("the trace scan let a non-ConfigError escape: ") + e.what());
  }
  return 0;
}
