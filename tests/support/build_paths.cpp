// Paths CMake gives this one TU (tests/CMakeLists.txt); see build_paths.h.
#include "build_paths.h"

namespace volt_test {

std::string source_dir() {
  return VOLT_SOURCE_DIR;
}
std::string cli_binary() {
  return VOLT_CLI_BINARY;
}
std::string ddp_worker() {
  return VOLT_DDP_WORKER;
}
std::string fabric_worker() {
  return VOLT_FABRIC_WORKER;
}
std::string dist_worker() {
  return VOLT_DIST_WORKER;
}
std::string tp_worker() {
  return VOLT_TP_WORKER;
}
std::string pipeline_worker() {
  return VOLT_PIPELINE_WORKER;
}
std::string resume_worker() {
  return VOLT_RESUME_WORKER;
}

}  // namespace volt_test
