// detail::link_failure: the words Gloo and NCCL use for a failed link make a collective's error
// a DistributedError in GradientReducer; a model's own errors do not.
#include <gtest/gtest.h>

#include "distributed/detail/link_failure.h"

namespace {

TEST(LinkFailure, GlooAndNcclWordsForAFailedLinkInAnyCase) {
  using volt::detail::link_failure;
  for (const char* why :
       {"[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed "
        "by peer [127.0.0.1]:41234",
        "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:84] Timed "
        "out waiting 60000ms for recv operation to complete",
        "Application timeout caused pair closure",
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)",
        "NCCL error: remote process exited or there was a network error", "write: Broken pipe"}) {
    EXPECT_TRUE(link_failure(why)) << why;
  }
  for (const char* why : {"Expected to mark a variable ready only once.",
                          "shape '[4, 8]' is invalid for input of size 30",
                          "params[1] in this process with sizes [8] appears not to match"}) {
    EXPECT_FALSE(link_failure(why)) << why;
  }
}

}  // namespace
