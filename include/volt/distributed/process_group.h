#pragma once
/// ProcessGroup: rendezvous through c10d's TCPStore and collectives over a c10d process group
/// (Gloo on CPU, NCCL on CUDA), every wait bounded by a timeout, every failure a one-line volt
/// error.

#include <ATen/Tensor.h>
#include <c10/core/DeviceType.h>
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "volt/core/types.h"
#include "volt/distributed/cluster_environment.h"

namespace volt {

/// A c10d communication backend.
enum class Backend { kGloo, kNccl };

/// "gloo" or "nccl".
std::string to_string(Backend backend);

/// Resolves a backend name for tensors on `device`: "auto" is gloo on CPU and nccl on CUDA.
/// Throws ConfigError for an unknown name and NotAvailable for a backend this build or device
/// cannot run ("nccl" on CPU or in a build without NCCL; "gloo" without gloo headers).
Backend resolve_backend(const std::string& name, c10::DeviceType device);

/// The rendezvous store a group joined through (c10d's TCPStore, hosted by rank 0); opaque.
/// Kept by ProcessGroup::rendezvous_store() and passed to a later group (ProcessGroupOptions::
/// store), rank 0 serves the job's next attempt from the same store: processes of other nodes
/// that re-join after a failure never meet a store that is about to close.
struct RendezvousStore;

struct ProcessGroupOptions {
  /// Communication backend. Default: kGloo.
  TORCH_ARG(Backend, backend) = Backend::kGloo;
  /// Bound on the rendezvous and on every collective; past it the operation fails with
  /// DistributedError. Default: 60 s.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(60);
  /// Hash of the run's configuration; ranks whose hashes differ fail at rendezvous with a
  /// ConfigError naming them. Default: "" (compared too: every rank must pass the same).
  TORCH_ARG(std::string, config_hash) = "";
  /// Network interface Gloo binds to (e.g. "eth0"). Default: "" = GLOO_SOCKET_IFNAME if set, else
  /// loopback on one node, else the local address that routes to MASTER_ADDR.
  TORCH_ARG(std::string, interface) = "";
  /// A store an earlier group of this process joined through, reused when it serves the same
  /// MASTER_ADDR:MASTER_PORT (else ignored). Default: none (rank 0 hosts a new store).
  TORCH_ARG(std::shared_ptr<RendezvousStore>, store);
};

std::ostream& operator<<(std::ostream& os, const ProcessGroupOptions& o);

/// One process's membership in a group of world_size processes.
///
/// The constructor is the rendezvous: global rank 0 hosts a c10d::TCPStore on
/// MASTER_ADDR:MASTER_PORT (under torchrun's agent store, the agent does), every rank connects,
/// announces its rank and config hash under keys of its attempt (restart_count), and the
/// Gloo group connects all pairs (an NCCL group connects at its first collective, on this
/// process's current CUDA device; host tensors given to it are copied there and the results
/// back, so every collective returns on its input's device). Collectives wait at most
/// `timeout`; a peer that died or hung
/// turns into a DistributedError naming the operation, this rank and, when some process reported
/// it (report_lost_rank), the lost rank. After a failed collective the group is broken:
/// later calls throw at once instead of waiting again. Destruction never waits longer than the
/// timeout. Not thread-safe: call collectives from one thread, in the same order on every rank.
/// The first group sets SIGPIPE to ignored when its action is the default (as Python does at
/// start-up): otherwise a write to a dead peer's socket would kill this process instead of
/// failing the collective; a handler the program installed is kept.
class ProcessGroup {
 public:
  /// Joins the group described by `env` (rank, world size, MASTER_ADDR/PORT; the port must be
  /// chosen, not 0). Throws ConfigError (MASTER_PORT in use on rank 0, ranks' configs differ,
  /// two processes with one rank), DistributedError (MASTER_ADDR unreachable within the timeout,
  /// ranks missing) or NotAvailable (backend not in this build).
  ProcessGroup(const ClusterEnvironment& env, ProcessGroupOptions options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// True when this build has the Gloo backend (CPU collectives): libtorch with USE_C10D_GLOO
  /// and gloo's headers. The CUDA wheels lack the headers; there NCCL is the backend.
  static bool gloo_available();
  /// Why this build cannot create groups of `backend` ("" when it can): Gloo needs a libtorch
  /// with USE_C10D_GLOO and gloo's headers; NCCL a CUDA libtorch >= 2.0 with USE_C10D_NCCL and
  /// nccl.h. Says nothing of the machine (an NCCL group also needs a CUDA device).
  static std::string backend_unavailable_reason(Backend backend);

  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }
  const ProcessGroupOptions& options() const { return options_; }
  /// The store this group joined through; the pointer keeps it serving after the group is gone.
  std::shared_ptr<RendezvousStore> rendezvous_store() const;

