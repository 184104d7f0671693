#pragma once
// libtorch keys optimizer state by the TensorImpl address: as its text ("0x...") up to 1.13, as
// the pointer itself in 2.x. Derive the key type instead of testing versions.

#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace volt {
namespace detail {

using OptimizerStateMap = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using OptimizerStateKey = typename OptimizerStateMap::key_type;

template <typename K = OptimizerStateKey>
K state_key_for(const at::Tensor& p) {
  if constexpr (std::is_same<K, std::string>::value) {
    // A plain std::ostringstream, not detail::c_stream: libtorch makes its keys with one under
    // the C++ global locale (c10::guts::to_string), and this text must equal theirs.
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return K(p.unsafeGetTensorImpl());
  }
}

}  // namespace detail
}  // namespace volt
