#pragma once
// When a callback may write a checkpoint in on_exception, and what rank 0 says about it:
// OnExceptionCheckpoint's rule, shared with ModelCheckpoint's save_on_exception.

#include <exception>
#include <string>

namespace volt {
class RunContext;
namespace detail {

/// Whether a checkpoint may be written in on_exception: during fit only (validate/test/predict
/// change nothing worth saving), and with several processes only for volt::Interrupted, which
/// ends every rank at the same batch boundary (after another error the ranks are at different
/// points and the collective save would wait for them); rank 0 warns why not then. `component`
/// names the callback in the warning.
bool may_checkpoint_after(RunContext& run, const std::exception& error,
                          const std::string& component);

/// Rank 0's line about the checkpoint an on_exception saved at `path` (and at `last`, a last
/// checkpoint holding the same state, unless ""): how to resume after an interruption; after
/// another error, that the state is as the failure left it.
void report_exception_checkpoint(RunContext& run, const std::exception& error,
                                 const std::string& path, const std::string& last,
                                 const std::string& component);

}  // namespace detail
}  // namespace volt
