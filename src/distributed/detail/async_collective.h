#pragma once
// Collectives that run while the caller goes on (ZeRO's overlap_comm and stage-3 prefetch).
// ProcessGroup's own collectives block; these start the c10d work (Gloo runs it on its worker
// threads) and hand back a PendingCollective whose wait() finishes it with the same guarantees:
// at most the group's timeout, failures as DistributedError naming the operation, the group
// marked broken. Started collectives pair up across ranks in the order they were started, mixed
// freely with blocking ones, so every rank must start them in the same order.

#include <ATen/Tensor.h>

#include <memory>
#include <vector>

#include "volt/distributed/process_group.h"

namespace volt {
namespace detail {

class PendingCollective {
 public:
  PendingCollective();
  /// Does not wait: an abandoned collective finishes (or times out) on Gloo's threads, which
  /// keep its tensors alive.
  ~PendingCollective();
  PendingCollective(PendingCollective&&) noexcept;
  PendingCollective& operator=(PendingCollective&&) noexcept;

  /// Whether it was started and not yet waited for.
  bool pending() const;
  /// Waits for it. all_reduce: {the reduced buffer}; all_gather: every rank's value, in rank
  /// order. Throws DistributedError on a timeout or lost peer.
  std::vector<at::Tensor> wait();

  struct State;  // the c10d work and its tensors (process_group.cpp)
  static PendingCollective make(std::unique_ptr<State> state);

 private:
  explicit PendingCollective(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// Starts reducing `buffer` (contiguous) over the ranks in place; leave it untouched until
/// wait(). kSum, kMin, kMax only.
PendingCollective start_all_reduce(const std::shared_ptr<ProcessGroup>& group, at::Tensor buffer,
                                   Reduce op);
/// Starts gathering `value` from every rank. Unlike ProcessGroup::all_gather the shapes are not
/// compared first (that costs a collective): every rank must pass the same shape and dtype.
/// bf16 travels as its bits (Gloo 1.13 has no bf16), any other dtype as itself.
PendingCollective start_all_gather(const std::shared_ptr<ProcessGroup>& group,
                                   const at::Tensor& value);

}  // namespace detail
}  // namespace volt
