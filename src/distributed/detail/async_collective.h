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
  /// Waits for it. reduce_scatter: {this rank's reduced row}; all_gather: every rank's value, in
  /// rank order. Throws DistributedError on a timeout or lost peer.
  std::vector<at::Tensor> wait();

  struct State;  // the c10d work and its tensors (process_group.cpp)
  static PendingCollective make(std::unique_ptr<State> state);

 private:
  explicit PendingCollective(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// Starts a reduce-scatter of `rows` (contiguous, size(0) == world size): one all-to-all hands
/// row j of every rank to rank j, which reduces the rows it received (reduce_rows). Each rank
/// sends and receives (N-1)/N of the buffer, half the bytes of the all-reduce Gloo would
/// otherwise need, and holds a second buffer of the rows' size until wait(). The wire only
/// copies, so bf16 and fp16 travel as 16 bits and are summed in fp32. wait(): {this rank's
/// reduced row} (fp32 for 16-bit rows). kSum, kMin, kMax only.
PendingCollective start_reduce_scatter(const std::shared_ptr<ProcessGroup>& group, at::Tensor rows,
                                       Reduce op);
/// Reduces the rows of `received` (row r from rank r) in rank order: a fixed order, so the
/// result is reproducible (and, for two ranks, bitwise an all-reduce's). bf16 / fp16 rows are
/// reduced in fp32 and the result stays fp32. kSum, kMin, kMax only.
at::Tensor reduce_rows(const at::Tensor& received, Reduce op);
/// Starts gathering `value` from every rank. Unlike ProcessGroup::all_gather the shapes are not
/// compared first (that costs a collective): every rank must pass the same shape and dtype.
/// bf16 travels as its bits (Gloo 1.13 has no bf16), any other dtype as itself.
PendingCollective start_all_gather(const std::shared_ptr<ProcessGroup>& group,
                                   const at::Tensor& value);

}  // namespace detail
}  // namespace volt
