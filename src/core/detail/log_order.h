#pragma once
// Static destruction order for objects that log from their destructors. No torch includes.

namespace volt {
namespace detail {

/// Constructs the log's static state (its mutex, sink and warn_once keys) now. A static object
/// constructed after this call is destroyed before that state at exit, so its destructor may
/// still log: call it first in the function that constructs such an object.
void keep_log_alive();

}  // namespace detail
}  // namespace volt
