#include "volt/core/check.h"

namespace volt {
namespace detail {

void throw_internal(const char* cond, const char* file, int line, const std::string& msg) {
  throw InternalError(str_cat("[volt internal] invariant '", cond, "' failed at ", file, ":", line,
                              msg.empty() ? "" : ": ", msg,
                              "; this is a volt bug, please report it with this message."));
}

}  // namespace detail
}  // namespace volt
