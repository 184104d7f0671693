#include "volt/core/types.h"

namespace volt {

const char* to_string(Stage s) {
  switch (s) {
    case Stage::kNone: return "none";
    case Stage::kFit: return "fit";
    case Stage::kValidate: return "validate";
    case Stage::kTest: return "test";
    case Stage::kPredict: return "predict";
    case Stage::kSanityCheck: return "sanity_check";
  }
  return "?";
}

const char* to_string(ClipAlgorithm a) {
  return a == ClipAlgorithm::kNorm ? "norm" : "value";
}

const char* to_string(RunStatus s) {
  switch (s) {
    case RunStatus::kInitializing: return "initializing";
    case RunStatus::kRunning: return "running";
    case RunStatus::kFinished: return "finished";
    case RunStatus::kInterrupted: return "interrupted";
    case RunStatus::kFailed: return "failed";
  }
  return "?";
}

}  // namespace volt