  /// The element-wise reduction of `value` over all ranks (a new tensor; `value` is unchanged).
  /// kMean needs a floating dtype. bf16 and fp16 are reduced in fp32 and rounded back (Gloo in
  /// libtorch 1.13 has no bf16; broadcast_ and all_gather send it as its bits).
  at::Tensor all_reduce(const at::Tensor& value, Reduce op = Reduce::kSum);
  /// Overwrites `tensor` on every rank with rank `src`'s values.
  void broadcast_(at::Tensor& tensor, int64_t src = 0);
  /// Broadcasts many tensors in one collective per dtype (model parameters and buffers).
  void broadcast_(std::vector<at::Tensor>& tensors, int64_t src = 0);
  /// Overwrites each of `tensors` with its reduction over all ranks, with one all_reduce per
  /// dtype bucket (as broadcast_; gradients); every rank passes the same shapes and dtypes.
  void all_reduce_(std::vector<at::Tensor>& tensors, Reduce op = Reduce::kSum);
  /// Every rank's `value`, in rank order. All ranks must pass the same shape and dtype (checked:
  /// ValueError naming the ranks otherwise).
  std::vector<at::Tensor> all_gather(const at::Tensor& value);
  /// all_gather concatenated along dim 0 (c10d's _allgather_base, which Gloo lacks in 1.13).
  at::Tensor all_gather_flat(const at::Tensor& value);
  /// This rank's chunk (size(0) / world_size rows) of the reduction of `value` over ranks.
  /// Gloo has no reduce-scatter of its own (1.13) or an all-reduce in its place (2.x): volt sends
  /// each rank its chunks with one all-to-all and reduces them in rank order, moving half the
  /// bytes of an all-reduce.
  at::Tensor reduce_scatter(const at::Tensor& value, Reduce op = Reduce::kSum);
  /// Point to point: hands `tensor` to rank `dst`, which must call recv_ with a tensor of the
  /// same shape and dtype (send a small header first when the receiver cannot know them).
  /// Pairs match in call order. Returns when the transfer is done; a receiver that does not come
  /// within the timeout, or is gone, is a DistributedError (as for collectives).
  void send(const at::Tensor& tensor, int64_t dst);
  /// Fills `tensor` (shape and dtype as the sender's) with what rank `src` sent.
  void recv_(at::Tensor& tensor, int64_t src);
  /// A transfer isend or irecv_ started, running while the program goes on. wait() returns when
  /// it is done: within the group's timeout, else a DistributedError, as for send / recv_ (and
  /// the group is broken). Destroyed before wait() (an exception on its way out, say), it is
  /// cancelled (a receive's tensor then holds whatever arrived). The group must outlive it.
  class Transfer {
   public:
    Transfer();
    Transfer(Transfer&& other) noexcept;
    Transfer& operator=(Transfer&& other) noexcept;
    ~Transfer();
    /// Returns when the transfer is done (at once for a finished or empty one).
    void wait();
    /// True until wait() has returned.
    bool pending() const;

   private:
    friend class ProcessGroup;
    struct State;
    std::unique_ptr<State> state_;
  };
  /// send, without waiting: `tensor` must not change until the transfer is done. Schedules in
  /// which two ranks send to each other at once (a pipeline's activations one way, gradients the
  /// other) need it: with Gloo a send waits for its receiver, so two blocking sends would wait
  /// for each other. Pairs match recv_ / irecv_ in call order.
  Transfer isend(const at::Tensor& tensor, int64_t dst);
  /// recv_, without waiting: `tensor` holds what rank `src` sent once wait() has returned.
  Transfer irecv_(at::Tensor& tensor, int64_t src);
  /// Returns when every rank has called it.
  void barrier();
  /// True when `local` is true on every rank.
  bool all_of(bool local);
  /// True when `local` is true on some rank.
  bool any_of(bool local);
  /// Runs `work` on the ranks in `leaders` (when this rank is one) while every rank waits until
  /// each leader has finished it, however long that takes as long as the leaders live: each
  /// leader's heartbeat goes to the store every 0.5 s from a thread with a connection of its
  /// own, and a leader silent for the timeout (dead, or its host unreachable) fails the others
  /// with a DistributedError naming it. An exception from `work` propagates on its leader
  /// (after the others have read it); on the other ranks it becomes an Error naming the leader,
  /// `name` and its message. Lightning's prepare_data barrier, without a timeout on the work
  /// (a download) but never hanging on a dead rank. Every rank calls it, in the same order and
  /// with the same `leaders` (ascending ranks of this group).
  void run_on_leaders(const std::string& name, const std::vector<int64_t>& leaders,
                      const std::function<void()>& work);

  /// A group of some of these ranks (`ranks`: ascending, this rank among them) for collectives
  /// among them only, e.g. one tensor-parallel group. Only its members call it, each with the
  /// same `ranks` and `tag` (which tells apart groups made of the same ranks); it connects
  /// through this group's store within the timeout. Its rank() is this rank's index in `ranks`.
  /// Groups made from different groups never meet, even with the same tag and ranks (each
  /// replica's subgroups, say).
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int64_t>& ranks,
                                          const std::string& tag);

  /// The backend object (c10d), for volt's GradientReducer.
  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  ProcessGroup(std::unique_ptr<Impl> impl, int64_t rank, int64_t world_size,
               ProcessGroupOptions options);
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
  ProcessGroupOptions options_;
  std::unique_ptr<Impl> impl_;
};

/// Records, once per attempt of the job, which rank was lost (e.g. "rank 1 (pid 42) was killed by
/// SIGKILL") in the rendezvous store of `env`, through a connection of its own (safe from a monitor
/// thread); collectives that fail afterwards on any rank quote it. Gives up silently after
/// `timeout` (at most 5 s: the store either runs, and answers at once, or it does not).
void report_lost_rank(const ClusterEnvironment& env, const std::string& description,
                      std::chrono::milliseconds timeout) noexcept;

}  // namespace volt
