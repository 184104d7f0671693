#pragma once
// The independent Python readers in tools/ (python3-torch, no volt code), run by the tests that
// show Python reads what volt writes.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "build_paths.h"

namespace volt_test {

/// Whether Debian's python3-torch is installed (the tests skip their Python part otherwise).
inline bool has_python_torch() {
  return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

struct ToolRun {
  int status = -1;  ///< pclose's status: 0 when the script exited 0
  std::string out;  ///< its stdout and stderr
};

/// Runs `/usr/bin/python3 tools/<script> <args...>` (each argument single-quoted); its stderr
/// goes to the test's unless `merge_stderr`, which appends it to `out` (for the tests that look
/// for a script's error message).
inline ToolRun run_python_tool(const std::string& script, const std::vector<std::string>& args,
                               bool merge_stderr = false) {
  std::string cmd = "/usr/bin/python3 " + source_dir() + "/tools/" + script;
  for (const auto& a : args) cmd += " '" + a + "'";
  if (merge_stderr) cmd += " 2>&1";
  ToolRun r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) r.out.append(buf, n);
  r.status = pclose(pipe);
  return r;
}

}  // namespace volt_test
