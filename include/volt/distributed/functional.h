#pragma once
/// Collectives as tensor functions for loops of one's own (inside the Trainer:
/// Module::all_gather).

#include <ATen/core/Tensor.h>

namespace volt {

class ProcessGroup;

/// Every rank's `value` stacked in rank order: [world_size, *value.sizes()] (equal shapes and
/// dtypes on every rank, else ValueError). With sync_grads it is differentiable, as
/// torch.distributed.nn.functional.all_gather: the gradient that reaches each rank's `value` is
/// the sum, over the ranks, of the gradient of their loss with respect to its slice (a
/// contrastive loss over the global batch gets the gradients of one process computing it all).
/// Then every rank must run the backward through the result (its backward is a collective over
/// `group`, which must live until then).
at::Tensor all_gather(ProcessGroup& group, const at::Tensor& value, bool sync_grads = false);

}  // namespace volt
