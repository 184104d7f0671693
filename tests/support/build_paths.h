#pragma once
// Where this build's programs and the source tree are. CMake defines them for build_paths.cpp
// alone: a path on a test TU's command line would make every test TU compile differently in
// each clone, and ccache could serve none of them to a fresh clone (CI).
#include <string>

namespace volt_test {

/// The source tree (configs, test data, scripts).
std::string source_dir();
/// The `volt` command-line program.
std::string cli_binary();
/// Worker programs of the multi-process tests (tests/support/*_worker.cpp).
std::string ddp_worker();
std::string fabric_worker();
std::string dist_worker();
std::string tp_worker();
std::string pipeline_worker();
std::string resume_worker();

}  // namespace volt_test
