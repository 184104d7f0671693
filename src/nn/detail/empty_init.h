#pragma once
// init_module(empty_init) of the Trainer and Fabric: the precision's context and an EmptyInit.

#include <memory>

namespace volt::detail {

/// `inner` (the precision's tensor_init_context, may be null) and, when `empty_init`, an
/// EmptyInit made on this thread, as one object; released in reverse order.
std::shared_ptr<void> init_module_context(std::shared_ptr<void> inner, bool empty_init);

}  // namespace volt::detail
