#pragma once
// Private: whether an error c10d raised is the link failing (a peer gone, a timeout) rather than
// the model, in Gloo's and NCCL's words, any case ("Application timeout caused pair closure" is
// what Gloo tells the other operations on a pair that timed out; NCCL's watchdog says
// "timeout", a dead peer "remote process exited"). GradientReducer turns such an error into a
// DistributedError (the group marked broken, the job restartable), anything else into the
// model's ValueError.

#include <string>

#include "core/detail/ascii.h"

namespace volt::detail {

inline bool link_failure(const std::string& message) {
  const std::string why = ascii_lower(message);
  for (const char* word : {"connection", "timed out", "timeout", "broken pipe", "pair closure",
                           "remote process exited"}) {
    if (why.find(word) != std::string::npos) return true;
  }
  return false;
}

}  // namespace volt::detail
