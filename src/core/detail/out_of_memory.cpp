#include "core/detail/out_of_memory.h"

#include <c10/util/Exception.h>

#include <new>
#include <string>

namespace volt {
namespace detail {

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) || dynamic_cast<const c10::OutOfMemoryError*>(&e)) {
    return true;
  }
  const std::string what = e.what();
  return what.find("can't allocate memory") != std::string::npos ||
         what.find("not enough memory") != std::string::npos ||
         what.find("CUDA out of memory") != std::string::npos ||
         what.find("CUDA error: out of memory") != std::string::npos;
}

}  // namespace detail
}  // namespace volt
